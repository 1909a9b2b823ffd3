//! The coordinator's side of the framed data links (`nightshift_proto::link`) to a node across
//! the network: opened beside the compute stream when the node reports a link port (and is not
//! reached through shared memory), [`RemoteOptions::net_links`](super::RemoteOptions) of them so
//! both micro-batches' calls can be out at once, and dropped with the stream. A layer call's
//! share is written on the caller's thread ([`post`]) and its answer read there ([`wait`]):
//! no client runtime task, no HTTP/2, one wake-up at each end. A share that finds every link
//! busy goes over the stream. Errors are worded and handled as the stream's: a node-reported
//! error is retried elsewhere, a broken link takes the node out of rotation until it
//! reconnects. A share unanswered at its hedge point can be given up on ([`wait_until`] hands
//! it back): its link stays held by a background reader ([`linger`]) until the node answers
//! (clearing its suspect mark) or its stall deadline passes (the node is taken out of rotation).

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nightshift_model::{ActRows, ExpertPair};
use nightshift_proto::link::{self, Framed, Hello, LinkError, Stream};
use nightshift_proto::v1::{compute_response, ComputeResponse};
use nightshift_proto::PROTOCOL_VERSION;
use prost::Message;

use super::call::{finish_call, legs, place_rows, share_request, Answer, NodeStamps, Share, Timed};
use super::held::{Held, Link};
use super::{lock, LinkState, Shared};

/// One open link and who is using it.
pub(in crate::cluster) struct NetLink {
    framed: Mutex<Framed>,
    /// Held from post to wait by one layer call.
    busy: AtomicBool,
}

impl Drop for NetLink {
    fn drop(&mut self) {
        lock(&self.framed).shutdown();
    }
}

/// The host of a `host:port` address (brackets of an IPv6 literal removed).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Opens one link to the node at `addr` (its gRPC address) on `port`: TCP, TLS when the
/// coordinator talks TLS to nodes, and the hello. Blocking; bounded by the connect timeout.
pub(super) fn open(s: &Shared, addr: &str, port: u16) -> Result<NetLink, String> {
    let host = host_of(addr);
    let timeout = s.opts.connect_timeout;
    let target = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("resolving {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} has no address"))?;
    let sock = TcpStream::connect_timeout(&target, timeout)
        .map_err(|e| format!("connect {target}: {e}"))?;
    sock.set_nodelay(true).map_err(|e| e.to_string())?;
    let io = match &s.opts.tls {
        Some(tls) => {
            let cfg = tls.link_config().map_err(|e| e.to_string())?;
            let name = tls.domain().unwrap_or(host);
            Stream::connect_tls(cfg, name, sock, timeout).map_err(|e| e.to_string())?
        }
        None => Stream::Plain(sock),
    };
    let mut f = Framed::new(io);
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        fingerprint: s.fingerprint,
        token: s
            .opts
            .auth_token
            .as_ref()
            .map(|t| format!("Bearer {t}").into_bytes())
            .unwrap_or_default(),
    };
    f.send(link::HELLO, timeout, |o| hello.encode(o))
        .map_err(|e| format!("hello: {e}"))?;
    match f.recv(Instant::now() + timeout, &mut || true) {
        Ok((link::WELCOME, _)) => f.opened(),
        Ok((link::REFUSED, b)) => {
            let (_, reason) = link::decode_refusal(b);
            return Err(format!("refused: {reason}"));
        }
        Ok((kind, _)) => return Err(format!("expected a welcome, found frame kind {kind}")),
        Err(e) => return Err(format!("hello: {e}")),
    }
    Ok(NetLink {
        framed: Mutex::new(f),
        busy: AtomicBool::new(false),
    })
}

impl Link for NetLink {
    fn busy(&self) -> &AtomicBool {
        &self.busy
    }
}

/// A share written to a node's link, to be collected with [`wait`]. Dropping it (collected or
/// not) frees the link for the next call and takes its work off the node's in-flight count.
pub(super) struct Posted {
    held: Held<NetLink>,
    request_id: u64,
    posted_ns: u64,
    /// Per pair of the share: its row already came in a `PART` frame (and is in `out`).
    parted: Vec<bool>,
}

