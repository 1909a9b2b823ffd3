//! The framed data link between a coordinator and an expert node across a network: one TCP
//! connection (TLS when the node serves TLS) per link, read and written by ONE blocking thread
//! at each end — the coordinator's engine thread writes a layer call's request and later reads
//! its answer, the node's link thread reads, computes and answers. A layer call over the gRPC
//! stream crosses six threads (engine -> client connection task -> node connection task ->
//! compute worker -> node connection task -> client connection task -> engine), each a wake-up
//! of a parked thread when the cores are busy; over a link it wakes two, as the shared-memory
//! link does on one machine (`shm`). The gRPC service stays the control plane: the node
//! advertises its link's port in `Info` (`link_port`), and a call the links cannot take (all
//! busy) goes over the stream.
//!
//! Every frame is `length u32 LE | kind u8 | payload[length]`. A link opens with the
//! coordinator's [`Hello`] (protocol, model fingerprint, auth token), answered by `WELCOME`
//! (empty) or `REFUSED` (`code u32 LE` as gRPC's, then a UTF-8 reason) after which the node
//! closes the connection. Then `REQUEST` frames carry a prost-encoded `ComputeRequest` and
//! `RESPONSE` frames its `ComputeResponse` (the node's timestamps included), one request at a
//! time per link. A request that allows it (`parts`) may first get `PART` frames: the rows of
//! expert groups the node has finished, sent while it computes the rest, so a large answer's
//! transfer overlaps the node's compute instead of following it. Frames longer than
//! [`MAX_FRAME`], unknown kinds and short hellos are refused; nothing a peer sends is trusted
//! before it is checked.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The coordinator's first frame.
pub const HELLO: u8 = 1;
/// The node accepted the hello.
pub const WELCOME: u8 = 2;
/// The node refused the hello (code, reason) and closes the link.
pub const REFUSED: u8 = 3;
/// A prost-encoded `ComputeRequest`.
pub const REQUEST: u8 = 4;
/// A prost-encoded `ComputeResponse`.
pub const RESPONSE: u8 = 5;
/// The rows of expert groups a node has finished, sent ahead of its `RESPONSE` when the
/// request allowed it (`ComputeRequest.parts`): [`encode_part`] / [`decode_part`].
pub const PART: u8 = 6;
/// Fewest bytes of rows a `PART` carries: a node answers below twice this in one response (a
/// part costs a frame, a TLS record and a write).
pub const PART_MIN_BYTES: usize = 64 << 10;
/// Most chunks a node cuts an answer into (every chunk but the last a `PART`).
pub const MAX_PART_CHUNKS: usize = 8;
/// Largest payload either end accepts (the gRPC service's message limit).
pub const MAX_FRAME: usize = 512 << 20;
/// Largest frame before a link is open (hello, welcome, refusal): [`Framed::new`] starts
/// here, [`Framed::opened`] lifts it to [`MAX_FRAME`].
pub const HELLO_MAX: usize = 64 << 10;
/// Most a frame's buffer grows by ahead of the bytes that arrived.
const GROW: usize = 8 << 20;
/// Bytes before a frame's payload.
const HEADER: usize = 5;
/// How long one blocking read lasts before the reader re-checks its deadline and its peer.
const SLICE: Duration = Duration::from_millis(20);
/// Bytes of a hello before its token.
const HELLO_FIXED: usize = 12;

/// Errors of a link.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the peer closed the link")]
    Closed,
    #[error("deadline of {0} ms passed")]
    Deadline(u128),
    #[error("no frame before the deadline")]
    TimedOut,
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("refused: {0}")]
    Refused(String),
}

