//! How the remote backend words link failures: an error with its whole source chain (tonic puts
//! the cause of a transport or TLS failure there), and the hint of what to check when a node drops
//! a connection right after it opened.

use super::RemoteOptions;

/// `e` and its sources joined with ": " (tonic's transport errors put the cause, such as a
/// certificate the node presented that the CA does not sign, in the source chain).
pub(super) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    with_sources(e.to_string(), e.source())
}

/// `head` followed by each error of the chain starting at `cur` that it does not already say.
fn with_sources(mut out: String, mut cur: Option<&(dyn std::error::Error + 'static)>) -> String {
    while let Some(c) = cur {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = c.source();
    }
    out
}

/// What to check when a node drops the connection right after it opened: a TLS node does that to
/// a plaintext client, and a mutual-TLS node to a client without an acceptable certificate (the
/// node's log names the reason; the client only sees the connection close).
pub(super) fn link_hint(opts: &RemoteOptions, st: &tonic::Status) -> &'static str {
    // Only transport failures (a status carrying an I/O cause), not statuses the node sent.
    if std::error::Error::source(st).is_none() {
        return "";
    }
    match &opts.tls {
        None => " (if the node serves TLS, dial it with --tls-ca)",
        Some(t) if !t.has_identity() => {
            " (if the node requires mutual TLS, pass --tls-client-cert and --tls-client-key)"
        }
        Some(_) => " (if the node requires mutual TLS, check that its --tls-client-ca signed --tls-client-cert)",
    }
}

/// A status's message followed by its transport causes (TLS failures surface there).
pub(super) fn status_chain(st: &tonic::Status) -> String {
    with_sources(st.message().to_string(), std::error::Error::source(st))
}
