//! Live rebalance: moves a running cluster from one placement to another without dropping a
//! request. Nodes first load what they newly own (`LoadExperts`, resident copies made before any
//! traffic reaches them); routing then switches atomically (the next layer call reads the new
//! placement — results are placement-independent, so the switch point never changes a bit);
//! finally nodes drop what they no longer own. A failed load (or a node found down) rolls back:
//! the experts nodes did not hold before are dropped again and routing stays on the old
//! placement; experts only upgraded to resident stay (still routed there, now hot: harmless). A
//! call that still reaches a node after it dropped an expert gets `NotFound` and is retried on a
//! current replica.

use std::collections::BTreeSet;
use std::time::Duration;

use nightshift_atlas_core::placement::{ModelShape, Placement};
use nightshift_proto::v1::{DropExpertsRequest, ExpertRef, LoadExpertsRequest};

use super::remote::{add_auth, lock, LinkState, RemoteExperts};

/// What a rebalance did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RebalanceReport {
    /// Experts loaded per node (name, count).
    pub loaded: Vec<(String, usize)>,
    /// Experts dropped per node (name, count).
    pub dropped: Vec<(String, usize)>,
}

/// Errors of a rebalance; the cluster keeps serving the old placement.
#[derive(Debug, thiserror::Error)]
pub enum RebalanceError {
    #[error("placement: {0}")]
    Placement(#[from] nightshift_atlas_core::placement::PlacementError),
    #[error(
        "the placement does not fit the running nodes (capacities they were started with): {0}"
    )]
    Capacity(nightshift_atlas_core::placement::PlacementError),
    #[error("the new placement must name the same nodes: expected {expected:?}, found {found:?}")]
    NodesChanged {
        expected: Vec<String>,
        found: Vec<String>,
    },
    #[error("node {node} is down, cannot rebalance (rolled back, routing stays on the old placement): {detail}")]
    NodeDown { node: String, detail: String },
    #[error("loading experts on {node} failed (rolled back, routing stays on the old placement): {reason}")]
    LoadFailed { node: String, reason: String },
}

type Key = (u32, u32, bool);

/// How long one node may take to load its share (resident copies of big experts take a while).
const LOAD_TIMEOUT: Duration = Duration::from_secs(600);
/// How long one node may take to drop experts (it waits for calls still using them).
const DROP_TIMEOUT: Duration = Duration::from_secs(60);

/// What one node has to do.
struct NodePlan {
    node: usize,
    /// Experts to load (new ones and resident upgrades).
    add: Vec<Key>,
    /// The part of `add` the node does not hold yet (dropped again on rollback).
    fresh: Vec<Key>,
    /// Experts the node no longer owns (dropped after the switch).
    gone: Vec<Key>,
}

fn held(p: &Placement, node: &str) -> Result<BTreeSet<Key>, RebalanceError> {
    Ok(p.experts_on(node)?
        .into_iter()
        .map(|s| (s.layer as u32, s.expert as u32, s.resident))
        .collect())
}

fn refs(keys: &[Key]) -> Vec<ExpertRef> {
    keys.iter()
        .map(|&(layer, expert, _)| ExpertRef { layer, expert })
        .collect()
}

