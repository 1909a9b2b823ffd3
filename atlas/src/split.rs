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
    // per node: last use (tick) of each cached (slot, expert); ticks in use order for eviction
    let mut last: Vec<BTreeMap<(usize, u16), u64>> = vec![BTreeMap::new(); caches.len()];
    let mut by_tick: Vec<BTreeMap<u64, (usize, u16)>> = vec![BTreeMap::new(); caches.len()];
    for (tick, (slot, e)) in uses_in_order(trace, top_k).into_iter().enumerate() {
        let tick = tick as u64;
        out.uses += 1;
        if resident
            .get(slot)
            .and_then(|r| r.get(e as usize))
            .copied()
            .unwrap_or(false)
        {
            out.resident_hits += 1;
            continue;
        }
        let node = node_of(holder, slot, e);
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
    out
}

/// The node holding expert `e` of `slot` (`None`: every expert on node 0).
fn node_of(holder: Option<&[Vec<usize>]>, slot: usize, e: u16) -> usize {
    holder
        .and_then(|h| h.get(slot)?.get(e as usize).copied())
        .unwrap_or(0)
}

/// The uses of `trace` in the order a decode step runs them: token by token, each token through
/// every slot, `top_k` experts each, as `(slot, expert)`.
fn uses_in_order(trace: &[Vec<u16>], top_k: usize) -> Vec<(usize, u16)> {
    let tokens = match trace.first() {
        Some(t) if top_k > 0 => t.len() / top_k,
        _ => return Vec::new(),
    };
    let mut uses = Vec::with_capacity(tokens * top_k * trace.len());
    for t in 0..tokens {
        for (slot, ids) in trace.iter().enumerate() {
            let ids = ids.get(t * top_k..(t + 1) * top_k).unwrap_or(&[]);
            uses.extend(ids.iter().map(|&e| (slot, e)));
        }
    }
    uses
}