/// The link's byte stream: plain TCP, or TLS over it as either end.
pub enum Stream {
    Plain(TcpStream),
    Client(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
    Server(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
}

impl Stream {
    fn socket(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Client(s) => &s.sock,
            Stream::Server(s) => &s.sock,
        }
    }

    /// TLS as a client over `sock` (handshake done within `timeout`).
    pub fn connect_tls(
        config: Arc<rustls::ClientConfig>,
        name: &str,
        sock: TcpStream,
        timeout: Duration,
    ) -> Result<Stream, LinkError> {
        let server = ServerName::try_from(name.to_string())
            .map_err(|e| LinkError::Tls(format!("server name {name:?}: {e}")))?;
        let conn = rustls::ClientConnection::new(config, server)
            .map_err(|e| LinkError::Tls(e.to_string()))?;
        let mut s = rustls::StreamOwned::new(conn, sock);
        handshake(&mut s.conn, &mut s.sock, timeout)?;
        Ok(Stream::Client(Box::new(s)))
    }

    /// TLS as a server over `sock` (handshake done within `timeout`).
    pub fn accept_tls(
        config: Arc<rustls::ServerConfig>,
        sock: TcpStream,
        timeout: Duration,
    ) -> Result<Stream, LinkError> {
        let conn =
            rustls::ServerConnection::new(config).map_err(|e| LinkError::Tls(e.to_string()))?;
        let mut s = rustls::StreamOwned::new(conn, sock);
        handshake(&mut s.conn, &mut s.sock, timeout)?;
        Ok(Stream::Server(Box::new(s)))
    }
}

/// Runs a TLS handshake to its end within `timeout`.
fn handshake<D>(
    conn: &mut rustls::ConnectionCommon<D>,
    sock: &mut TcpStream,
    timeout: Duration,
) -> Result<(), LinkError> {
    let deadline = Instant::now() + timeout;
    sock.set_write_timeout(Some(timeout))?;
    while conn.is_handshaking() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(LinkError::Deadline(timeout.as_millis()));
        }
        sock.set_read_timeout(Some(left))?;
        match conn.complete_io(sock) {
            Ok((0, 0)) if conn.is_handshaking() => return Err(LinkError::Closed),
            Ok(_) => {}
            Err(e) if timed_out(&e) => {}
            Err(e) if e.kind() == ErrorKind::InvalidData => {
                return Err(LinkError::Tls(e.to_string()))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Client(s) => s.read(buf),
            Stream::Server(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Client(s) => s.write(buf),
            Stream::Server(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Client(s) => s.flush(),
            Stream::Server(s) => s.flush(),
        }
    }
}

/// A link's stream with its frame reader: a frame read in parts (a read slice ended mid-frame)
/// is kept until the rest arrives.
pub struct Framed {
    io: Stream,
    buf: Vec<u8>,
    /// Bytes of `buf` read from the stream.
    filled: usize,
    /// Bytes at the front of `buf` that belong to the frame last returned.
    consumed: usize,
    /// Scratch for outgoing frames.
    out: Vec<u8>,
    /// Longest payload `recv` accepts now.
    max_frame: usize,
}

impl Framed {
    pub fn new(io: Stream) -> Framed {
        Framed {
            io,
            buf: Vec::new(),
            filled: 0,
            consumed: 0,
            out: Vec::new(),
            max_frame: HELLO_MAX,
        }
    }

    /// The hello was answered with a welcome: frames up to [`MAX_FRAME`] are read from now on
    /// (before, [`HELLO_MAX`]).
    pub fn opened(&mut self) {
        self.max_frame = MAX_FRAME;
    }

    /// Sends one frame whose payload `fill` writes into the vector it is given (cleared),
    /// giving up after `timeout` if the peer does not take it.
    pub fn send(
        &mut self,
        kind: u8,
        timeout: Duration,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), LinkError> {
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        out.extend_from_slice(&[0; HEADER]);
        fill(&mut out);
        let len = out.len() - HEADER;
        if len > MAX_FRAME {
            self.out = out;
            return Err(LinkError::Malformed(format!(
                "a frame of {len} bytes exceeds the link's {MAX_FRAME}"
            )));
        }
        out[..4].copy_from_slice(&(len as u32).to_le_bytes());
        out[4] = kind;
        let sent = self
            .io
            .socket()
            .set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
            .and_then(|()| self.io.write_all(&out))
            .and_then(|()| self.io.flush());
        // keep a large buffer only while frames are large
        if out.capacity() <= 4 << 20 {
            self.out = out;
        }
        sent.map_err(|e| {
            if timed_out(&e) {
                LinkError::Deadline(timeout.as_millis())
            } else {
                e.into()
            }
        })
    }

    /// Reads the next frame: its kind and payload (valid until the next call). Waits until
    /// `deadline`, and stops early with `Closed` when `keep_waiting` says the wait is over (the
    /// node is shutting down, the coordinator has dropped the link).
    pub fn recv(
        &mut self,
        deadline: Instant,
        keep_waiting: &mut dyn FnMut() -> bool,
    ) -> Result<(u8, &[u8]), LinkError> {
        if self.consumed > 0 {
            self.buf.copy_within(self.consumed..self.filled, 0);
            self.filled -= self.consumed;
            self.consumed = 0;
        }
        loop {
            let need = if self.filled >= HEADER {
                let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]])
                    as usize;
                if len > self.max_frame {
                    let what = if self.max_frame < MAX_FRAME {
                        "before the hello is answered"
                    } else {
                        "on this link"
                    };
                    return Err(LinkError::Malformed(format!(
                        "a frame of {len} bytes exceeds the {} allowed {what}",
                        self.max_frame
                    )));
                }
                if self.filled >= HEADER + len {
                    self.consumed = HEADER + len;
                    return Ok((self.buf[4], &self.buf[HEADER..HEADER + len]));
                }
                HEADER + len
            } else {
                HEADER
            };
            // Past the deadline, what has already arrived is still taken (without waiting): a
            // caller collecting several links one after the other must not miss an answer
            // that came while it waited on another.
            let left = deadline.saturating_duration_since(Instant::now());
            let last = left.is_zero();
            if !keep_waiting() {
                return Err(LinkError::Closed);
            }
            // room for the frame (or a header and a typical answer), growing with what arrives
            let want = need.min(self.filled + GROW).max(HEADER + (64 << 10));
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
            let sock = self.io.socket();
            if last {
                sock.set_nonblocking(true)?;
            } else {
                sock.set_read_timeout(Some(left.min(SLICE)))?;
            }
            let read = self.io.read(&mut self.buf[self.filled..]);
            if last {
                self.io.socket().set_nonblocking(false)?;
            }
            match read {
                Ok(0) => return Err(LinkError::Closed),
                Ok(n) => self.filled += n,
                Err(e) if timed_out(&e) && last => return Err(LinkError::TimedOut),
                Err(e) if timed_out(&e) || e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::InvalidData => {
                    return Err(LinkError::Tls(e.to_string()))
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Shuts the connection down both ways (the peer's reads end).
    pub fn shutdown(&self) {
        let _ = self.io.socket().shutdown(std::net::Shutdown::Both);
    }
}

/// The coordinator's hello.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub protocol: u32,
    pub fingerprint: u64,
    /// The node's shared auth token (empty: none).
    pub token: Vec<u8>,
}

impl Hello {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.protocol.to_le_bytes());
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        out.extend_from_slice(&self.token);
    }

    pub fn decode(b: &[u8]) -> Result<Hello, LinkError> {
        if b.len() < HELLO_FIXED {
            return Err(LinkError::Malformed(format!(
                "a hello of {} bytes, expected at least {HELLO_FIXED}",
                b.len()
            )));
        }
        Ok(Hello {
            protocol: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            fingerprint: u64::from_le_bytes(b[4..12].try_into().expect("8 bytes")),
            token: b[HELLO_FIXED..].to_vec(),
        })
    }

    /// Whether the hello's token is `want`, compared in constant time.
    pub fn token_is(&self, want: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        self.token.len() == want.len() && bool::from(self.token.ct_eq(want))
    }
}

/// A `REFUSED` frame's payload.
pub fn encode_refusal(code: u32, reason: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(&code.to_le_bytes());
    out.extend_from_slice(reason.as_bytes());
}

/// The code and reason of a `REFUSED` frame.
pub fn decode_refusal(b: &[u8]) -> (u32, String) {
    if b.len() < 4 {
        return (0, String::from_utf8_lossy(b).into_owned());
    }
    (
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        String::from_utf8_lossy(&b[4..]).into_owned(),
    )
}

/// Bytes of a `PART` payload before its pair indices.
const PART_FIXED: usize = 12;

/// A `PART` frame's payload: `request_id u64 LE | count u32 LE | count pair indices u32 LE
/// (into the request's pairs) | count rows of little-endian f32 (one row per index, in order)`.
pub fn encode_part(request_id: u64, idx: &[u32], rows: &[f32], out: &mut Vec<u8>) {
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(&(idx.len() as u32).to_le_bytes());
    for i in idx {
        out.extend_from_slice(&i.to_le_bytes());
    }
    out.extend_from_slice(&crate::f32s_to_le_bytes(rows));
}

/// A decoded `PART` payload.
#[derive(Debug, PartialEq)]
pub struct Part<'a> {
    pub request_id: u64,
    /// Indices into the request's pairs.
    pub idx: Vec<u32>,
    /// `idx.len()` rows of `n_embd` little-endian f32 values.
    pub rows: &'a [u8],
}

