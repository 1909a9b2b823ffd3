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
    /// Layer calls split between nodes as they went, through the claim board (`shared_call`).
    pub shared_rounds: u64,
    /// Calls given up on because their node was much slower than its recent p99 (`hedge`): sent
    /// again to other replicas (streams), or left to the nodes that answered (shared memory).
    pub hedges: u64,
    /// Request bytes sent (activations, pairs, framing estimate).
    pub bytes_out: u64,
    /// Output bytes received.
    pub bytes_in: u64,
    /// Round-trip time of each successful node call, in microseconds.
    pub latencies_us: Vec<u32>,
    /// Per layer-call round sent to several nodes that all answered: slowest minus fastest
    /// node's round trip, in microseconds (how uneven the shares were).
    pub spreads_us: Vec<u32>,
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
