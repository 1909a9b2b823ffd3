//! `RpcStats`: counters of the remote backend's layer calls (calls, errors, shared-memory and
//! shared rounds, bytes each way, round-trip latencies and the spread between nodes' round trips)
//! with their quantiles, for benchmarks, metrics and operators.

/// Counters of the layer calls made so far (for benchmarks and operators).
#[derive(Clone, Debug, Default)]
pub struct RpcStats {
    pub calls: u64,
    pub errors: u64,
    /// Of `calls`, those that went through shared memory (nodes on this machine).
    pub shm_calls: u64,
    /// Of `calls`, those answered over a framed data link (`net_link`).
    pub link_calls: u64,
    /// `PART` frames received on data links: rows a node sent ahead of its answer.
    pub link_parts: u64,
    /// Layer calls split between nodes as they went, through the claim board (`shared_call`).
    pub shared_rounds: u64,
    /// Calls given up on because their node was much slower than its recent p99 (`hedge`): sent
    /// again to other replicas (streams), or left to the nodes that answered (shared memory).
    pub hedges: u64,
    /// Prefetch hints sent to nodes (`hints`: with a request or alone), and the experts they
    /// named.
    pub hints: u64,
    pub hint_experts: u64,
    /// Request bytes sent (activations, pairs, framing estimate).
    pub bytes_out: u64,
    /// Output bytes received.
    pub bytes_in: u64,
    /// Round-trip time of each successful node call, in microseconds.
    pub latencies_us: Vec<u32>,
    /// Per layer-call round sent to several nodes that all answered: slowest minus fastest
    /// node's round trip, in microseconds (how uneven the shares were).
    pub spreads_us: Vec<u32>,
    /// Where each answered stream call's time went (nodes that report their timestamps).
    pub legs: Vec<CallLegs>,
    /// Per round of stream calls: from the last call having its answer to the engine's thread
    /// having the round (the hand-over out of the client runtime), in microseconds.
    pub lands_us: Vec<u32>,
}

/// One stream call's round trip split at the timestamps of both ends, in microseconds. The legs
/// across the link (`out_us`, `back_us`) compare the two ends' clocks, so they are known only
/// when the node runs on the coordinator's machine (network namespaces included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallLegs {
    /// Coordinator: request handed to the stream -> the answer in the waiting call's hands.
    pub total_us: u32,
    /// Request handed to the stream -> decoded on the node (encode, TLS, h2, TCP, relay, decode).
    pub out_us: Option<u32>,
    /// Node: decoded -> its compute started on a worker (the hand-off to the pool).
    pub node_wait_us: u32,
    /// Node: validation and the expert FFNs.
    pub compute_us: u32,
    /// Node: compute ended -> the answer handed to its stream (the hand-back).
    pub node_reply_us: u32,
    /// Node's answer handed to its stream -> read by the coordinator's stream reader.
    pub back_us: Option<u32>,
    /// Coordinator: the reader had the answer -> the waiting call resumed with it.
    pub wake_us: u32,
}

/// The mean of every leg over a set of calls (`RpcStats::legs_mean`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LegsSummary {
    pub calls: usize,
    /// Each leg's mean (a link leg over the calls that have it).
    pub mean: CallLegs,
    /// Mean of `RpcStats::lands_us`.
    pub land_us: Option<u32>,
}

impl RpcStats {
    /// The `q`-quantile (0..=1) of the round-trip latencies, in microseconds.
    pub fn latency_quantile_us(&self, q: f64) -> Option<u32> {
        quantile(&self.latencies_us, q)
    }

    /// The `q`-quantile (0..=1) of the per-round node spreads (`spreads_us`), in microseconds.
    pub fn spread_quantile_us(&self, q: f64) -> Option<u32> {
        quantile(&self.spreads_us, q)
    }

    /// The mean of every leg over the calls that reported theirs, None when none did. Means,
    /// not medians: on one clock the legs of a call add up to its total, and so do their means.
    pub fn legs_mean(&self) -> Option<LegsSummary> {
        let l = &self.legs;
        if l.is_empty() {
            return None;
        }
        let mean = |v: Vec<u32>| {
            (!v.is_empty())
                .then(|| (v.iter().map(|&x| x as u64).sum::<u64>() / v.len() as u64) as u32)
        };
        let all = |f: fn(&CallLegs) -> u32| mean(l.iter().map(f).collect()).unwrap_or(0);
        // the legs across the link only over the calls that have them (all or none, on one
        // machine or not), so they still add up with the others
        let some = |f: fn(&CallLegs) -> Option<u32>| mean(l.iter().filter_map(f).collect());
        Some(LegsSummary {
            calls: l.len(),
            mean: CallLegs {
                total_us: all(|c| c.total_us),
                out_us: some(|c| c.out_us),
                node_wait_us: all(|c| c.node_wait_us),
                compute_us: all(|c| c.compute_us),
                node_reply_us: all(|c| c.node_reply_us),
                back_us: some(|c| c.back_us),
                wake_us: all(|c| c.wake_us),
            },
            land_us: mean(self.lands_us.clone()),
        })
    }
}

fn quantile(v: &[u32], q: f64) -> Option<u32> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
    Some(v[i])
}
