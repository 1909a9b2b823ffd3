//! The coordinator's side of the shared-memory link (`nightshift_proto::shm`) to a node on this
//! machine: attached beside the compute stream when the stream opens, used for every layer call
//! that fits the region, and dropped with the stream (the node then closes its side). Any
//! failure to attach just leaves the node on the stream; a call that cannot be posted (region
//! busy with another caller's call, too large) goes over the stream too. Errors are worded and
//! handled as the stream's: a node-reported error is retried elsewhere, a broken link takes the
//! node out of rotation until it reconnects. A share unanswered at its hedge point (`hedge`) can
//! be given up on ([`wait_until`] hands it back): its region stays held by a background waiter
//! ([`linger`]) until the node answers (clearing its suspect mark) or reaches its stall deadline
//! (taken out of rotation), so no later call writes into a region the node may still answer in.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nightshift_model::{ActRows, ExpertPair};
use nightshift_proto::shm::{ShmClient, ShmError, ShmView};
use nightshift_proto::v1::expert_service_client::ExpertServiceClient;
use nightshift_proto::v1::AttachShmRequest;
use tonic::transport::Channel;

use super::call::{finish_call, share_request, Share, Timed};
use super::errors::status_chain;
use super::held::{Held, Link};
use super::{answered, handshake, lock, LinkState, Shared};

/// An attached region and who is using it.
pub(in crate::cluster) struct ShmLink {
    client: Mutex<ShmClient>,
    /// Held from post to wait by one layer call.
    busy: AtomicBool,
}

/// Creates a region sized for `shm_pairs` pairs and hands it to the node.
pub(super) async fn attach(
    s: &Shared,
    client: &mut ExpertServiceClient<Channel>,
) -> Result<ShmLink, String> {
    let (pairs, n) = (s.opts.shm_pairs, s.n_embd);
    // Requests carry at most one activation row per pair, F32 at the widest.
    let req_cap = pairs.saturating_mul(8 + 4 * n);
    // one output row per pair, and a shared call's list of the pairs answered
    let resp_cap = pairs.saturating_mul(4 * n + 4);
    let mut region = ShmClient::create(req_cap, resp_cap).map_err(|e| e.to_string())?;
    let mut req = tonic::Request::new(AttachShmRequest {
        path: region.path().display().to_string(),
        board: s
            .board
            .as_ref()
            .map(|b| b.path().display().to_string())
            .unwrap_or_default(),
    });
    handshake(&mut req, s)?;
    answered(s, "attach", client.attach_shm(req))
        .await?
        .map_err(|e| format!("attach: {}", status_chain(&e)))?;
    region.unlink();
    Ok(ShmLink {
        client: Mutex::new(region),
        busy: AtomicBool::new(false),
    })
}

impl Link for ShmLink {
    fn busy(&self) -> &AtomicBool {
        &self.busy
    }
}

/// A share posted to a node's region, to be collected with [`wait`]. Dropping it (collected or
/// not) frees the region for the next call and takes its work off the node's in-flight count.
pub(super) type Posted = Held<ShmLink>;

