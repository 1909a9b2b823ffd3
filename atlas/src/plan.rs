//! The placement planner (EPLB-style). Per MoE layer, from the atlas's activation counts:
//!
//! 1. **Replicate**: every expert starts with one copy; each extra copy goes to the expert with
//!    the highest load per copy (count ÷ copies), at most one copy per node.
//! 2. **Pack**: every node gets a quota of copies proportional to its memory (equal when memory is
//!    unlimited or equal), so memory stays balanced; copies are placed hottest first on the least
//!    loaded node with room that does not hold that expert yet (LPT). With a previous placement, a
//!    copy goes back to a node that held it as long as that node stays under the ideal load plus
//!    a small tolerance, which keeps the bytes to move low.
//! 3. **Refine**: swap copies between the most loaded node and the others while that lowers the
//!    pair's maximum.
//! 4. **Resident set**: each node keeps its hottest copies resident up to `memory_bytes`; the rest
//!    are mmap'd. A node that cannot keep its extra (replicated, i.e. hot) copies resident is an
//!    error: the plan asks for more replica memory than the nodes have.
//!
//! Load model: rows of a replicated expert are spread evenly over its copies. The planner is
//! deterministic: ties break on the lower expert id, then the lower node id.

use crate::placement::{LayerPlacement, ModelShape, NodeId, NodeSpec, Placement, PlacementError};
use crate::stats::LoadReport;
use crate::trace::Counts;

/// How many extra copies (beyond one per expert) the planner may create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaBudget {
    /// Extra copies per MoE layer.
    PerLayer(usize),
    /// Bytes for extra copies over all layers and nodes (split evenly over layers).
    Bytes(u64),
}

/// A previous copy may stay where it was while its node stays under mean × (1 + this).
const STICKY_TOLERANCE: f64 = 0.01;
/// Upper bound on refinement swaps per layer (each strictly lowers a maximum, so it ends anyway).
const MAX_SWAPS: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("expected at least one node, found none")]
    NoNodes,
    #[error("atlas counts cover {found} MoE layers x {found_experts} experts, expected {expected} x {expected_experts} from the shape")]
    ShapeMismatch {
        expected: usize,
        expected_experts: usize,
        found: usize,
        found_experts: usize,
    },
    #[error("--replica-memory needs expert_bytes > 0 in the atlas shape, found 0")]
    ZeroExpertBytes,
    #[error("{extra} extra copies per layer requested, but {nodes} nodes can hold at most {max} (one copy of each of {experts} experts per node)")]
    TooManyReplicas {
        extra: usize,
        max: usize,
        nodes: usize,
        experts: usize,
    },
    #[error("node {node:?}: memory_bytes {capacity} cannot keep its {copies} replicated (hot) expert copies resident ({needed} bytes): give it more memory or ask for fewer replicas")]
    CapacityTooSmall {
        node: String,
        capacity: u64,
        copies: usize,
        needed: u64,
    },
    #[error("previous placement does not fit this model: {0}")]
    Previous(PlacementError),
    #[error(transparent)]
    Placement(#[from] PlacementError),
}

/// What the planner needs.
pub struct PlanRequest<'a> {
    pub shape: &'a ModelShape,
    /// `counts.activations[slot]` for `shape.moe_layers[slot]`.
    pub counts: &'a Counts,
    pub nodes: Vec<NodeSpec>,
    pub budget: ReplicaBudget,
    pub previous: Option<&'a Placement>,
}

/// Figures for one placement on one atlas, as `plan` prints them.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanFigures {
    /// Σ per-layer max node load ÷ Σ per-layer mean (1.0 = perfect).
    pub imbalance: f64,
    pub worst_layer: f64,
    /// Per node: expected rows (all layers), bytes held (resident + mmap'd), bytes resident.
    pub node_load: Vec<f64>,
    pub held_bytes: Vec<u64>,
    pub resident_bytes: Vec<u64>,
    /// Bytes nodes must load relative to the previous placement (0 without one).
    pub bytes_to_move: u64,
}

