//! How much of a memory budget (the in-process engine's, or each expert node's) is a fixed
//! resident set and how much is left to the cold-expert staging cache, which keeps what was
//! used last (`plan --memory-budget` on an atlas with a routing trace, `Temporal::trace`).
//!
//! A resident set chosen by counts holds the experts that are hot over the whole recording; a
//! least-recently-used cache holds the ones hot *now*. Where routing follows a topic for a while
//! (real MoE models: ~45% of a token's experts were also the previous token's, ~80% within 8
//! tokens on Qwen3-30B-A3B), the recent past predicts the next token's experts better than the
//! counts do, and the page cache alone (an LRU over the same memory) can hold more of what a
//! layer needs than the counts' hottest set (docs/RESULTS.md, #22). Which is better depends on
//! the model and the traffic, so the planner replays the recorded decode tokens against each
//! split of the budget — the hottest experts by count resident up to a share, an LRU of whole
//! experts over the rest — and keeps the split that would have found the most experts in
//! memory. The engine and each expert node give their staging cache whatever the budget leaves
//! the resident set (the budget minus the resident bytes), so the plan's resident set is the
//! whole decision. Over several nodes each node's cache keeps only its own experts.

use std::collections::BTreeMap;

use crate::placement::{LayerPlacement, Placement};

/// Shares of the budget tried for the fixed resident set: 0, 1/8, ..., 8/8.
pub const SHARES: usize = 8;

/// The outcome of one replay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Replay {
    /// expert uses replayed
    pub uses: u64,
    /// uses of resident experts
    pub resident_hits: u64,
    /// uses of experts the cache held
    pub cache_hits: u64,
}

impl Replay {
    /// Share of uses found in memory.
    pub fn hit_rate(&self) -> f64 {
        if self.uses == 0 {
            return 0.0;
        }
        (self.resident_hits + self.cache_hits) as f64 / self.uses as f64
    }

    /// Expert reads per replayed token.
    pub fn misses_per_token(&self, tokens: usize) -> f64 {
        let misses = self.uses - self.resident_hits - self.cache_hits;
        misses as f64 / tokens.max(1) as f64
    }
}

/// Replays `trace` (per MoE slot, `top_k` expert ids per token, token by token through the
/// slots as a decode step runs them) against `resident[slot][expert]` and a least-recently-used
/// cache of `cache_experts` whole experts over every expert that is not resident (a miss is
/// read into the cache, evicting the least recently used).
pub fn replay(
    trace: &[Vec<u16>],
    top_k: usize,
    resident: &[Vec<bool>],
    cache_experts: usize,
) -> Replay {
    replay_nodes(trace, top_k, resident, None, &[cache_experts])
}

/// [`replay`] over several nodes: expert `e` of slot `s` is held by node `holder[s][e]` (one
/// holder each; `None`: every expert on node 0), and each node's cache of `caches[node]` whole
/// experts keeps only its own experts' uses.
pub fn replay_nodes(
    trace: &[Vec<u16>],
    top_k: usize,
    resident: &[Vec<bool>],
    holder: Option<&[Vec<usize>]>,
    caches: &[usize],
) -> Replay {
    let mut out = Replay {
        uses: 0,
        resident_hits: 0,
        cache_hits: 0,
    };
    let tokens = match trace.first() {
        Some(t) if top_k > 0 => t.len() / top_k,
        _ => return out,
    };
    // per node: last use (tick) of each cached (slot, expert); ticks in use order for eviction
    let mut last: Vec<BTreeMap<(usize, u16), u64>> = vec![BTreeMap::new(); caches.len()];
    let mut by_tick: Vec<BTreeMap<u64, (usize, u16)>> = vec![BTreeMap::new(); caches.len()];
    let mut tick = 0u64;
    for t in 0..tokens {
        for (slot, ids) in trace.iter().enumerate() {
            for &e in ids.get(t * top_k..(t + 1) * top_k).unwrap_or(&[]) {
                out.uses += 1;
                tick += 1;
                if resident
                    .get(slot)
                    .and_then(|r| r.get(e as usize))
                    .copied()
                    .unwrap_or(false)
                {
                    out.resident_hits += 1;
                    continue;
                }
                let node = holder
                    .and_then(|h| h.get(slot)?.get(e as usize).copied())
                    .unwrap_or(0);
                let (Some(last), Some(by_tick), Some(&cap)) =
                    (last.get_mut(node), by_tick.get_mut(node), caches.get(node))
                else {
                    continue;
                };
                let key = (slot, e);
                if let Some(old) = last.insert(key, tick) {
                    by_tick.remove(&old);
                    out.cache_hits += 1;
                }
                by_tick.insert(tick, key);
                while last.len() > cap {
                    let Some((_, k)) = by_tick.pop_first() else {
                        break;
                    };
                    last.remove(&k);
                }
            }
        }
    }
    out
}

/// `f(layer's placement, expert)` for every expert of every MoE layer, as `[slot][expert]`, slot
/// `s` being MoE layer `moe_layers[s]` (None where the placement does not list the layer).
fn per_expert<T>(
    placement: &Placement,
    moe_layers: &[usize],
    n_experts: usize,
    f: impl Fn(Option<&LayerPlacement>, usize) -> T,
) -> Vec<Vec<T>> {
    moe_layers
        .iter()
        .map(|&layer| {
            let l = placement.layer(layer);
            (0..n_experts).map(|x| f(l, x)).collect()
        })
        .collect()
}