/// Decodes a `PART` payload whose rows hold `n_embd` values; checks only its own shape (the
/// caller checks the indices against its request).
pub fn decode_part(b: &[u8], n_embd: usize) -> Result<Part<'_>, String> {
    if b.len() < PART_FIXED {
        return Err(format!(
            "a part of {} bytes, expected at least {PART_FIXED}",
            b.len()
        ));
    }
    let request_id = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    let count = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")) as usize;
    let want = count
        .checked_mul(4 + 4 * n_embd)
        .and_then(|n| n.checked_add(PART_FIXED))
        .ok_or_else(|| format!("a part of {count} rows overflows"))?;
    if b.len() != want {
        return Err(format!(
            "a part of {count} rows of {n_embd} values should be {want} bytes, found {}",
            b.len()
        ));
    }
    let (idx, rows) = b[PART_FIXED..].split_at(4 * count);
    let idx = idx
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    Ok(Part {
        request_id,
        idx,
        rows,
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, LinkError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| LinkError::Tls(format!("{what}: {e}")))?;
    if certs.is_empty() {
        return Err(LinkError::Tls(format!("{what}: no certificate")));
    }
    Ok(certs)
}

fn roots(pem: &[u8], what: &str) -> Result<rustls::RootCertStore, LinkError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(pem, what)? {
        roots
            .add(c)
            .map_err(|e| LinkError::Tls(format!("{what}: {e}")))?;
    }
    Ok(roots)
}

