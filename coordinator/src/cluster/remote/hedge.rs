//! Stalls and partitions: each node's recent latency, a hedged stream call, and the suspect mark.
//! A node stopped (SIGSTOP), cut off (link down) or throttled keeps its TCP connection, so its
//! calls would otherwise wait for the full deadline (10 s by default). Every call answered before
//! its hedge point adds its time per unit of work (`balance::expert_cost` units) to the node's
//! window of recent calls (later answers are a stall's, not the node's usual latency);
//! from that window a call of cost `c` is *expected* to take `p99(time per unit) x c`. A stream
//! call still unanswered after `hedge_factor` x expected (at least `hedge_min`) marks the node
//! *suspect* and is sent again to other live replicas of its experts; the first complete answer
//! wins, and the other call runs on in the background (its late answer clears the mark, its
//! failure takes the node out of rotation). Suspect nodes get no new work while another replica
//! exists (`RemoteExperts::assign`). Without a replica the call waits for the *stall deadline*,
//! `stall_factor` x expected (at least `stall_min`, at most the deadline), and then fails the
//! call (HTTP 503 to its requests) and marks the node down, so later calls fail at once until the
//! background reconnect finds it answering again. Outputs are the same bits whichever replica
//! answers, so hedging never changes results. Nodes on this machine reached through shared memory
//! follow the same rule (`layer_call`, `shared_call`): a share unanswered at its hedge point is
//! left to a background waiter (`shm_link::linger`) and its pairs go to other replicas in the
//! next round; in a shared call the other nodes have already taken every group the silent one
//! did not, so only the groups it took are computed again.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use nightshift_atlas_core::placement::Placement;
use nightshift_model::{ActRows, ExpertPair};

use super::call::{call_node, Share};
use super::{lock, LinkState, Shared};

/// Calls kept per node.
const WINDOW: usize = 128;
/// Calls a node must have answered before its latency is trusted for hedging.
const MIN_SAMPLES: usize = 16;

/// A node's recent answered calls, as microseconds per unit of work.
#[derive(Default)]
pub(super) struct LatencyWindow {
    per_unit_us: VecDeque<f64>,
}

impl LatencyWindow {
    pub(super) fn record(&mut self, took: Duration, cost: usize) {
        if self.per_unit_us.len() == WINDOW {
            self.per_unit_us.pop_front();
        }
        self.per_unit_us
            .push_back(took.as_secs_f64() * 1e6 / cost.max(1) as f64);
    }

    /// The p99 time of a call of `cost` units, once enough calls were seen.
    pub(super) fn expected(&self, cost: usize) -> Option<Duration> {
        if self.per_unit_us.len() < MIN_SAMPLES {
            return None;
        }
        let mut v: Vec<f64> = self.per_unit_us.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        let p99 = v[((v.len() - 1) as f64 * 0.99).round() as usize];
        Some(Duration::from_nanos(
            (p99 * cost.max(1) as f64 * 1e3).round() as u64,
        ))
    }
}

/// When a call of `cost` units to node `node` should be hedged (None: not enough history).
pub(super) fn hedge_after(s: &Shared, node: usize, cost: usize) -> Option<Duration> {
    let o = &s.opts;
    let expected = lock(&s.nodes[node].window).expected(cost)?;
    Some(
        expected
            .mul_f64(o.hedge_factor)
            .max(o.hedge_min)
            .min(o.deadline),
    )
}

/// How long a call of `cost` units to node `node` may take before it fails.
pub(super) fn stall_deadline(s: &Shared, node: usize, cost: usize) -> Duration {
    let o = &s.opts;
    match lock(&s.nodes[node].window).expected(cost) {
        Some(e) => e.mul_f64(o.stall_factor).max(o.stall_min).min(o.deadline),
        None => o.deadline,
    }
}

/// Marks node `node` suspect (or clears the mark), logging the change.
pub(super) fn set_suspect(s: &Shared, node: usize, suspect: bool, why: &str) {
    let n = &s.nodes[node];
    if n.suspect.swap(suspect, Ordering::AcqRel) != suspect {
        if suspect {
            tracing::warn!(node = %n.name, "expert node suspect: {why}");
        } else {
            tracing::info!(node = %n.name, "expert node answering again");
        }
    }
}

/// Marks node `node` suspect: its layer `layer` call is still unanswered `after` it was sent.
pub(super) fn mark_slow(s: &Shared, node: usize, layer: usize, after: Duration) {
    set_suspect(
        s,
        node,
        true,
        &format!(
            "layer {layer} call unanswered after {} ms, {:.0}x its recent p99",
            after.as_millis(),
            s.opts.hedge_factor
        ),
    );
}

/// Counts a call of node `node` given up on at its hedge point and left to other replicas.
pub(super) fn count_hedge(s: &Shared, node: usize) {
    lock(&s.stats).hedges += 1;
    metrics::counter!("nightshift_node_hedges_total", "node" => s.nodes[node].name.clone())
        .increment(1);
}

