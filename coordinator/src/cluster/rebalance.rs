//! Live rebalance: moves a running cluster from one placement to another without dropping a
//! request. Nodes first load what they newly own (`LoadExperts`, resident copies made before any
//! traffic reaches them); routing then switches atomically (the next layer call reads the new
//! placement — results are placement-independent, so the switch point never changes a bit);
//! finally nodes drop what they no longer own. A failed load rolls back: what was loaded is
//! dropped again and routing stays on the old placement. A call that still reaches a node after
//! it dropped an expert gets `NotFound` and is retried on a current replica.

use std::collections::BTreeSet;
use std::time::Duration;

use nightshift_atlas::placement::{ModelShape, Placement};
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
    Placement(#[from] nightshift_atlas::placement::PlacementError),
    #[error("the new placement must name the same nodes: expected {expected:?}, found {found:?}")]
    NodesChanged {
        expected: Vec<String>,
        found: Vec<String>,
    },
    #[error("node {node} is down, cannot rebalance: {detail}")]
    NodeDown { node: String, detail: String },
    #[error("loading experts on {node} failed (rolled back): {reason}")]
    LoadFailed { node: String, reason: String },
}

type Key = (u32, u32, bool);

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
        // Addresses stay those the coordinator dials.
        new.nodes = old.nodes.clone();
        let mut plans = Vec::new();
        for (i, link) in self.shared.nodes.iter().enumerate() {
            let before = held(&old, &link.name)?;
            let after = held(&new, &link.name)?;
            // An expert becoming resident is a load (the node upgrades it in place).
            let add: Vec<Key> = after.difference(&before).copied().collect();
            let kept: BTreeSet<(u32, u32)> = after.iter().map(|&(l, e, _)| (l, e)).collect();
            let gone: Vec<Key> = before
                .iter()
                .filter(|(l, e, _)| !kept.contains(&(*l, *e)))
                .copied()
                .collect();
            plans.push((i, add, gone));
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
        let timeout = Duration::from_secs(600);
        // 1. Load everywhere; roll back on the first failure.
        let mut done: Vec<(usize, Vec<Key>)> = Vec::new();
        let mut report = RebalanceReport::default();
        for (i, add, _) in &plans {
            if add.is_empty() {
                continue;
            }
            let name = self.shared.nodes[*i].name.clone();
            let result = client_of(*i).and_then(|mut client| {
                let tok = token.clone();
                let (hot, cold): (Vec<Key>, Vec<Key>) = add.iter().partition(|k| k.2);
                self.block(async move {
                    for (keys, resident) in [(hot, true), (cold, false)] {
                        if keys.is_empty() {
                            continue;
                        }
                        let mut req = tonic::Request::new(LoadExpertsRequest {
                            experts: refs(&keys),
                            resident,
                        });
                        req.set_timeout(timeout);
                        add_auth(&mut req, &tok).map_err(|r| (String::new(), r))?;
                        client
                            .load_experts(req)
                            .await
                            .map_err(|e| (String::new(), e.message().to_string()))?;
                    }
                    Ok::<(), (String, String)>(())
                })
                .unwrap_or_else(|| Err((String::new(), "client runtime stopped".into())))
                .map_err(|(_, reason)| RebalanceError::LoadFailed {
                    node: name.clone(),
                    reason,
                })
            });
            match result {
                Ok(()) => {
                    done.push((*i, add.clone()));
                    report.loaded.push((name, add.len()));
                }
                Err(e) => {
                    self.drop_on(&done, &token);
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
            .filter(|p| !p.2.is_empty())
            .map(|(i, _, gone)| (i, gone))
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
            let mut req = tonic::Request::new(DropExpertsRequest {
                experts: refs(keys),
            });
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