impl PlanFigures {
    pub fn of(p: &Placement, req: &PlanRequest<'_>) -> PlanFigures {
        let loads = LoadReport::new(p, &req.shape.moe_layers, req.counts);
        PlanFigures {
            imbalance: loads.imbalance(),
            worst_layer: loads.worst_layer(),
            node_load: loads.total.clone(),
            held_bytes: p.held_bytes(req.shape.expert_bytes),
            resident_bytes: p.resident_bytes(req.shape.expert_bytes),
            bytes_to_move: req
                .previous
                .map_or(0, |prev| p.bytes_to_move_from(prev, req.shape.expert_bytes)),
        }
    }
}

pub struct Plan {
    pub placement: Placement,
    pub extra_per_layer: usize,
    pub ours: PlanFigures,
    pub round_robin: PlanFigures,
}

/// Plans a placement; nothing is written anywhere.
pub fn plan(req: &PlanRequest<'_>) -> Result<Plan, PlanError> {
    let shape = req.shape;
    let n = req.nodes.len();
    if n == 0 {
        return Err(PlanError::NoNodes);
    }
    let e = shape.n_experts;
    let layers = shape.moe_layers.len();
    let found_experts = req.counts.activations.first().map_or(0, Vec::len);
    if req.counts.activations.len() != layers || req.counts.activations.iter().any(|a| a.len() != e)
    {
        return Err(PlanError::ShapeMismatch {
            expected: layers,
            expected_experts: e,
            found: req.counts.activations.len(),
            found_experts,
        });
    }
    let probe = Placement::from_layers(req.nodes.clone(), Vec::new())?;
    let rr = Placement::round_robin(req.nodes.clone(), &shape.moe_layers, e);
    let previous = match req.previous {
        Some(p) => Some(p.resolve(shape).map_err(PlanError::Previous)?),
        None => None,
    };
    let extra = match req.budget {
        ReplicaBudget::PerLayer(x) => x,
        ReplicaBudget::Bytes(b) => {
            if shape.expert_bytes == 0 {
                return Err(PlanError::ZeroExpertBytes);
            }
            (b / shape.expert_bytes / layers.max(1) as u64) as usize
        }
    };
    let max = e * (n - 1);
    if extra > max {
        return Err(PlanError::TooManyReplicas {
            extra,
            max,
            nodes: n,
            experts: e,
        });
    }
    let quotas = quotas(&req.nodes, e + extra);
    // previous holders by node id in the new node list (matched by name)
    let prev_ids: Vec<Option<NodeId>> = previous
        .as_ref()
        .map(|p| {
            p.nodes
                .iter()
                .map(|node| probe.node_id(&node.name))
                .collect()
        })
        .unwrap_or_default();

    let mut out = Vec::with_capacity(layers);
    for (slot, &layer) in shape.moe_layers.iter().enumerate() {
        let counts = &req.counts.activations[slot];
        let copies = replicate(counts, extra, n);
        let prev: Vec<Vec<NodeId>> = match &previous {
            Some(p) => (0..e)
                .map(|x| {
                    p.replicas(layer, x)
                        .iter()
                        .filter_map(|&id| prev_ids[id])
                        .collect()
                })
                .collect(),
            None => vec![Vec::new(); e],
        };
        let mut replicas = pack(counts, &copies, &quotas, &prev);
        // Never worse than round-robin on any layer: keep its layout where it is strictly better.
        let rr_layer: Vec<Vec<NodeId>> = (0..e).map(|x| vec![x % n]).collect();
        if layer_max(counts, &rr_layer, n) < layer_max(counts, &replicas, n) - 1e-9 {
            replicas = rr_layer;
        }
        out.push(LayerPlacement {
            index: layer,
            resident: Vec::new(),
            replicas,
        });
    }
    mark_resident(&mut out, req.counts, &req.nodes, shape)?;
    let placement = Placement::from_layers(req.nodes.clone(), out)?;
    placement.validate(shape)?;
    let prev_req = PlanRequest {
        previous: previous.as_ref(),
        nodes: Vec::new(),
        ..*req
    };
    Ok(Plan {
        ours: PlanFigures::of(&placement, &prev_req),
        round_robin: PlanFigures::of(&rr, &prev_req),
        placement,
        extra_per_layer: extra,
    })
}

