//! nightshift-proto: the versioned `nightshift.v1` gRPC schema between coordinator and expert
//! nodes, compiled at build time with protox (no system protoc). Holds no logic: the coordinator
//! and the expert node convert these prost types into their own at the edge. [`tls`] reads the
//! PEM material both ends use for TLS on the link; [`shm`] is the shared-memory link that carries
//! the same compute requests between a coordinator and a node on one machine.

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
