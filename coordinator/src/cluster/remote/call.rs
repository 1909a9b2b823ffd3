//! One layer call's share on one node: the request that carries it, the call over the node's
//! stream, and the bookkeeping every transport shares (output check, statistics, metrics, taking
//! a node out of rotation on a transport failure).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nightshift_model::{ActRows, ExpertPair};
use nightshift_proto::v1::ComputeRequest;
use tokio::sync::oneshot;

use super::{lock, mark_down, LinkState, Shared};

/// A share's outcome (the output bytes over a stream, `()` once written in place from shared
/// memory) and how long after it was sent the answer was in hand.
pub(super) type Timed<T> = ((Share, Result<T, String>), Duration);

/// One node's share of a layer call.
#[derive(Clone)]
pub(super) struct Share {
    pub(super) node: usize,
    /// Indices into the call's `pairs`.
    pub(super) pair_idx: Vec<usize>,
    /// Estimated work of the share (`balance::expert_cost` units), in flight while it runs.
    pub(super) cost: usize,
}

/// The request carrying `share`: only the activation rows it needs travel, renumbered densely.
pub(super) fn share_request(
    s: &Shared,
    layer: usize,
    acts: &ActRows,
    pairs: &[ExpertPair],
    share: &Share,
) -> ComputeRequest {
    let row_bytes = acts.data.len() / acts.n_rows.max(1);
    let mut remap: HashMap<u32, u32> = HashMap::new();
    let mut data = Vec::new();
    let mut experts = Vec::with_capacity(share.pair_idx.len());
    let mut rows = Vec::with_capacity(share.pair_idx.len());
    for &pi in &share.pair_idx {
        let p = pairs[pi];
        let next = remap.len() as u32;
        let r = *remap.entry(p.row).or_insert_with(|| {
            let start = p.row as usize * row_bytes;
            data.extend_from_slice(&acts.data[start..start + row_bytes]);
            next
        });
        experts.push(p.expert);
        rows.push(r);
    }
    ComputeRequest {
        request_id: s.next_id.fetch_add(1, Ordering::Relaxed),
        step_id: 0,
        layer: layer as u32,
        act_type: acts.ty.id(),
        n_rows: remap.len() as u32,
        n_embd: s.n_embd as u32,
        acts: data,
        experts,
        rows,
    }
}

/// Checks the size of a call's outputs (`received` bytes for the pairs of `share`), records
/// the call in the stats and metrics, and takes the node out of rotation on a transport failure
/// (node-reported errors, "node error: ...", do not: the work is still retried elsewhere).
pub(super) fn finish_call(
    s: &Shared,
    share: &Share,
    generation: u64,
    bytes_out: usize,
    shm: bool,
    started: Instant,
    received: Result<usize, String>,
) -> Result<(), String> {
    let node = &s.nodes[share.node];
    let result = received.and_then(|n| {
        let want = share.pair_idx.len() * s.n_embd * 4;
        if n == want {
            Ok(n)
        } else {
            Err(format!("expected {want} output bytes, found {n}"))
        }
    });
    let secs = started.elapsed().as_secs_f64();
    metrics::histogram!("nightshift_node_rpc_seconds", "node" => node.name.clone()).record(secs);
    {
        let mut st = lock(&s.stats);
        st.calls += 1;
        st.shm_calls += shm as u64;
        st.bytes_out += bytes_out as u64;
        match &result {
            Ok(n) => {
                // An answer later than its hedge point (a stall's late answer) is not the
                // node's usual latency: kept out, so one stall does not raise the bar for the next.
                let took = started.elapsed();
                if super::hedge::hedge_after(s, share.node, share.cost).is_none_or(|h| took <= h) {
                    lock(&node.window).record(took, share.cost);
                }
                st.bytes_in += *n as u64;
                if st.latencies_us.len() < 1 << 20 {
                    st.latencies_us.push((secs * 1e6) as u32);
                }
            }
            Err(_) => st.errors += 1,
        }
    }
    if result.is_ok() {
        super::hedge::set_suspect(s, share.node, false, "answered");
    }
    if let Err(e) = &result {
        metrics::counter!("nightshift_node_rpc_errors_total", "node" => node.name.clone())
            .increment(1);
        if !e.starts_with("node error") {
            mark_down(s, share.node, generation, e.clone());
        }
    }
    result.map(|_| ())
}

/// Sends `share` to its node over the stream and waits for the outputs (one n_embd row per
/// pair).
pub(super) async fn call_node(
    s: Arc<Shared>,
    layer: usize,
    acts: Arc<ActRows>,
    pairs: Arc<Vec<ExpertPair>>,
    share: Share,
) -> (Share, Result<Vec<u8>, String>) {
    let node = &s.nodes[share.node];
    let (tx, pending, generation) = match &*lock(&node.state) {
        LinkState::Up(c) => (c.tx.clone(), c.pending.clone(), c.generation),
        LinkState::Down { reason, .. } => {
            let r = format!("node {} is down: {reason}", node.name);
            return (share, Err(r));
        }
    };
    let req = share_request(&s, layer, &acts, &pairs, &share);
    let request_id = req.request_id;
    let bytes_out = req.acts.len() + 8 * req.experts.len() + 32;
    let started = Instant::now();
    let (wtx, wrx) = oneshot::channel();
    lock(&pending).insert(request_id, wtx);
    node.outstanding.fetch_add(share.cost, Ordering::Relaxed);
    let result = async {
        tx.send(req)
            .await
            .map_err(|_| "stream closed".to_string())?;
        let deadline = super::hedge::stall_deadline(&s, share.node, share.cost);
        match tokio::time::timeout(deadline, wrx).await {
            Err(_) => Err(format!(
                "no answer within {} ms (node {} stalled or cut off)",
                deadline.as_millis(),
                node.name
            )),
            Ok(Err(_)) => Err("stream closed before the answer".to_string()),
            Ok(Ok(r)) => r,
        }
    }
    .await;
    node.outstanding.fetch_sub(share.cost, Ordering::Relaxed);
    lock(&pending).remove(&request_id);
    let received = result.as_ref().map(Vec::len).map_err(Clone::clone);
    let checked = finish_call(&s, &share, generation, bytes_out, false, started, received);
    (share, checked.and(result))
}

/// Records how uneven a round sent to several nodes was (slowest minus fastest), when all
/// answered.
pub(super) fn record_spread<T>(s: &Shared, timed: &[Timed<T>]) {
    if timed.len() < 2 || timed.iter().any(|((_, r), _)| r.is_err()) {
        return;
    }
    let lo = timed.iter().map(|(_, t)| *t).min();
    let hi = timed.iter().map(|(_, t)| *t).max();
    if let (Some(lo), Some(hi)) = (lo, hi) {
        let mut st = lock(&s.stats);
        if st.spreads_us.len() < 1 << 20 {
            st.spreads_us.push((hi - lo).as_micros() as u32);
        }
    }
}