/// The most loaded node's expected rows for one layer.
fn layer_max(counts: &[u64], replicas: &[Vec<NodeId>], n: usize) -> f64 {
    let mut load = vec![0.0f64; n];
    for (x, reps) in replicas.iter().enumerate() {
        for &node in reps {
            load[node] += counts[x] as f64 / reps.len() as f64;
        }
    }
    load.into_iter().fold(0.0, f64::max)
}

/// Copies per node per layer: proportional to memory (equal if all unlimited or equal), summing
/// to `total`, by largest remainder (ties to the lower node id).
fn quotas(nodes: &[NodeSpec], total: usize) -> Vec<usize> {
    let n = nodes.len();
    let weights: Vec<f64> = if nodes.iter().all(|x| x.memory_bytes > 0) {
        nodes.iter().map(|x| x.memory_bytes as f64).collect()
    } else {
        vec![1.0; n]
    };
    let sum: f64 = weights.iter().sum();
    let exact: Vec<f64> = weights.iter().map(|w| w / sum * total as f64).collect();
    let mut q: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| {
        (exact[b] - exact[b].floor())
            .total_cmp(&(exact[a] - exact[a].floor()))
            .then(a.cmp(&b))
    });
    let mut left = total - q.iter().sum::<usize>();
    for &i in order.iter().cycle() {
        if left == 0 {
            break;
        }
        q[i] += 1;
        left -= 1;
    }
    q
}

/// Copies per expert: 1 each, then `extra` more, each to the highest count per copy (< `n` copies).
fn replicate(counts: &[u64], extra: usize, n: usize) -> Vec<usize> {
    let mut copies = vec![1usize; counts.len()];
    for _ in 0..extra {
        let mut best: Option<usize> = None;
        for x in 0..counts.len() {
            if copies[x] >= n {
                continue;
            }
            let better = match best {
                None => true,
                // counts[x]/copies[x] > counts[b]/copies[b], compared exactly
                Some(b) => {
                    (counts[x] as u128) * (copies[b] as u128)
                        > (counts[b] as u128) * (copies[x] as u128)
                }
            };
            if better {
                best = Some(x);
            }
        }
        match best {
            Some(x) => copies[x] += 1,
            None => break,
        }
    }
    copies
}

/// Places `copies[x]` copies of each expert on distinct nodes within `quotas` (LPT + swaps).
fn pack(
    counts: &[u64],
    copies: &[usize],
    quotas: &[usize],
    prev: &[Vec<NodeId>],
) -> Vec<Vec<NodeId>> {
    let n = quotas.len();
    let mut items: Vec<(usize, f64)> = Vec::new();
    for (x, &c) in copies.iter().enumerate() {
        for _ in 0..c {
            items.push((x, counts[x] as f64 / c as f64));
        }
    }
    // hottest first; ties: lower expert id (stable sort keeps copies of one expert together)
    items.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let total: f64 = items.iter().map(|i| i.1).sum();
    let target = total / n as f64 * (1.0 + STICKY_TOLERANCE);
    let mut load = vec![0.0f64; n];
    let mut free = quotas.to_vec();
    let mut held: Vec<Vec<usize>> = vec![Vec::new(); n]; // items (index into `items`) per node
    let mut replicas: Vec<Vec<NodeId>> = vec![Vec::new(); counts.len()];
    for (i, &(x, w)) in items.iter().enumerate() {
        let fits = |node: usize, replicas: &Vec<Vec<NodeId>>| {
            free[node] > 0 && !replicas[x].contains(&node)
        };
        let sticky = prev[x]
            .iter()
            .copied()
            .find(|&node| fits(node, &replicas) && load[node] + w <= target);
        let node = sticky.or_else(|| {
            (0..n)
                .filter(|&node| fits(node, &replicas))
                .min_by(|&a, &b| load[a].total_cmp(&load[b]).then(a.cmp(&b)))
        });
        // Quotas sum to the number of items and an expert has at most n copies, so some node fits;
        // `None` would be a planner bug, and the placement validation after packing would catch it.
        let Some(node) = node else { continue };
        load[node] += w;
        free[node] -= 1;
        held[node].push(i);
        replicas[x].push(node);
    }
    refine(&items, &mut load, &mut held, &mut replicas);
    for r in &mut replicas {
        r.sort_unstable();
    }
    replicas
}