/// [`replay_nodes`] with no resident set and, on each node, the offline optimum in place of the
/// least-recently-used cache: each node's memory starts with the experts it is asked for first
/// (as a resident set is loaded before the trace), and a miss with the memory full evicts the
/// expert whose next use is furthest ahead (or never comes; Belady's rule, the missed expert
/// itself included). No policy that keeps whole experts in the same memory, resident or
/// cached, finds more of the trace's uses in memory; it knows the future, so it is a bound to
/// hold a split against, not a policy to run. All hits count as cache hits.
pub fn oracle_nodes(
    trace: &[Vec<u16>],
    top_k: usize,
    holder: Option<&[Vec<usize>]>,
    caches: &[usize],
) -> Replay {
    use std::collections::{BTreeSet, HashMap};
    let uses = uses_in_order(trace, top_k);
    // next[i]: the index of the next use of uses[i]'s expert (usize::MAX: none)
    let mut next = vec![usize::MAX; uses.len()];
    let mut later: HashMap<(usize, u16), usize> = HashMap::new();
    for (i, u) in uses.iter().enumerate().rev() {
        if let Some(j) = later.insert(*u, i) {
            next[i] = j;
        }
    }
    let mut out = Replay {
        uses: uses.len() as u64,
        resident_hits: 0,
        cache_hits: 0,
    };
    // per node: each cached expert's next use, and the same pairs ordered by next use
    let mut held: Vec<HashMap<(usize, u16), usize>> = vec![HashMap::new(); caches.len()];
    let mut by_next: Vec<BTreeSet<(usize, (usize, u16))>> = vec![BTreeSet::new(); caches.len()];
    // Loaded before the trace, as a resident set is: the experts used first, up to each node's
    // memory (the best start: any other expert is needed no sooner than one of these).
    for (i, &(slot, e)) in uses.iter().enumerate() {
        let node = node_of(holder, slot, e);
        if let (Some(held), Some(by_next), Some(&cap)) =
            (held.get_mut(node), by_next.get_mut(node), caches.get(node))
        {
            if held.len() < cap && !held.contains_key(&(slot, e)) {
                held.insert((slot, e), i);
                by_next.insert((i, (slot, e)));
            }
        }
    }
    for (i, &(slot, e)) in uses.iter().enumerate() {
        let node = node_of(holder, slot, e);
        let (Some(held), Some(by_next), Some(&cap)) =
            (held.get_mut(node), by_next.get_mut(node), caches.get(node))
        else {
            continue;
        };
        let key = (slot, e);
        if let Some(old) = held.insert(key, next[i]) {
            by_next.remove(&(old, key));
            out.cache_hits += 1;
        }
        by_next.insert((next[i], key));
        while held.len() > cap {
            let Some((_, k)) = by_next.pop_last() else {
                break;
            };
            held.remove(&k);
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
    fn the_oracle_evicts_the_expert_used_furthest_ahead() {
        // one slot, top-1, a memory of 2: 0 1 2 0 1 2. The LRU loses every use; the oracle
        // starts with 0 and 1 (found), drops 1 for 2 (0 comes back first), finds 0, drops 0
        // (never used again) for 1, finds 2
        let trace = vec![vec![0u16, 1, 2, 0, 1, 2]];
        assert_eq!(replay(&trace, 1, &flags(1, 3, &[]), 2).cache_hits, 0);
        let r = oracle_nodes(&trace, 1, None, &[2]);
        assert_eq!((r.uses, r.resident_hits, r.cache_hits), (6, 0, 4));
        // a miss it would only evict a sooner-used expert for is not kept: 0 1 2 0 1 with a
        // memory of 2 keeps 0 and 1 past 2
        let trace = vec![vec![0u16, 1, 2, 0, 1]];
        assert_eq!(oracle_nodes(&trace, 1, None, &[2]).cache_hits, 4);
        // each node keeps its own experts: 0 1 0 1 with one expert per node and a memory of 1
        let trace = vec![vec![0u16, 1, 0, 1]];
        let holder = vec![vec![0usize, 1]];
        assert_eq!(
            oracle_nodes(&trace, 1, Some(&holder), &[1, 1]).cache_hits,
            4
        );
        assert_eq!(
            oracle_nodes(&trace, 1, Some(&holder), &[1, 0]).cache_hits,
            2
        );
        // no memory finds nothing
        assert_eq!(oracle_nodes(&trace, 1, None, &[0]).cache_hits, 0);
    }

    proptest::proptest! {
        /// No split of the same memory into a resident set and an LRU finds more uses in
        /// memory than the oracle, whatever the trace, and the oracle misses at least the
        /// distinct experts its memory cannot hold.
        #[test]
        fn no_split_beats_the_oracle(
            ids in proptest::collection::vec(0u16..12, 2..240),
            memory in 0usize..10,
            resident_bits in 0u32..(1 << 24),
        ) {
            // two slots, top-2, tokens of 2 uses per slot
            let tokens = ids.len() / 4;
            let trace: Vec<Vec<u16>> = (0..2)
                .map(|s| (0..tokens).flat_map(|t| ids[4 * t + 2 * s..][..2].to_vec()).collect())
                .collect();
            // the experts whose bit is set (bit 12 s + e of two slots' 12), at most `memory`
            let mut resident = vec![vec![false; 12]; 2];
            let mut held = 0;
            for b in (0..24).filter(|b| resident_bits >> b & 1 == 1) {
                if held < memory {
                    resident[b / 12][b % 12] = true;
                    held += 1;
                }
            }
            let lru = replay(&trace, 2, &resident, memory.saturating_sub(held));
            let oracle = oracle_nodes(&trace, 2, None, &[memory]);
            proptest::prop_assert_eq!(oracle.uses, lru.uses);
            proptest::prop_assert!(
                oracle.cache_hits >= lru.resident_hits + lru.cache_hits,
                "oracle {} < split {} + {}", oracle.cache_hits, lru.resident_hits, lru.cache_hits
            );
            let distinct: std::collections::HashSet<_> = uses_in_order(&trace, 2).into_iter().collect();
            let first_misses = distinct.len().saturating_sub(memory) as u64;
            proptest::prop_assert!(oracle.cache_hits <= oracle.uses - first_misses);
        }
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
