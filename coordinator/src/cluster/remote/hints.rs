//! Prefetch hints to expert nodes: at a decode step's layer call the remote backend runs the
//! next MoE layer's router on the call's rows (`nightshift_model::prefetch::NextLayer`, the
//! in-process prefetch's own prediction) and tells every node that reported a staging cache
//! (`InfoResponse.cold_cache_bytes`) which of the predicted experts it should read, so it reads
//! the cold ones ahead while this layer and the next one's attention run. An expert held by
//! several nodes is hinted to one of them ([`targets`]: the ordinary split's choice).
//!
//! A hint rides with the node's first request of the call ([`Hints::attach`]: the
//! `ComputeRequest.prefetch` field over the stream, the region's hint over shared memory); a
//! node with no share in the call gets it alone on its stream ([`Hints::send_rest`]), a request
//! without pairs that the node does not answer. Nothing waits for a hint and none is retried:
//! a hint lost (a full stream, a node down) only costs the read it would have saved. Hints never
//! change outputs: a node computes the same bytes from wherever it read them.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use nightshift_atlas_core::placement::{NodeId, Placement};
use nightshift_model::{ActRows, ExpertPair};
use nightshift_proto::v1::{ComputeRequest, PrefetchHint};

use super::call::Share;
use super::{balance, lock, LinkState, Shared};

/// Which node is hinted each of `predicted` (experts of MoE layer `layer`), per node: **one
/// replica per expert**, the one the ordinary split (`balance::plan`) would give it were the
/// next call to route each predicted expert one row with nothing else in flight, among the
/// replicas taking hints (`takers`). Hinting every replica made each of them read the expert,
/// and all but the one computing it read it for nothing. The split's choice is what an
/// ordinary call of these experts does; a shared call (claim board) follows it, as it leaves
/// each hinted expert's group to the node hinted ([`take_targets`]); it spreads the reads evenly over
/// the replicas, and it is deterministic (ties by expert id and to the placement's earlier
/// replica). Experts no taker holds are hinted to nobody.
fn targets(
    placement: &Placement,
    layer: usize,
    predicted: &[u32],
    takers: &[bool],
) -> Vec<Option<Vec<u32>>> {
    let mut per_node: Vec<Option<Vec<u32>>> = vec![None; takers.len()];
    let replicas = |e: u32| placement.replicas(layer, e as usize);
    let pairs: Vec<ExpertPair> = predicted
        .iter()
        .filter(|&&e| replicas(e).iter().any(|&n| takers.get(n) == Some(&true)))
        .map(|&e| ExpertPair { expert: e, row: 0 })
        .collect();
    let todo: Vec<usize> = (0..pairs.len()).collect();
    // every expert kept has a taker replica, so the plan cannot fail
    if let Ok(shares) = balance::plan(&pairs, &todo, replicas, takers, &[], &HashMap::new()) {
        for sh in shares {
            let experts = sh.pair_idx.iter().map(|&i| pairs[i].expert).collect();
            per_node[sh.node] = Some(experts);
        }
    }
    per_node
}

/// The node each expert of `layer` was hinted to by the last hints for `layer`, taken (a call
/// uses them once: a later call of the layer, a prefill chunk say, was not predicted). A shared
/// call leaves those experts' groups to those nodes (`shared_call`), so the node that read an
/// expert ahead is the one computing it. Outputs do not depend on who computes a group.
pub(super) fn take_targets(s: &Shared, layer: usize) -> HashMap<u32, NodeId> {
    lock(&s.hinted).remove(&(layer as u32)).unwrap_or_default()
}

/// One layer call's hints, per node (None: nothing for that node, or already sent).
pub(super) struct Hints {
    layer: u32,
    per_node: Vec<Option<Vec<u32>>>,
}

impl Hints {
    /// The hints of a call of `layer` with rows `acts`: None when no node takes hints, the
    /// backend has no predictor, the call is not predicted (a prefill chunk, the last MoE
    /// layer) or the prediction fails (logged; the call goes on without hints).
    pub(super) fn predict(
        s: &Shared,
        placement: &Placement,
        layer: usize,
        acts: &ActRows,
    ) -> Option<Hints> {
        let predictor = s.predictor.get()?;
        let takers: Vec<bool> = s
            .nodes
            .iter()
            .map(|n| {
                n.takes_hints.load(Ordering::Relaxed)
                    && matches!(&*lock(&n.state), LinkState::Up(_))
            })
            .collect();
        if !takers.contains(&true) {
            return None;
        }
        let (next, predicted) = match predictor.predict(layer, acts) {
            Ok(Some(p)) => p,
            Ok(None) => return None,
            Err(e) => {
                tracing::debug!(layer, "no prefetch hints for this call: {e}");
                return None;
            }
        };
        let per_node = targets(placement, next, &predicted, &takers);
        let owners = per_node
            .iter()
            .enumerate()
            .flat_map(|(n, es)| es.iter().flatten().map(move |&e| (e, n)))
            .collect();
        // kept per layer: this call's own layer keeps the targets the call before it set
        lock(&s.hinted).insert(next as u32, owners);
        Some(Hints {
            layer: next as u32,
            per_node,
        })
    }