impl RemoteExperts {
    /// Moves the cluster to `new` (validated against `shape`): load, switch, drop.
    pub fn rebalance(
        &self,
        new: Placement,
        shape: &ModelShape,
    ) -> Result<RebalanceReport, RebalanceError> {
        let mut new = new.resolve(shape)?;
        let old = self.placement();
        let expected: Vec<String> = old.nodes.iter().map(|n| n.name.clone()).collect();
        let found: Vec<String> = new.nodes.iter().map(|n| n.name.clone()).collect();
        if expected != found {
            return Err(RebalanceError::NodesChanged { expected, found });
        }
        // Addresses and capacities stay those of the running cluster (the nodes were started with
        // them); a posted file claiming more memory for a node does not make room on it.
        new.nodes = old.nodes.clone();
        new.validate(shape).map_err(RebalanceError::Capacity)?;
        let mut plans = Vec::new();
        for (i, link) in self.shared.nodes.iter().enumerate() {
            let before = held(&old, &link.name)?;
            let after = held(&new, &link.name)?;
            let had: BTreeSet<(u32, u32)> = before.iter().map(|&(l, e, _)| (l, e)).collect();
            let kept: BTreeSet<(u32, u32)> = after.iter().map(|&(l, e, _)| (l, e)).collect();
            // An expert becoming resident is a load (the node upgrades it in place).
            let add: Vec<Key> = after.difference(&before).copied().collect();
            // What the node did not hold at all: the only experts a rollback may drop (an
            // upgraded one is still routed to this node by the old placement).
            let fresh: Vec<Key> = add
                .iter()
                .filter(|(l, e, _)| !had.contains(&(*l, *e)))
                .copied()
                .collect();
            let gone: Vec<Key> = before
                .iter()
                .filter(|(l, e, _)| !kept.contains(&(*l, *e)))
                .copied()
                .collect();
            plans.push(NodePlan {
                node: i,
                add,
                fresh,
                gone,
            });
        }
        let client_of = |i: usize| -> Result<_, RebalanceError> {
            match &*lock(&self.shared.nodes[i].state) {
                LinkState::Up(c) => Ok(c.client.clone()),
                LinkState::Down { reason, .. } => Err(RebalanceError::NodeDown {
                    node: self.shared.nodes[i].name.clone(),
                    detail: reason.clone(),
                }),
            }
        };
        let token = self.shared.opts.auth_token.clone();
        // 1. Load everywhere; on the first failure drop what was freshly loaded (on the failing
        // node too: its resident half may have loaded before the rest failed) and stop.
        let mut fresh_done: Vec<(usize, Vec<Key>)> = Vec::new();
        let mut report = RebalanceReport::default();
        for plan in &plans {
            if plan.add.is_empty() {
                continue;
            }
            let i = plan.node;
            let name = self.shared.nodes[i].name.clone();
            let result = client_of(i).and_then(|mut client| {
                let tok = token.clone();
                let (hot, cold): (Vec<Key>, Vec<Key>) = plan.add.iter().partition(|k| k.2);
                self.block(async move {
                    for (keys, resident) in [(hot, true), (cold, false)] {
                        if keys.is_empty() {
                            continue;
                        }
                        let mut req = tonic::Request::new(LoadExpertsRequest {
                            experts: refs(&keys),
                            resident,
                        });
                        req.set_timeout(LOAD_TIMEOUT);
                        add_auth(&mut req, &tok)?;
                        client
                            .load_experts(req)
                            .await
                            .map_err(|e| e.message().to_string())?;
                    }
                    Ok::<(), String>(())
                })
                .unwrap_or_else(|| Err("client runtime stopped".into()))
                .map_err(|reason| RebalanceError::LoadFailed {
                    node: name.clone(),
                    reason,
                })
            });
            fresh_done.push((i, plan.fresh.clone()));
            match result {
                Ok(()) => report.loaded.push((name, plan.add.len())),
                Err(e) => {
                    tracing::warn!("rebalance failed, rolling back: {e}");
                    self.drop_on(&fresh_done, &token);
                    return Err(e);
                }
            }
        }
        // 2. Switch routing.
        self.swap_placement(new);
        tracing::info!("placement switched");
        // 3. Drop what nodes no longer own (after in-flight calls on the old routing finish:
        // the node's store waits for them, and late calls are retried on current replicas).
        let drops: Vec<(usize, Vec<Key>)> = plans
            .into_iter()
            .filter(|p| !p.gone.is_empty())
            .map(|p| (p.node, p.gone))
            .collect();
        for (i, gone) in &drops {
            report
                .dropped
                .push((self.shared.nodes[*i].name.clone(), gone.len()));
        }
        self.drop_on(&drops, &token);
        Ok(report)
    }

    /// Best-effort `DropExperts` on each node (failures are logged: dropping is an optimisation).
    fn drop_on(&self, what: &[(usize, Vec<Key>)], token: &Option<String>) {
        for (i, keys) in what {
            let link = &self.shared.nodes[*i];
            let client = match &*lock(&link.state) {
                LinkState::Up(c) => c.client.clone(),
                LinkState::Down { .. } => continue,
            };
            let mut client = client;
            if keys.is_empty() {
                continue;
            }
            let mut req = tonic::Request::new(DropExpertsRequest {
                experts: refs(keys),
            });
            req.set_timeout(DROP_TIMEOUT);
            if add_auth(&mut req, token).is_err() {
                continue;
            }
            match self.block(async move { client.drop_experts(req).await }) {
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!(node = %link.name, "dropping experts failed: {}", e.message())
                }
                None => {
                    tracing::warn!(node = %link.name, "dropping experts failed: client runtime stopped")
                }
            }
        }
    }
}
