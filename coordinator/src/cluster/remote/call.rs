//! One layer call's share on one node: the request that carries it, the call over the node's
//! stream, and the bookkeeping every transport shares (output check, statistics, metrics, taking
//! a node out of rotation on a transport failure).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nightshift_model::{ActRows, ExpertPair};
use nightshift_proto::v1::{ComputeRequest, ComputeResponse, PrefetchHint};
use tokio::sync::oneshot;

use super::stats::CallLegs;
use super::{lock, mark_down, LinkState, Shared};

/// A share's outcome (the output bytes over a stream, `()` once written in place from shared
/// memory) and how long after it was sent the answer was in hand.
pub(super) type Timed<T> = ((Share, Result<T, String>), Duration);

/// The timestamps a node put on its answer (`ComputeResponse`, its `monotonic_ns`): all zero
/// from a node that does not report them.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct NodeStamps {
    received: u64,
    started: u64,
    ended: u64,
    replied: u64,
}

impl NodeStamps {
    pub(super) fn of(r: &ComputeResponse) -> NodeStamps {
        NodeStamps {
            received: r.received_ns,
            started: r.started_ns,
            ended: r.ended_ns,
            replied: r.replied_ns,
        }
    }
}

/// A node's answer as the stream reader hands it to the waiting call: the outputs, the node's
/// timestamps and when the reader had it (`monotonic_ns`).
pub(super) struct Answer {
    pub(super) outputs: Vec<u8>,
    pub(super) stamps: NodeStamps,
    pub(super) arrived_ns: u64,
}

/// Where one answered stream call's time went (`CallLegs`), from the coordinator's stamps
/// (`posted_ns` before the request went to the stream, `woke_ns` when the call had the answer)
/// and the node's; None when the node reported no stamps or they are out of order.
pub(super) fn legs(posted_ns: u64, a: &Answer, woke_ns: u64) -> Option<CallLegs> {
    let n = a.stamps;
    let ordered = n.received > 0
        && n.received <= n.started
        && n.started <= n.ended
        && n.ended <= n.replied
        && a.arrived_ns <= woke_ns
        && posted_ns <= woke_ns;
    if !ordered {
        return None;
    }
    let us = |ns: u64| (ns / 1000).min(u32::MAX as u64) as u32;
    // The legs across the link compare two processes' clocks: meaningful on one machine only,
    // where they are the same CLOCK_MONOTONIC (and then each is non-negative).
    let same_clock = posted_ns <= n.received && n.replied <= a.arrived_ns;
    Some(CallLegs {
        total_us: us(woke_ns - posted_ns),
        out_us: same_clock.then(|| us(n.received - posted_ns)),
        node_wait_us: us(n.started - n.received),
        compute_us: us(n.ended - n.started),
        node_reply_us: us(n.replied - n.ended),
        back_us: same_clock.then(|| us(a.arrived_ns - n.replied)),
        wake_us: us(woke_ns - a.arrived_ns),
    })
}

/// One node's share of a layer call.
#[derive(Clone)]
pub(super) struct Share {
    pub(super) node: usize,
    /// Indices into the call's `pairs`.
    pub(super) pair_idx: Vec<usize>,
    /// Estimated work of the share (`balance::expert_cost` units), in flight while it runs.
    pub(super) cost: usize,
    /// The prefetch hint riding with the share's request (`hints`): only a layer call's first
    /// request to a node carries one.
    pub(super) hint: Option<PrefetchHint>,
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
        prefetch: share.hint.clone(),
        parts: false,
    }
}

/// Copies a share's answer (one little-endian f32 row of `n_embd` per pair, in pair order,
/// its size already checked) into the pairs' rows of the call's `out`.
pub(super) fn place_rows(pair_idx: &[usize], bytes: &[u8], n_embd: usize, out: &mut [f32]) {
    for (j, &pi) in pair_idx.iter().enumerate() {
        nightshift_proto::le_bytes_to_f32s(
            &bytes[j * n_embd * 4..(j + 1) * n_embd * 4],
            &mut out[pi * n_embd..(pi + 1) * n_embd],
        );
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
    let posted_ns = nightshift_proto::monotonic_ns();
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
    let result = result.map(|answer| {
        if let Some(l) = legs(posted_ns, &answer, nightshift_proto::monotonic_ns()) {
            let mut st = lock(&s.stats);
            if st.legs.len() < 1 << 20 {
                st.legs.push(l);
            }
        }
        answer.outputs
    });
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

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(stamps: [u64; 4], arrived_ns: u64) -> Answer {
        Answer {
            outputs: Vec::new(),
            stamps: NodeStamps {
                received: stamps[0],
                started: stamps[1],
                ended: stamps[2],
                replied: stamps[3],
            },
            arrived_ns,
        }
    }

    #[test]
    fn legs_split_a_round_trip_on_one_clock() {
        let a = answer([110_000, 130_000, 530_000, 545_000], 600_000);
        let l = legs(100_000, &a, 640_000).expect("ordered stamps");
        assert_eq!(
            l,
            CallLegs {
                total_us: 540,
                out_us: Some(10),
                node_wait_us: 20,
                compute_us: 400,
                node_reply_us: 15,
                back_us: Some(55),
                wake_us: 40,
            }
        );
    }

    #[test]
    fn another_machines_clock_keeps_only_the_legs_of_each_end() {
        // the node's clock is far ahead of the coordinator's
        let a = answer([9_000_000, 9_020_000, 9_420_000, 9_435_000], 600_000);
        let l = legs(100_000, &a, 640_000).expect("each end's stamps are ordered");
        assert_eq!((l.out_us, l.back_us), (None, None));
        assert_eq!(
            (l.node_wait_us, l.compute_us, l.node_reply_us),
            (20, 400, 15)
        );
        assert_eq!((l.total_us, l.wake_us), (540, 40));
    }

    #[test]
    fn missing_or_disordered_stamps_give_no_legs() {
        assert!(legs(100_000, &answer([0; 4], 600_000), 640_000).is_none());
        let swapped = answer([110_000, 530_000, 130_000, 545_000], 600_000);
        assert!(legs(100_000, &swapped, 640_000).is_none());
    }
}
