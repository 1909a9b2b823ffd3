//! Prefetch hints to expert nodes: at a decode step's layer call the remote backend runs the
//! next MoE layer's router on the call's rows (`nightshift_model::prefetch::NextLayer`, the
//! in-process prefetch's own prediction) and tells every node that reported a staging cache
//! (`InfoResponse.cold_cache_bytes`) which of the predicted experts it holds, so it reads the
//! cold ones ahead while this layer and the next one's attention run.
//!
//! A hint rides with the node's first request of the call ([`Hints::attach`]: the
//! `ComputeRequest.prefetch` field over the stream, the region's hint over shared memory); a
//! node with no share in the call gets it alone on its stream ([`Hints::send_rest`]), a request
//! without pairs that the node does not answer. Nothing waits for a hint and none is retried:
//! a hint lost (a full stream, a node down) only costs the read it would have saved. Hints never
//! change outputs: a node computes the same bytes from wherever it read them.

use std::sync::atomic::Ordering;

use nightshift_atlas_core::placement::Placement;
use nightshift_model::ActRows;
use nightshift_proto::v1::{ComputeRequest, PrefetchHint};

use super::call::Share;
use super::{lock, LinkState, Shared};

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
        let mut per_node: Vec<Option<Vec<u32>>> = vec![None; s.nodes.len()];
        for &e in &predicted {
            for &n in placement.replicas(next, e as usize) {
                if takers.get(n) == Some(&true) {
                    per_node[n].get_or_insert_with(Vec::new).push(e);
                }
            }
        }
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
            };
            if tx.try_send(req).is_err() {
                tracing::debug!(node = %s.nodes[node].name, "prefetch hint dropped: the stream is full");
            }
        }
    }
}
