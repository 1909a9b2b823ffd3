//! The placement: which nodes hold which expert of which MoE layer, and which of those copies are
//! resident (hot, copied to RAM) rather than mmap'd. This is the contract shared by the
//! coordinator (routing), the expert node (what to load) and the planner (what to write); the
//! TOML file format is documented in `file.rs` and in `notes/cluster-api.md`. A placement read
//! from a file is untrusted: parsing checks its structure (names, duplicates, lengths) and
//! `validate` checks it against the model's shape and the nodes' memory capacity.

mod error;
mod file;
#[cfg(test)]
mod tests;

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use error::PlacementError;

/// Index of a node in `Placement::nodes`.
pub type NodeId = usize;

/// Largest layer index a placement or atlas may name (lookups are tables indexed by layer).
pub const MAX_LAYER_INDEX: usize = 1 << 16;

/// The only placement file version this crate reads and writes.
pub const PLACEMENT_VERSION: u32 = 1;

/// One expert node as the placement file (and the planner's `NODES.toml`) describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    /// Unique name (`--node NAME` of `nightshift-expert-node`).
    pub name: String,
    /// `host:port` the coordinator dials; `None` for nodes the coordinator spawns itself.
    pub addr: Option<String>,
    /// NUMA node to pin the node's threads and memory to.
    pub numa: Option<u32>,
    /// Capacity for resident expert weights in bytes; 0 = unlimited.
    pub memory_bytes: u64,
    /// Cores the node may use (informational for the planner); `None` = unknown.
    pub cores: Option<u32>,
}

impl NodeSpec {
    /// A node with only a name (no address, no NUMA pinning, unlimited memory).
    pub fn named(name: impl Into<String>) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            addr: None,
            numa: None,
            memory_bytes: 0,
            cores: None,
        }
    }
}

/// What the placement must cover: the MoE layer indices (dense leading layers have none), the
/// experts per MoE layer and the bytes of one expert's weights (gate + up + down, as stored).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelShape {
    pub moe_layers: Vec<usize>,
    pub n_experts: usize,
    pub expert_bytes: u64,
}

impl ModelShape {
    /// Position of `layer` in `moe_layers`, or `None` if it is not a MoE layer.
    pub fn slot(&self, layer: usize) -> Option<usize> {
        self.moe_layers.iter().position(|&l| l == layer)
    }
}

/// How the file described the experts' homes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// No `[[layer]]` tables: expert `e` of every MoE layer lives on node `e % N`, resident.
    RoundRobin,
    /// One `[[layer]]` table per MoE layer.
    Explicit,
}

/// The homes of the experts of one MoE layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerPlacement {
    /// Layer index in the model (not the position among MoE layers).
    pub index: usize,
    /// `replicas[e]` = nodes holding expert `e`, in preference order, no node twice.
    pub replicas: Vec<Vec<NodeId>>,
    /// `resident[e]` ⊆ `replicas[e]`: the copies kept hot in RAM; the others are mmap'd.
    pub resident: Vec<Vec<NodeId>>,
}

/// One expert a node must serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertSlot {
    pub layer: usize,
    pub expert: usize,
    pub resident: bool,
}

/// A parsed (structurally checked) placement. Use `validate` (or `resolve`) against the model's
/// shape before serving from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub version: u32,
    pub nodes: Vec<NodeSpec>,
    strategy: Strategy,
    /// Explicit layers, sorted by index. Empty for an unresolved round-robin placement.
    layers: Vec<LayerPlacement>,
    /// `by_layer[layer]` = position in `layers`.
    by_layer: Vec<Option<usize>>,
    /// `0..nodes.len()`, so that round-robin lookups can hand out a one-element slice.
    ids: Vec<NodeId>,
}

impl Placement {
    /// Builds a placement from already-checked parts; `layers` may be in any order.
    fn assemble(
        nodes: Vec<NodeSpec>,
        strategy: Strategy,
        mut layers: Vec<LayerPlacement>,
    ) -> Placement {
        layers.sort_by_key(|l| l.index);
        let max = layers.iter().map(|l| l.index + 1).max().unwrap_or(0);
        let mut by_layer = vec![None; max];
        for (pos, l) in layers.iter().enumerate() {
            by_layer[l.index] = Some(pos);
        }
        let ids = (0..nodes.len()).collect();
        Placement {
            version: PLACEMENT_VERSION,
            nodes,
            strategy,
            layers,
            by_layer,
            ids,
        }
    }