/// A stream call of `share`, hedged on other replicas when its node is much slower than usual.
pub(super) async fn hedged_call(
    s: Arc<Shared>,
    placement: Arc<Placement>,
    layer: usize,
    acts: Arc<ActRows>,
    pairs: Arc<Vec<ExpertPair>>,
    share: Share,
) -> (Share, Result<Vec<u8>, String>) {
    let node = share.node;
    let Some(after) = hedge_after(&s, node, share.cost) else {
        return call_node(s, layer, acts, pairs, share).await;
    };
    let own = share.pair_idx.clone();
    let cost = share.cost;
    let mut primary = Box::pin(call_node(
        s.clone(),
        layer,
        acts.clone(),
        pairs.clone(),
        share,
    ));
    tokio::select! {
        r = &mut primary => return r,
        _ = tokio::time::sleep(after) => {}
    }
    mark_slow(&s, node, layer, after);
    let alternatives = alternatives(&s, &placement, layer, &pairs, &own, node);
    if alternatives.is_empty() {
        // No other replica: the call waits for its stall deadline.
        return primary.await;
    }
    count_hedge(&s, node);
    let mut alts =
        Box::pin(futures::future::join_all(alternatives.into_iter().map(
            |sh| call_node(s.clone(), layer, acts.clone(), pairs.clone(), sh),
        )));
    tokio::select! {
        r = &mut primary => {
            if r.1.is_ok() {
                // The slow node answered first after all; the hedges finish on their own.
                tokio::spawn(alts);
                return r;
            }
            let done = alts.await;
            let placed = assemble(&s, &own, done);
            (r.0, placed)
        }
        done = &mut alts => {
            match assemble(&s, &own, done) {
                Ok(bytes) => {
                    // The slow call runs on: its answer clears the suspect mark, its stall
                    // deadline takes the node out of rotation.
                    tokio::spawn(primary);
                    let share = Share {
                        node,
                        pair_idx: own,
                        cost,
                        hint: None,
                    };
                    // Reported as the original share's success: its pairs are all answered.
                    (share, Ok(bytes))
                }
                Err(_) => primary.await,
            }
        }
    }
}

/// Shares of the pairs `own` (indices into `pairs`) on live, not suspect replicas other than
/// `slow`, balanced as usual; empty when some expert has no such replica.
pub(super) fn alternatives(
    s: &Shared,
    placement: &Placement,
    layer: usize,
    pairs: &[ExpertPair],
    own: &[usize],
    slow: usize,
) -> Vec<Share> {
    let up: Vec<bool> = s
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            i != slow
                && !n.suspect.load(Ordering::Acquire)
                && matches!(&*lock(&n.state), LinkState::Up(_))
        })
        .collect();
    let bias: Vec<usize> = s
        .nodes
        .iter()
        .map(|n| n.outstanding.load(Ordering::Relaxed))
        .collect();
    super::balance::plan(
        pairs,
        own,
        |e| placement.replicas(layer, e as usize),
        &up,
        &bias,
        &Default::default(),
    )
    .map(|planned| {
        planned
            .into_iter()
            .map(|p| Share {
                node: p.node,
                pair_idx: p.pair_idx,
                cost: p.cost,
                hint: None,
            })
            .collect()
    })
    .unwrap_or_default()
}

/// The output bytes of the pairs `own`, in that order, from the hedged shares' answers.
fn assemble(
    s: &Shared,
    own: &[usize],
    done: Vec<(Share, Result<Vec<u8>, String>)>,
) -> Result<Vec<u8>, String> {
    let row = s.n_embd * 4;
    let mut out = vec![0u8; own.len() * row];
    let mut filled = 0;
    for (share, r) in done {
        let bytes = r?;
        for (j, pi) in share.pair_idx.iter().enumerate() {
            let k = own
                .binary_search(pi)
                .map_err(|_| format!("hedged answer for pair {pi} outside the share"))?;
            out[k * row..(k + 1) * row].copy_from_slice(&bytes[j * row..(j + 1) * row]);
            filled += 1;
        }
    }
    if filled != own.len() {
        return Err(format!(
            "hedged answers cover {filled} of {} pairs",
            own.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_time_is_the_p99_per_unit_times_the_cost() {
        let mut w = LatencyWindow::default();
        for i in 0..(MIN_SAMPLES - 1) {
            w.record(Duration::from_micros(100 + i as u64), 2);
        }
        assert_eq!(w.expected(4), None, "too few calls to trust");
        w.record(Duration::from_micros(100), 2);
        // per unit: 50..57 us; p99 of 16 samples is the largest, 57 us.
        assert_eq!(w.expected(4), Some(Duration::from_micros(4 * 57)));
        for _ in 0..WINDOW {
            w.record(Duration::from_micros(10), 1);
        }
        assert_eq!(
            w.expected(3),
            Some(Duration::from_micros(30)),
            "old calls leave the window"
        );
    }
}