impl std::ops::Deref for Posted {
    type Target = Held<NetLink>;

    fn deref(&self) -> &Held<NetLink> {
        &self.held
    }
}

/// Writes `share` to a free link of its node, or gives it back for the stream.
pub(super) fn post(
    s: &Arc<Shared>,
    layer: usize,
    acts: &ActRows,
    pairs: &[ExpertPair],
    share: Share,
) -> Result<Box<Posted>, Share> {
    let node = &s.nodes[share.node];
    let (link, generation) = match &*lock(&node.state) {
        LinkState::Up(c) => {
            let free = c.net.iter().find(|l| !l.busy.swap(true, Ordering::AcqRel));
            match free {
                Some(l) => (l.clone(), c.generation),
                None => return Err(share),
            }
        }
        LinkState::Down { .. } => return Err(share),
    };
    let mut req = share_request(s, layer, acts, pairs, &share);
    // a node may send finished rows ahead: they cross the network while it computes the rest
    req.parts = true;
    let (request_id, bytes_out) = (req.request_id, req.acts.len() + 8 * req.experts.len() + 5);
    let posted_ns = nightshift_proto::monotonic_ns();
    let write_timeout = super::hedge::stall_deadline(s, share.node, share.cost);
    let sent = lock(&link.framed).send(link::REQUEST, write_timeout, |o| req.encode_raw(o));
    let parted = vec![false; share.pair_idx.len()];
    let p = Posted {
        held: Held::new(s, share, link, generation, bytes_out),
        request_id,
        posted_ns,
        parted,
    };
    if let Err(e) = sent {
        let share = p.share.clone();
        if matches!(e, LinkError::Malformed(_)) {
            // Too large for a frame: nothing was written, the link is intact; the stream
            // answers the share (or refuses it the same way).
            drop(p);
            return Err(share);
        }
        // The link is broken mid-frame: the node is taken out of rotation (it reconnects with
        // fresh links) and the share goes over the stream of another replica.
        let why = format!("data link: {e}");
        let _ = finish_call(s, &share, generation, bytes_out, false, p.started, Err(why));
        drop(p);
        return Err(share);
    }
    Ok(Box::new(p))
}

/// Waits for a posted share's answer under its stall deadline (a node whose stream died in the
/// meantime fails the wait within milliseconds) and copies the outputs into their rows of `out`.
pub(super) fn wait(p: Box<Posted>, out: &mut [f32]) -> Timed<()> {
    super::held::wait_out(p, out, wait_until)
}

/// As [`wait`], but gives the share back unanswered when `hedge_at` passes first (before the
/// stall deadline): the caller hedges it elsewhere and hands it to [`linger`].
pub(super) fn wait_until(
    mut p: Box<Posted>,
    out: &mut [f32],
    hedge_at: Option<Instant>,
) -> Result<Timed<()>, Box<Posted>> {
    let s = p.s.clone();
    let s = &*s;
    let mut parted = std::mem::take(&mut p.parted);
    let (deadline, early) = p.wait_deadline(hedge_at);
    let (generation, node) = (p.generation, p.node());
    let held: &Held<NetLink> = &p;
    let mut alive = || held.link_alive();
    let received = {
        let mut f = lock(&p.link.framed);
        loop {
            match f.recv(deadline, &mut alive) {
                Ok((link::PART, payload)) => {
                    if let Err(e) = place_part(s, &p, payload, &mut parted, out) {
                        break Err(e);
                    }
                }
                Ok((link::RESPONSE, payload)) => {
                    let arrived_ns = nightshift_proto::monotonic_ns();
                    break decode_answer(payload, p.request_id, arrived_ns)
                        .and_then(|a| place(s, &p, a, &parted, out));
                }
                Ok((kind, _)) => {
                    break Err(format!(
                        "data link: expected a response, found frame kind {kind}"
                    ))
                }
                Err(LinkError::TimedOut) if early => {
                    drop(f);
                    p.parted = parted;
                    return Err(p);
                }
                Err(LinkError::TimedOut) => {
                    break Err(format!(
                        "no answer within {} ms (node {} stalled or cut off)",
                        p.stall_after().as_millis(),
                        node.name
                    ))
                }
                Err(LinkError::Closed) if !alive() => break Err("the node's stream closed".into()),
                Err(e) => break Err(format!("data link: {e}")),
            }
        }
    };
    let elapsed = p.started.elapsed();
    let result = finish_call(
        s,
        &p.share,
        generation,
        p.bytes_out,
        false,
        p.started,
        received,
    );
    if result.is_ok() {
        lock(&s.stats).link_calls += 1;
    }
    Ok(((p.share.clone(), result), elapsed))
}