    /// An explicit placement. Checks the same structural rules as the file parser (nodes
    /// unique, replica ids in range and not repeated, resident ⊆ replicas, every expert placed).
    pub fn from_layers(
        nodes: Vec<NodeSpec>,
        layers: Vec<LayerPlacement>,
    ) -> Result<Placement, PlacementError> {
        file::check_nodes(&nodes)?;
        let mut seen = std::collections::BTreeSet::new();
        for l in &layers {
            if l.index > MAX_LAYER_INDEX {
                return Err(PlacementError::LayerIndex {
                    index: l.index,
                    max: MAX_LAYER_INDEX,
                    line: None,
                });
            }
            if !seen.insert(l.index) {
                return Err(PlacementError::DuplicateLayer {
                    index: l.index,
                    line: None,
                });
            }
            file::check_layer(l, nodes.len())?;
        }
        Ok(Placement::assemble(nodes, Strategy::Explicit, layers))
    }

    /// Expert `e` of every MoE layer on node `e % nodes.len()`, every copy resident.
    /// Layer indices above `MAX_LAYER_INDEX` are skipped (`validate` then reports them missing).
    pub fn round_robin(nodes: Vec<NodeSpec>, moe_layers: &[usize], n_experts: usize) -> Placement {
        let n = nodes.len().max(1);
        let layers = moe_layers
            .iter()
            .filter(|&&index| index <= MAX_LAYER_INDEX)
            .map(|&index| {
                let replicas: Vec<Vec<NodeId>> = (0..n_experts).map(|e| vec![e % n]).collect();
                LayerPlacement {
                    index,
                    resident: replicas.clone(),
                    replicas,
                }
            })
            .collect();
        Placement::assemble(nodes, Strategy::RoundRobin, layers)
    }

    /// Parses a `NODES.toml` (only `[[node]]` tables), with the same checks as placement nodes.
    pub fn nodes_from_toml_str(s: &str) -> Result<Vec<NodeSpec>, PlacementError> {
        file::parse_nodes(s)
    }

    pub fn from_toml_str(s: &str) -> Result<Placement, PlacementError> {
        file::parse(s)
    }

