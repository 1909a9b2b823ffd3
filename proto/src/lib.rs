//! nightshift-proto: the versioned `nightshift.v1` gRPC schema between coordinator and expert
//! nodes, compiled at build time with protox (no system protoc). Holds no logic: the coordinator
//! and the expert node convert these prost types into their own at the edge. [`tls`] reads the
//! PEM material both ends use for TLS on the link; [`shm`] is the shared-memory link that carries
//! the same compute requests between a coordinator and a node on one machine, [`link`] the framed
//! data link that carries them between machines on one blocking thread at each end.

pub mod link;
pub mod shm;
pub mod tls;

/// Generated messages, client and server of `nightshift.v1`.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("nightshift.v1");
}

/// Wire protocol version; bumped on any incompatible change of `nightshift.v1`.
pub const PROTOCOL_VERSION: u32 = 1;
/// Metadata key carrying [`PROTOCOL_VERSION`] when a `Compute` stream is opened.
pub const PROTOCOL_HEADER: &str = "x-nightshift-protocol";
/// Metadata key carrying the model fingerprint (16 hex digits) when a `Compute` stream is opened.
pub const FINGERPRINT_HEADER: &str = "x-nightshift-fingerprint";
/// Metadata key carrying the optional shared auth token (`Bearer <token>` in `authorization`).
pub const AUTH_HEADER: &str = "authorization";

/// HTTP/2 settings both ends of a compute stream use (the node's server, the coordinator's
/// channel). Flow-control windows: a batch's outputs are hundreds of KB per layer call, and
/// h2's default 64 KiB windows would put window-update round trips on every call's critical
/// path.
pub mod h2 {
    /// Initial window of one stream, in bytes.
    pub const STREAM_WINDOW: u32 = 16 << 20;
    /// Initial window of a connection, in bytes.
    pub const CONN_WINDOW: u32 = 32 << 20;
    /// Largest DATA frame either end accepts (`SETTINGS_MAX_FRAME_SIZE`), in bytes: a layer
    /// call's request and answer travel as one frame up to this size instead of one per 16 KiB
    /// (h2's default), so the receiver handles one frame, not 16, for a 256 KiB answer.
    pub const MAX_FRAME: u32 = 1 << 20;
}

/// This machine's CLOCK_MONOTONIC in nanoseconds: the clock of the timing fields of
/// `ComputeResponse`, the same in every process (and network namespace) of one machine, so the
/// coordinator can split a round trip on one machine into its legs; 0 if the clock cannot be read.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid, exclusively borrowed pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The wire form of expert outputs: little-endian f32 (a plain copy on little-endian machines).
pub fn f32s_to_le_bytes(v: &[f32]) -> Vec<u8> {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: any f32 is 4 initialised bytes; on a little-endian machine those are the
        // little-endian encoding.
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
            .to_vec()
    }
    #[cfg(not(target_endian = "little"))]
    {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
}

/// Decodes little-endian f32 `src` into `dst` (`src.len()` must be `4 * dst.len()`).
pub fn le_bytes_to_f32s(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), 4 * dst.len(), "expected 4 bytes per float");
    #[cfg(target_endian = "little")]
    {
        // SAFETY: lengths checked above; every bit pattern is a valid f32; the buffers are
        // distinct (one is borrowed shared, the other mutably).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr() as *mut u8, src.len())
        }
    }
    #[cfg(not(target_endian = "little"))]
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

#[cfg(test)]
mod wire_tests {
    #[test]
    fn outputs_encode_little_endian_and_round_trip() {
        let v = [1.0f32, -2.5, f32::MIN_POSITIVE, f32::NAN, 0.0, -0.0, 3.25e7];
        let b = super::f32s_to_le_bytes(&v);
        assert_eq!(&b[..8], &[0, 0, 0x80, 0x3f, 0, 0, 0x20, 0xc0]);
        let mut back = [0f32; 7];
        super::le_bytes_to_f32s(&b, &mut back);
        for (x, y) in v.iter().zip(&back) {
            assert_eq!(x.to_bits(), y.to_bits());
        }
    }
}