/// A response frame's answer to request `id`, or the error it carries.
fn decode_answer(payload: &[u8], id: u64, arrived_ns: u64) -> Result<Answer, String> {
    let resp = ComputeResponse::decode(payload)
        .map_err(|e| format!("data link: undecodable response: {e}"))?;
    let stamps = NodeStamps::of(&resp);
    match resp.result {
        Some(compute_response::Result::Error(e)) => Err(format!("node error: {}", e.message)),
        _ if resp.request_id != id => Err(format!(
            "data link: answer to request {} while waiting for {id}",
            resp.request_id
        )),
        Some(compute_response::Result::Outputs(outputs)) => Ok(Answer {
            outputs,
            stamps,
            arrived_ns,
        }),
        None => Err("node sent an empty response".into()),
    }
}

/// Copies the rows of a `PART` frame into `out` and marks their pairs in `parted`; a part for
/// another request, a pair out of the share or one that already came is an error.
fn place_part(
    s: &Shared,
    p: &Posted,
    payload: &[u8],
    parted: &mut [bool],
    out: &mut [f32],
) -> Result<(), String> {
    let n_embd = s.n_embd;
    let part = link::decode_part(payload, n_embd).map_err(|e| format!("data link: {e}"))?;
    if part.request_id != p.request_id {
        return Err(format!(
            "data link: a part of request {} while waiting for {}",
            part.request_id, p.request_id
        ));
    }
    let mut to = Vec::with_capacity(part.idx.len());
    for &j in &part.idx {
        match parted.get_mut(j as usize) {
            Some(seen @ false) => *seen = true,
            _ => return Err(format!("data link: a part with pair {j} out of place")),
        }
        to.push(p.share.pair_idx[j as usize]);
    }
    place_rows(&to, part.rows, n_embd, out);
    lock(&s.stats).link_parts += 1;
    Ok(())
}

/// Copies an answer's rows into `out` (one `n_embd` row per pair of the share no part
/// carried, in pair order) and records where its time went; the bytes received.
fn place(
    s: &Shared,
    p: &Posted,
    a: Answer,
    parted: &[bool],
    out: &mut [f32],
) -> Result<usize, String> {
    let n_embd = s.n_embd;
    let rest: Vec<usize> = (p.share.pair_idx.iter().zip(parted))
        .filter(|(_, &seen)| !seen)
        .map(|(&pi, _)| pi)
        .collect();
    let want = rest.len() * n_embd * 4;
    if a.outputs.len() != want {
        return Err(format!(
            "expected {want} output bytes, found {}",
            a.outputs.len()
        ));
    }
    place_rows(&rest, &a.outputs, n_embd, out);
    // the parts' rows count as received too
    let received = p.share.pair_idx.len() * n_embd * 4;
    if let Some(l) = legs(p.posted_ns, &a, a.arrived_ns) {
        let mut st = lock(&s.stats);
        if st.legs.len() < 1 << 20 {
            st.legs.push(l);
        }
    }
    Ok(received)
}

/// Reads the answer of a share given up on at its hedge point, off the caller's thread, until
/// its node answers or its stall deadline passes, and then frees its link (`held::linger`).
pub(super) fn linger(p: Box<Posted>) {
    super::held::linger(p, |p| &p.held, wait);
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn the_host_of_an_address_drops_its_port_and_brackets() {
        assert_eq!(host_of("10.77.0.10:7000"), "10.77.0.10");
        assert_eq!(host_of("node-a.internal:7000"), "node-a.internal");
        assert_eq!(host_of("[::1]:7000"), "::1");
        assert_eq!(host_of("localhost"), "localhost");
    }
}