    pub fn load(path: &Path) -> Result<Placement, PlacementError> {
        let text = std::fs::read_to_string(path).map_err(|source| PlacementError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Placement::from_toml_str(&text)
    }

    /// The file text; round-robin placements are written without `[[layer]]` tables.
    pub fn to_toml_string(&self) -> String {
        file::render(self)
    }

    /// Writes the file to a temporary sibling and renames it over `path`, so readers see either
    /// the old or the new placement, never half of one.
    pub fn save_atomic(&self, path: &Path) -> Result<(), PlacementError> {
        crate::fsutil::write_atomic(path, self.to_toml_string().as_bytes()).map_err(|source| {
            PlacementError::Io {
                path: path.to_path_buf(),
                source,
            }
        })
    }

    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The explicit layer tables (empty for a round-robin placement not yet resolved).
    pub fn layers(&self) -> &[LayerPlacement] {
        &self.layers
    }

    pub fn layer(&self, layer: usize) -> Option<&LayerPlacement> {
        self.by_layer
            .get(layer)
            .copied()
            .flatten()
            .map(|p| &self.layers[p])
    }

    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Nodes holding `expert` of `layer`, in preference order. Round-robin placements answer for
    /// any layer; explicit ones answer `&[]` for a layer or expert they do not list.
    pub fn replicas(&self, layer: usize, expert: usize) -> &[NodeId] {
        if self.strategy == Strategy::RoundRobin && self.layers.is_empty() {
            if self.ids.is_empty() {
                return &[];
            }
            let n = expert % self.ids.len();
            return &self.ids[n..n + 1];
        }
        self.layer(layer)
            .and_then(|l| l.replicas.get(expert))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The replica to send token row `row` to: `replicas[row % len]`, which spreads the rows of a
    /// replicated expert evenly over its copies, as the planner's load model assumes. `None` if
    /// the expert has no replica (layer not MoE, or expert out of range).
    pub fn pick_replica(&self, layer: usize, expert: usize, row: usize) -> Option<NodeId> {
        let reps = self.replicas(layer, expert);
        (!reps.is_empty()).then(|| reps[row % reps.len()])
    }

    /// Whether the copy of (`layer`, `expert`) on `node` is resident (false if it has none).
    pub fn is_resident(&self, layer: usize, expert: usize, node: NodeId) -> bool {
        if self.strategy == Strategy::RoundRobin && self.layers.is_empty() {
            return self.replicas(layer, expert).contains(&node);
        }
        self.layer(layer)
            .and_then(|l| l.resident.get(expert))
            .is_some_and(|r| r.contains(&node))
    }

    /// Every (layer, expert) `node` must serve, by layer then expert. Errors if the node is not
    /// in the placement, or if this is a round-robin file not yet `resolve`d against a shape.
    pub fn experts_on(&self, node: &str) -> Result<Vec<ExpertSlot>, PlacementError> {
        let id = self
            .node_id(node)
            .ok_or_else(|| PlacementError::NoSuchNode {
                name: node.to_string(),
            })?;
        if self.layers.is_empty() && self.strategy == Strategy::RoundRobin {
            return Err(PlacementError::Unresolved);
        }
        let mut out = Vec::new();
        for l in &self.layers {
            for (e, reps) in l.replicas.iter().enumerate() {
                if reps.contains(&id) {
                    out.push(ExpertSlot {
                        layer: l.index,
                        expert: e,
                        resident: l.resident[e].contains(&id),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Checks the placement against the model: every expert of every MoE layer placed at least
    /// once, no table for a layer that is not MoE, and each node's resident bytes within its
    /// `memory_bytes` (0 = unlimited).
    pub fn validate(&self, shape: &ModelShape) -> Result<(), PlacementError> {
        if self.nodes.is_empty() {
            return Err(PlacementError::NoNodes);
        }
        if self.strategy == Strategy::RoundRobin && self.layers.is_empty() {
            return self.resolve(shape).map(|_| ());
        }
        for l in &self.layers {
            if !shape.moe_layers.contains(&l.index) {
                return Err(PlacementError::NotMoeLayer {
                    index: l.index,
                    moe_layers: shape.moe_layers.clone(),
                });
            }
            if l.replicas.len() != shape.n_experts {
                return Err(PlacementError::ExpertCount {
                    layer: l.index,
                    expected: shape.n_experts,
                    found: l.replicas.len(),
                });
            }
        }
        for &m in &shape.moe_layers {
            if self.layer(m).is_none() {
                return Err(PlacementError::MissingLayer { index: m });
            }
        }
        let resident = self.resident_bytes(shape.expert_bytes);
        for (node, &bytes) in self.nodes.iter().zip(&resident) {
            if node.memory_bytes > 0 && bytes > node.memory_bytes {
                return Err(PlacementError::CapacityExceeded {
                    node: node.name.clone(),
                    needed: bytes,
                    capacity: node.memory_bytes,
                });
            }
        }
        Ok(())
    }

    /// A validated placement with explicit layer tables (round-robin files expanded for `shape`).
    pub fn resolve(&self, shape: &ModelShape) -> Result<Placement, PlacementError> {
        if self.strategy == Strategy::RoundRobin && self.layers.is_empty() {
            if self.nodes.is_empty() {
                return Err(PlacementError::NoNodes);
            }
            let p = Placement::round_robin(self.nodes.clone(), &shape.moe_layers, shape.n_experts);
            p.validate(shape)?;
            return Ok(p);
        }
        self.validate(shape)?;
        Ok(self.clone())
    }

    /// Resident expert bytes per node (indexed by `NodeId`), from the explicit tables.
    pub fn resident_bytes(&self, expert_bytes: u64) -> Vec<u64> {
        let mut bytes = vec![0u64; self.nodes.len()];
        for l in &self.layers {
            for r in &l.resident {
                for &n in r {
                    bytes[n] = bytes[n].saturating_add(expert_bytes);
                }
            }
        }
        bytes
    }

    /// All expert bytes (resident or mmap'd) per node, from the explicit tables.
    pub fn held_bytes(&self, expert_bytes: u64) -> Vec<u64> {
        let mut bytes = vec![0u64; self.nodes.len()];
        for l in &self.layers {
            for r in &l.replicas {
                for &n in r {
                    bytes[n] = bytes[n].saturating_add(expert_bytes);
                }
            }
        }
        bytes
    }

    /// Bytes nodes must load to go from `previous` to `self`: every (layer, expert, node name)
    /// copy present here but not there, times `expert_bytes`. Both must be resolved.
    pub fn bytes_to_move_from(&self, previous: &Placement, expert_bytes: u64) -> u64 {
        let mut moved = 0u64;
        for l in &self.layers {
            for (e, reps) in l.replicas.iter().enumerate() {
                let before: Vec<&str> = previous
                    .replicas(l.index, e)
                    .iter()
                    .map(|&n| previous.nodes[n].name.as_str())
                    .collect();
                for &n in reps {
                    if !before.contains(&self.nodes[n].name.as_str()) {
                        moved = moved.saturating_add(expert_bytes);
                    }
                }
            }
        }
        moved
    }
}