/// Posts `share` through its node's region, or gives it back for the stream. `tag` (not 0)
/// makes it a shared call of the claim board (`shared_call`): the node then computes the first
/// `owned` expert groups of the share and those it claims after them, and [`wait`] gives back
/// the share narrowed to the pairs it answered.
pub(super) fn post(
    s: &Arc<Shared>,
    layer: usize,
    acts: &ActRows,
    pairs: &[ExpertPair],
    share: Share,
    tag: u32,
    owned: u32,
) -> Result<Posted, Share> {
    let node = &s.nodes[share.node];
    let (link, generation) = match &*lock(&node.state) {
        LinkState::Up(c) => match &c.shm {
            Some(l) => (l.clone(), c.generation),
            None => return Err(share),
        },
        LinkState::Down { .. } => return Err(share),
    };
    // Taken before the client's lock: a share given up on (`linger`) holds that lock while it
    // waits, and its busy flag turns later calls to the stream without blocking on it.
    if link.busy.swap(true, Ordering::AcqRel) {
        return Err(share);
    }
    let row_bytes = acts.data.len() / acts.n_rows.max(1);
    let rows_needed = share.pair_idx.len(); // at most one row per pair
    if !lock(&link.client).fits(share.pair_idx.len(), rows_needed * row_bytes, s.n_embd) {
        link.busy.store(false, Ordering::Release);
        return Err(share);
    }
    let req = share_request(s, layer, acts, pairs, &share);
    let bytes_out = req.acts.len() + 8 * req.experts.len();
    if let Err(e) = lock(&link.client).post_tagged(&req, tag, owned) {
        tracing::debug!(node = %node.name, "shared-memory post failed, using the stream: {e}");
        link.busy.store(false, Ordering::Release);
        return Err(share);
    }
    Ok(Held::new(s, share, link, generation, bytes_out))
}

/// Waits for a posted share's outputs under the call deadline (a node whose stream died in the
/// meantime fails the wait within milliseconds) and copies them from the region straight into
/// their rows of `out`. The share comes back narrowed to the pairs answered (a shared call's
/// node answers only the groups it took).
pub(super) fn wait(p: Posted, out: &mut [f32]) -> Timed<()> {
    super::held::wait_out(p, out, wait_until)
}

/// As [`wait`], but gives the share back unanswered when `hedge_at` passes first (before the
/// stall deadline): the caller hedges it elsewhere and hands it to [`linger`].
pub(super) fn wait_until(
    mut p: Posted,
    out: &mut [f32],
    hedge_at: Option<Instant>,
) -> Result<Timed<()>, Posted> {
    let s = p.s.clone();
    let s = &*s;
    let (deadline, early) = p.wait_deadline(hedge_at);
    let held = &p;
    let mut alive = || held.link_alive();
    let n_embd = s.n_embd;
    let link = p.link.clone();
    let received = {
        let mut client = lock(&link.client);
        match client.wait_view(deadline, &mut alive) {
            Ok(ShmView::Rows { rows, answered }) => {
                let js: Vec<usize> = match answered {
                    None => (0..p.share.pair_idx.len()).collect(),
                    Some(list) => list.into_iter().map(|j| j as usize).collect(),
                };
                if rows.len() != p.share.pair_idx.len() * n_embd {
                    Err(format!(
                        "shared memory: {} output values for {} pairs",
                        rows.len(),
                        p.share.pair_idx.len()
                    ))
                } else {
                    // `wait_view` checked every listed pair is in range and listed once.
                    let mut kept = Vec::with_capacity(js.len());
                    for &j in &js {
                        let pi = p.share.pair_idx[j];
                        out[pi * n_embd..(pi + 1) * n_embd]
                            .copy_from_slice(&rows[j * n_embd..(j + 1) * n_embd]);
                        kept.push(pi);
                    }
                    p.share.pair_idx = kept;
                    Ok(4 * n_embd * js.len())
                }
            }
            Ok(ShmView::Error { message, .. }) => Err(format!("node error: {message}")),
            // still outstanding: the region stays the node's until it answers
            Err(ShmError::Deadline(_)) if early => return Err(p),
            Err(e) => Err(format!("shared memory: {e}")),
        }
    };
    let elapsed = p.started.elapsed();
    let result = finish_call(
        s,
        &p.share,
        p.generation,
        p.bytes_out,
        true,
        p.started,
        received,
    );
    let share = Share {
        node: p.share.node,
        pair_idx: std::mem::take(&mut p.share.pair_idx),
        cost: p.share.cost,
        hint: None,
    };
    Ok(((share, result), elapsed))
}

/// Waits for a share given up on at its hedge point, off the caller's thread, until its node
/// answers or its stall deadline passes, and then frees its region (`held::linger`).
pub(super) fn linger(p: Posted) {
    super::held::linger(p, |p| p, wait);
}