/// Whether each expert is resident (on any node), as `[slot][expert]`.
pub fn resident_flags(
    placement: &Placement,
    moe_layers: &[usize],
    n_experts: usize,
) -> Vec<Vec<bool>> {
    per_expert(placement, moe_layers, n_experts, |l, x| {
        l.and_then(|l| l.resident.get(x))
            .is_some_and(|r| !r.is_empty())
    })
}

/// The node holding each expert, as `[slot][expert]` (its first replica; 0 where the placement
/// lists none).
pub fn holders(placement: &Placement, moe_layers: &[usize], n_experts: usize) -> Vec<Vec<usize>> {
    per_expert(placement, moe_layers, n_experts, |l, x| {
        l.and_then(|l| l.replicas.get(x)?.first().copied())
            .unwrap_or(0)
    })
}

/// One split of the budget, replayed.
#[derive(Clone, Debug)]
pub struct SplitRow {
    /// its place among the splits tried, by increasing resident share
    pub order: usize,
    pub resident_experts: usize,
    pub cache_experts: usize,
    pub replay: Replay,
}

/// The split to keep: the most uses in memory; on a tie, the larger resident share (a resident
/// expert is never read and is laid out for the kernels).
pub fn best(rows: &[SplitRow]) -> Option<&SplitRow> {
    let score = |r: &SplitRow| r.replay.resident_hits + r.replay.cache_hits;
    rows.iter()
        .max_by(|a, b| score(a).cmp(&score(b)).then(a.order.cmp(&b.order)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(slots: usize, experts: usize, on: &[(usize, usize)]) -> Vec<Vec<bool>> {
        let mut f = vec![vec![false; experts]; slots];
        for &(s, e) in on {
            f[s][e] = true;
        }
        f
    }

    #[test]
    fn replay_counts_resident_hits_cache_hits_and_evicts_the_least_recently_used() {
        // one slot, top-1: uses 0 1 2 0 3 1 with expert 2 resident and a cache of 2
        let trace = vec![vec![0u16, 1, 2, 0, 3, 1]];
        let r = replay(&trace, 1, &flags(1, 4, &[(0, 2)]), 2);
        assert_eq!(r.uses, 6);
        assert_eq!(r.resident_hits, 1);
        // 0 miss, 1 miss, 0 hit (cache 1 0), 3 miss evicts 1, 1 miss
        assert_eq!(r.cache_hits, 1);
        assert!((r.hit_rate() - 2.0 / 6.0).abs() < 1e-12);
        assert!((r.misses_per_token(6) - 4.0 / 6.0).abs() < 1e-12);
        // a cache of 3 keeps 1 too
        assert_eq!(replay(&trace, 1, &flags(1, 4, &[(0, 2)]), 3).cache_hits, 2);
        // no cache: only the resident expert hits
        assert_eq!(replay(&trace, 1, &flags(1, 4, &[]), 0).cache_hits, 0);
    }

    #[test]
    fn replay_walks_tokens_through_every_slot_before_the_next_token() {
        // two slots, top-2, a cache of 2: token 0 uses (0,0) (0,1) (1,0) (1,1); token 1 uses
        // (0,0) (0,1) again, which the 2-entry cache lost to slot 1's experts, and those evict
        // slot 1's before it comes round again
        let trace = vec![vec![0u16, 1, 0, 1], vec![0u16, 1, 1, 0]];
        let r = replay(&trace, 2, &flags(2, 2, &[]), 2);
        assert_eq!(r.uses, 8);
        assert_eq!(r.cache_hits, 0, "slot 0's experts were evicted by slot 1's");
        let r = replay(&trace, 2, &flags(2, 2, &[]), 4);
        assert_eq!(r.cache_hits, 4);
        // the same experts ids in different slots are different experts
        let r = replay(&trace, 2, &flags(2, 2, &[(0, 0), (0, 1)]), 2);
        assert_eq!((r.resident_hits, r.cache_hits), (4, 2));
    }

    #[test]
    fn replay_nodes_keeps_each_nodes_experts_in_its_own_cache() {
        // one slot, top-1: 0 1 0 1, expert 0 on node 0 and 1 on node 1, a cache of 1 each:
        // both come back; one node's cache of 1 loses each to the other
        let trace = vec![vec![0u16, 1, 0, 1]];
        let holder = vec![vec![0usize, 1]];
        let r = replay_nodes(&trace, 1, &flags(1, 2, &[]), Some(&holder), &[1, 1]);
        assert_eq!((r.uses, r.cache_hits), (4, 2));
        assert_eq!(replay(&trace, 1, &flags(1, 2, &[]), 1).cache_hits, 0);
        // a node without a cache finds nothing; resident experts hit wherever they are
        let r = replay_nodes(&trace, 1, &flags(1, 2, &[(0, 1)]), Some(&holder), &[0, 1]);
        assert_eq!((r.resident_hits, r.cache_hits), (2, 0));
    }

    #[test]
    fn best_takes_the_most_hits_and_on_a_tie_the_larger_resident_share() {
        let row = |order, hits| SplitRow {
            order,
            resident_experts: order,
            cache_experts: 8 - order,
            replay: Replay {
                uses: 100,
                resident_hits: hits,
                cache_hits: 0,
            },
        };
        let rows = [row(0, 90), row(4, 95), row(8, 95), row(2, 93)];
        assert_eq!(best(&rows).unwrap().order, 8);
        let rows = [row(0, 97), row(4, 95), row(8, 94)];
        assert_eq!(best(&rows).unwrap().order, 0);
        assert!(best(&[]).is_none());
    }
}