fn key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, LinkError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| LinkError::Tls(format!("key: {e}")))
}

/// The node's TLS for its link, from the PEM files it serves gRPC with: its certificate chain
/// and key, and when given the CA its clients' certificates must chain to (mutual TLS).
pub fn server_tls(
    cert: &[u8],
    key_pem: &[u8],
    client_ca: Option<&[u8]>,
) -> Result<Arc<rustls::ServerConfig>, LinkError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| LinkError::Tls(e.to_string()))?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(ca, "client CA")?),
                provider(),
            )
            .build()
            .map_err(|e| LinkError::Tls(format!("client CA: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let cfg = builder
        .with_single_cert(certs(cert, "certificate")?, key(key_pem)?)
        .map_err(|e| LinkError::Tls(e.to_string()))?;
    Ok(Arc::new(cfg))
}

/// The coordinator's TLS for links: the CA nodes' certificates chain to, and its own
/// certificate and key when nodes ask for one (mutual TLS).
pub fn client_tls(
    ca: &[u8],
    identity: Option<(&[u8], &[u8])>,
) -> Result<Arc<rustls::ClientConfig>, LinkError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| LinkError::Tls(e.to_string()))?
        .with_root_certificates(roots(ca, "CA bundle")?);
    let cfg = match identity {
        Some((cert, key_pem)) => builder
            .with_client_auth_cert(certs(cert, "client certificate")?, key(key_pem)?)
            .map_err(|e| LinkError::Tls(e.to_string()))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests;
