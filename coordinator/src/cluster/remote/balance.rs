//! The replica choice of one layer call, free of sockets so it can be tested on its own. With a
//! replicated placement a layer call takes as long as its slowest node's share, and shares are
//! uneven in rows rather than in experts (an expert routed 3 rows costs about 3x one routed 1 row
//! at decode), so the choice balances estimated work: each expert costs `1 + rows`, experts are
//! placed longest first (LPT, ties by expert id: deterministic), each on the live, non-excluded
//! replica with the least (work already in flight there + work given to it in this call). All
//! rows of one expert go to one node, so they form one GEMM there. Results never depend on the
//! choice: outputs come back per pair and the engine sums them in top-k order.

use std::collections::{BTreeMap, HashMap};

use nightshift_atlas_core::placement::NodeId;
use nightshift_model::ExpertPair;

/// Estimated node work of one expert routed `rows` rows in a call, in abstract units. At decode
/// batch sizes an expert's time on a node grows about linearly with its rows (issue 4: an expert
/// routed 3 rows costs ~3x one routed 1 row), on top of a fixed part per expert (its slice of the
/// request, the hand-off to the node's pool, touching its weights) taken as one row's worth:
/// cost = 1 + rows. Integer units keep the choice exact and identical on every run.
pub fn expert_cost(rows: usize) -> usize {
    1 + rows
}

/// One node's share of a call as chosen by [`plan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub node: NodeId,
    /// Indices into the call's `pairs`, ascending (the order of `todo`).
    pub pair_idx: Vec<usize>,
    /// Sum of [`expert_cost`] of the experts given to this node.
    pub cost: usize,
}

/// An expert none of whose replicas is both up and not excluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoLiveReplica {
    pub expert: u32,
}

/// Assigns the pairs `todo` (indices into `pairs`) to nodes. `replicas(e)` lists the nodes
/// holding expert `e` (in preference order: ties in load go to the earlier one), `up[n]` says
/// whether node `n` is connected, `bias[n]` is the work already in flight on node `n` (same
/// units as [`expert_cost`]; missing entries count as 0) and `exclude[e]` the nodes that already
/// failed expert `e` in this call. Returns the shares by ascending node id, or the first
/// expert (in LPT order) with no usable replica.
pub fn plan<'a, F>(
    pairs: &[ExpertPair],
    todo: &[usize],
    replicas: F,
    up: &[bool],
    bias: &[usize],
    exclude: &HashMap<u32, Vec<NodeId>>,
) -> Result<Vec<Planned>, NoLiveReplica>
where
    F: Fn(u32) -> &'a [NodeId],
{
    let mut rows_of: BTreeMap<u32, usize> = BTreeMap::new();
    for &pi in todo {
        *rows_of.entry(pairs[pi].expert).or_default() += 1;
    }
    // Longest first; the BTreeMap already orders by expert id and the sort is stable.
    let mut order: Vec<(u32, usize)> = rows_of
        .into_iter()
        .map(|(e, r)| (e, expert_cost(r)))
        .collect();
    order.sort_by_key(|&(_, cost)| std::cmp::Reverse(cost));
    let mut load: Vec<usize> = (0..up.len())
        .map(|n| bias.get(n).copied().unwrap_or(0))
        .collect();
    let mut given = vec![0usize; up.len()];
    let mut chosen: HashMap<u32, NodeId> = HashMap::with_capacity(order.len());
    for (e, cost) in order {
        let excluded = exclude.get(&e);
        let best = replicas(e)
            .iter()
            .copied()
            .filter(|&n| n < up.len() && up[n] && !excluded.is_some_and(|x| x.contains(&n)))
            .min_by_key(|&n| load[n]);
        let Some(n) = best else {
            return Err(NoLiveReplica { expert: e });
        };
        load[n] += cost;
        given[n] += cost;
        chosen.insert(e, n);
    }
    let mut by_node: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
    for &pi in todo {
        // Every expert of `todo` was chosen above (or we returned).
        if let Some(&n) = chosen.get(&pairs[pi].expert) {
            by_node.entry(n).or_default().push(pi);
        }
    }
    Ok(by_node
        .into_iter()
        .map(|(node, pair_idx)| Planned {
            node,
            pair_idx,
            cost: given[node],
        })
        .collect())
}
