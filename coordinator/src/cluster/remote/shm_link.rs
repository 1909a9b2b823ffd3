//! The coordinator's side of the shared-memory link (`nightshift_proto::shm`) to a node on this
//! machine: attached beside the compute stream when the stream opens, used for every layer call
//! that fits the region, and dropped with the stream (the node then closes its side). Any
//! failure to attach just leaves the node on the stream; a call that cannot be posted (region
//! busy with another caller's call, too large) goes over the stream too. Errors are worded and
//! handled as the stream's: a node-reported error is retried elsewhere, a broken link takes the
//! node out of rotation until it reconnects.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nightshift_model::{ActRows, ExpertPair};
use nightshift_proto::shm::{ShmClient, ShmView};
use nightshift_proto::v1::expert_service_client::ExpertServiceClient;
use nightshift_proto::v1::AttachShmRequest;
use tonic::transport::Channel;

use super::call::{finish_call, share_request, Share, Timed};
use super::errors::status_chain;
use super::{answered, handshake, lock, LinkState, NodeLink, Shared};

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

/// A share posted to a node's region, to be collected with [`wait`]. Dropping it (collected or
/// not) frees the region for the next call and takes its work off the node's in-flight count.
pub(super) struct Posted<'a> {
    node: &'a NodeLink,
    share: Share,
    link: Arc<ShmLink>,
    generation: u64,
    bytes_out: usize,
    started: Instant,
}

impl Drop for Posted<'_> {
    fn drop(&mut self) {
        self.node
            .outstanding
            .fetch_sub(self.share.cost, Ordering::Relaxed);
        self.link.busy.store(false, Ordering::Release);
    }
}

/// Posts `share` through its node's region, or gives it back for the stream. `tag` (not 0)
/// makes it a shared call of the claim board (`shared_call`): the node then computes only the
/// expert groups it claims, and [`wait`] gives back the share narrowed to the pairs it answered.
pub(super) fn post<'a>(
    s: &'a Shared,
    layer: usize,
    acts: &ActRows,
    pairs: &[ExpertPair],
    share: Share,
    tag: u32,
) -> Result<Posted<'a>, Share> {
    let node = &s.nodes[share.node];
    let (link, generation) = match &*lock(&node.state) {
        LinkState::Up(c) => match &c.shm {
            Some(l) => (l.clone(), c.generation),
            None => return Err(share),
        },
        LinkState::Down { .. } => return Err(share),
    };
    let row_bytes = acts.data.len() / acts.n_rows.max(1);
    let rows_needed = share.pair_idx.len(); // at most one row per pair
    if !lock(&link.client).fits(share.pair_idx.len(), rows_needed * row_bytes, s.n_embd) {
        return Err(share);
    }
    if link.busy.swap(true, Ordering::AcqRel) {
        return Err(share);
    }
    let req = share_request(s, layer, acts, pairs, &share);
    let bytes_out = req.acts.len() + 8 * req.experts.len();
    let started = Instant::now();
    if let Err(e) = lock(&link.client).post_tagged(&req, tag) {
        tracing::debug!(node = %node.name, "shared-memory post failed, using the stream: {e}");
        link.busy.store(false, Ordering::Release);
        return Err(share);
    }
    node.outstanding.fetch_add(share.cost, Ordering::Relaxed);
    Ok(Posted {
        node,
        share,
        link,
        generation,
        bytes_out,
        started,
    })
}

/// Waits for a posted share's outputs under the call deadline (a node whose stream died in the
/// meantime fails the wait within milliseconds) and copies them from the region straight into
/// their rows of `out`. The share comes back narrowed to the pairs answered (a shared call's
/// node answers only the groups it took).
pub(super) fn wait(s: &Shared, mut p: Posted<'_>, out: &mut [f32]) -> Timed<()> {
    let node = p.node;
    let deadline = p.started + super::hedge::stall_deadline(s, p.share.node, p.share.cost);
    let generation = p.generation;
    let mut alive =
        || matches!(&*lock(&node.state), LinkState::Up(c) if c.generation == generation);
    let n_embd = s.n_embd;
    let received = {
        let mut client = lock(&p.link.client);
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
    };
    ((share, result), elapsed)
}