    /// Takes node `node`'s hint (once), to ride with its request.
    pub(super) fn take(&mut self, s: &Shared, node: usize) -> Option<PrefetchHint> {
        let experts = self.per_node.get_mut(node)?.take()?;
        let mut st = lock(&s.stats);
        st.hints += 1;
        st.hint_experts += experts.len() as u64;
        Some(PrefetchHint {
            layer: self.layer,
            experts,
        })
    }

    /// Gives each share's node its hint, to ride with the share's request.
    pub(super) fn attach(&mut self, s: &Shared, shares: &mut [Share]) {
        for sh in shares {
            sh.hint = self.take(s, sh.node);
        }
    }

    /// Puts back the hint of a share that was not sent (its node gets it alone).
    pub(super) fn restore(&mut self, s: &Shared, share: &mut Share) {
        if let Some(h) = share.hint.take() {
            if let Some(slot) = self.per_node.get_mut(share.node) {
                let mut st = lock(&s.stats);
                st.hints = st.hints.saturating_sub(1);
                st.hint_experts = st.hint_experts.saturating_sub(h.experts.len() as u64);
                *slot = Some(h.experts);
            }
        }
    }

    /// Sends the hints no share carried, each alone on its node's stream, without waiting (a
    /// full stream drops it).
    pub(super) fn send_rest(&mut self, s: &Shared, acts: &ActRows) {
        for node in 0..self.per_node.len() {
            if self.per_node[node].is_none() {
                continue;
            }
            let tx = match &*lock(&s.nodes[node].state) {
                LinkState::Up(c) => c.tx.clone(),
                LinkState::Down { .. } => continue,
            };
            let Some(hint) = self.take(s, node) else {
                continue;
            };
            let req = ComputeRequest {
                request_id: s.next_id.fetch_add(1, Ordering::Relaxed),
                step_id: 0,
                layer: hint.layer,
                act_type: acts.ty.id(),
                n_rows: 0,
                n_embd: s.n_embd as u32,
                acts: Vec::new(),
                experts: Vec::new(),
                rows: Vec::new(),
                prefetch: Some(hint),
                parts: false,
            };
            if tx.try_send(req).is_err() {
                tracing::debug!(node = %s.nodes[node].name, "prefetch hint dropped: the stream is full");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use nightshift_atlas_core::placement::{LayerPlacement, NodeSpec, Placement};

    use super::targets;

    /// Two MoE layers of 8 experts; expert e of a layer on the nodes `homes(e)`.
    fn placement(n: usize, homes: impl Fn(usize) -> Vec<usize>) -> Placement {
        let layers = [1usize, 3]
            .iter()
            .map(|&index| {
                let replicas: Vec<Vec<usize>> = (0..8).map(&homes).collect();
                LayerPlacement {
                    index,
                    resident: replicas.clone(),
                    replicas,
                }
            })
            .collect();
        let nodes = (0..n)
            .map(|i| NodeSpec::named(format!("node{i}")))
            .collect();
        Placement::from_layers(nodes, layers).expect("placement")
    }

    #[test]
    fn each_predicted_expert_is_hinted_to_one_replica_spread_over_the_takers() {
        let everywhere = placement(3, |_| vec![0, 1, 2]);
        let predicted = [0, 2, 3, 5, 6, 7];
        let per = targets(&everywhere, 3, &predicted, &[true; 3]);
        let mut seen: Vec<u32> = per.iter().flatten().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, predicted, "every expert once: {per:?}");
        let counts: Vec<usize> = per.iter().map(|p| p.as_ref().map_or(0, Vec::len)).collect();
        assert_eq!(counts, [2, 2, 2], "{per:?}");
        // the same prediction gives the same targets
        assert_eq!(per, targets(&everywhere, 3, &predicted, &[true; 3]));

        // only nodes taking hints are hinted; an expert no taker holds goes to nobody
        let split = placement(3, |e| if e < 4 { vec![0, 1] } else { vec![2] });
        let per = targets(&split, 1, &predicted, &[true, false, false]);
        assert_eq!(per, vec![Some(vec![0, 2, 3]), None, None]);
    }
}