/// Swaps items between the most loaded node and any other while that lowers the pair's maximum.
fn refine(
    items: &[(usize, f64)],
    load: &mut [f64],
    held: &mut [Vec<usize>],
    replicas: &mut [Vec<NodeId>],
) {
    let n = load.len();
    for _ in 0..MAX_SWAPS {
        let hot = (0..n)
            .max_by(|&a, &b| load[a].total_cmp(&load[b]).then(b.cmp(&a)))
            .unwrap_or(0);
        // best swap: item a on `hot` <-> item b on `m`, moving d = w_a - w_b from hot to m;
        // the pair's new max is max(load[hot] - d, load[m] + d): best when d is nearest gap/2.
        let mut best: Option<(f64, usize, usize, usize)> = None; // (new pair max, ia, m, ib)
        for m in 0..n {
            if m == hot {
                continue;
            }
            let gap = load[hot] - load[m];
            if gap <= 1e-9 {
                continue;
            }
            for (ia, &a) in held[hot].iter().enumerate() {
                let (xa, wa) = items[a];
                if replicas[xa].contains(&m) {
                    continue;
                }
                for (ib, &b) in held[m].iter().enumerate() {
                    let (xb, wb) = items[b];
                    let d = wa - wb;
                    if d <= 1e-9 || d >= gap - 1e-9 || xa == xb || replicas[xb].contains(&hot) {
                        continue;
                    }
                    let new_max = (load[hot] - d).max(load[m] + d);
                    if best.is_none_or(|(bm, ..)| new_max < bm - 1e-12) {
                        best = Some((new_max, ia, m, ib));
                    }
                }
            }
        }
        let Some((_, ia, m, ib)) = best else { return };
        let a = held[hot][ia];
        let b = held[m][ib];
        let (xa, wa) = items[a];
        let (xb, wb) = items[b];
        held[hot][ia] = b;
        held[m][ib] = a;
        load[hot] += wb - wa;
        load[m] += wa - wb;
        for r in replicas[xa].iter_mut().filter(|r| **r == hot) {
            *r = m;
        }
        for r in replicas[xb].iter_mut().filter(|r| **r == m) {
            *r = hot;
        }
    }
}

/// Fills `resident` for every layer: per node, replicated (hot) copies first, then the hottest
/// copies, until `memory_bytes` is used up; the rest stay mmap'd.
fn mark_resident(
    layers: &mut [LayerPlacement],
    counts: &Counts,
    nodes: &[NodeSpec],
    shape: &ModelShape,
) -> Result<(), PlanError> {
    // per node: (slot, expert, load per copy, replicated)
    let mut per_node: Vec<Vec<(usize, usize, f64, bool)>> = vec![Vec::new(); nodes.len()];
    for (slot, l) in layers.iter().enumerate() {
        for (x, reps) in l.replicas.iter().enumerate() {
            let w = counts.activations[slot][x] as f64 / reps.len() as f64;
            for &node in reps {
                per_node[node].push((slot, x, w, reps.len() > 1));
            }
        }
    }
    for l in layers.iter_mut() {
        l.resident = vec![Vec::new(); l.replicas.len()];
    }
    for (node, copies) in per_node.iter_mut().enumerate() {
        copies.sort_by(|a, b| {
            b.3.cmp(&a.3)
                .then(b.2.total_cmp(&a.2))
                .then((a.0, a.1).cmp(&(b.0, b.1)))
        });
        let cap = nodes[node].memory_bytes;
        let hot = copies.iter().filter(|c| c.3).count();
        if cap > 0 && (hot as u64).saturating_mul(shape.expert_bytes) > cap {
            return Err(PlanError::CapacityTooSmall {
                node: nodes[node].name.clone(),
                capacity: cap,
                copies: hot,
                needed: hot as u64 * shape.expert_bytes,
            });
        }
        let fit = if cap == 0 || shape.expert_bytes == 0 {
            copies.len()
        } else {
            ((cap / shape.expert_bytes) as usize).min(copies.len())
        };
        for &(slot, x, _, _) in &copies[..fit] {
            layers[slot].resident[x].push(node);
        }
    }
    for l in layers.iter_mut() {
        for r in &mut l.resident {
            r.sort_unstable();
        }
    }
    Ok(())
}
