//! Routing statistics computed from atlas counts: coverage (the hottest x% of experts take y% of
//! activations), the Gini coefficient of expert popularity, and the expected per-node load of a
//! placement (rows of a replicated expert assumed spread evenly over its replicas), whose
//! max/mean ratio is the load imbalance the planner minimises.

use crate::placement::Placement;
use crate::trace::Counts;

/// `curve[i]` = fraction of all activations taken by the hottest `i + 1` experts.
pub fn coverage_curve(counts: &[u64]) -> Vec<f64> {
    let mut sorted: Vec<u64> = counts.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    // u128: no sum of u64 counts can overflow it (a file's are checked to fit u64 anyway).
    let total: u128 = sorted.iter().map(|&c| u128::from(c)).sum();
    let mut acc = 0u128;
    sorted
        .iter()
        .map(|&c| {
            acc += u128::from(c);
            if total == 0 {
                0.0
            } else {
                acc as f64 / total as f64
            }
        })
        .collect()
}

/// Fraction of activations taken by the hottest `fraction` of experts (rounded up to whole experts).
pub fn coverage_at(counts: &[u64], fraction: f64) -> f64 {
    let curve = coverage_curve(counts);
    if curve.is_empty() {
        return 0.0;
    }
    let k = ((fraction * curve.len() as f64).ceil() as usize).clamp(1, curve.len());
    curve[k - 1]
}

/// Gini coefficient of `counts`: 0 = every expert equally popular, → 1 = one expert takes all.
pub fn gini(counts: &[u64]) -> f64 {
    let n = counts.len();
    let total: u128 = counts.iter().map(|&c| u128::from(c)).sum();
    if n == 0 || total == 0 {
        return 0.0;
    }
    let mut sorted = counts.to_vec();
    sorted.sort_unstable();
    let weighted: f64 = sorted
        .iter()
        .enumerate()
        .map(|(i, &c)| (i as f64 + 1.0) * c as f64)
        .sum();
    2.0 * weighted / (n as f64 * total as f64) - (n as f64 + 1.0) / n as f64
}

/// Sums over all MoE layers of `Counts`, as one list per expert id (for overall figures).
pub fn flatten(counts: &Counts) -> Vec<u64> {
    counts.activations.iter().flatten().copied().collect()
}

/// Expected load of each node, per MoE layer and in total, for a resolved placement.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadReport {
    /// `per_layer[slot][node]` = expected rows the node computes for that layer.
    pub per_layer: Vec<Vec<f64>>,
    /// Per node, summed over layers.
    pub total: Vec<f64>,
}

impl LoadReport {
    /// `moe_layers[slot]` gives the layer index looked up in `placement` for `counts.activations[slot]`.
    pub fn new(placement: &Placement, moe_layers: &[usize], counts: &Counts) -> LoadReport {
        let n = placement.nodes.len();
        let mut per_layer = Vec::with_capacity(moe_layers.len());
        let mut total = vec![0.0; n];
        for (slot, &layer) in moe_layers.iter().enumerate() {
            let mut loads = vec![0.0; n];
            for (e, &c) in counts.activations[slot].iter().enumerate() {
                let reps = placement.replicas(layer, e);
                if reps.is_empty() {
                    continue;
                }
                let share = c as f64 / reps.len() as f64;
                for &node in reps {
                    loads[node] += share;
                }
            }
            for (t, l) in total.iter_mut().zip(&loads) {
                *t += l;
            }
            per_layer.push(loads);
        }
        LoadReport { per_layer, total }
    }

    /// Σ_layers max node load ÷ Σ_layers mean node load: each MoE layer waits for its slowest
    /// node, so this is the expected step time relative to a perfect split (1.0 = perfect).
    pub fn imbalance(&self) -> f64 {
        let (mut max_sum, mut mean_sum) = (0.0, 0.0);
        for l in &self.per_layer {
            max_sum += l.iter().copied().fold(0.0, f64::max);
            mean_sum += l.iter().sum::<f64>() / l.len().max(1) as f64;
        }
        if mean_sum == 0.0 {
            1.0
        } else {
            max_sum / mean_sum
        }
    }

    /// The largest per-layer max/mean ratio.
    pub fn worst_layer(&self) -> f64 {
        self.per_layer.iter().map(|l| ratio(l)).fold(1.0, f64::max)
    }

    /// max/mean of the per-node totals (summed over layers).
    pub fn total_imbalance(&self) -> f64 {
        ratio(&self.total)
    }
}

/// max/mean of `loads` (1.0 when they are all zero).
pub fn ratio(loads: &[f64]) -> f64 {
    let mean = loads.iter().sum::<f64>() / loads.len().max(1) as f64;
    if mean == 0.0 {
        1.0
    } else {
        loads.iter().copied().fold(0.0, f64::max) / mean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_and_gini() {
        let rows: Vec<(Vec<u64>, f64, f64, f64)> = vec![
            // counts, coverage of hottest 50%, gini, coverage of hottest 25%
            (vec![1, 1, 1, 1], 0.5, 0.0, 0.25),
            (vec![0, 0, 0, 8], 1.0, 0.75, 1.0),
            (vec![1, 2, 3, 4], 0.7, 0.25, 0.4),
            (vec![0, 0, 0, 0], 0.0, 0.0, 0.0),
        ];
        for (counts, cov50, g, cov25) in rows {
            assert!(
                (coverage_at(&counts, 0.5) - cov50).abs() < 1e-12,
                "{counts:?}"
            );
            assert!(
                (gini(&counts) - g).abs() < 1e-12,
                "{counts:?}: {}",
                gini(&counts)
            );
            assert!(
                (coverage_at(&counts, 0.25) - cov25).abs() < 1e-12,
                "{counts:?}"
            );
        }
        assert_eq!(coverage_curve(&[1, 3]), vec![0.75, 1.0]);
    }

    #[test]
    fn load_report_splits_replicated_rows() {
        use crate::placement::{LayerPlacement, NodeSpec};
        let nodes = vec![NodeSpec::named("a"), NodeSpec::named("b")];
        let layer = LayerPlacement {
            index: 4,
            replicas: vec![vec![0], vec![0, 1], vec![1]],
            resident: vec![vec![0], vec![0, 1], vec![1]],
        };
        let p = Placement::from_layers(nodes, vec![layer]).unwrap();
        let counts = Counts {
            tokens: 5,
            activations: vec![vec![2, 6, 2]],
            weight_sums: vec![vec![0.0; 3]],
        };
        let r = LoadReport::new(&p, &[4], &counts);
        assert_eq!(r.per_layer, vec![vec![5.0, 5.0]]);
        assert_eq!(r.imbalance(), 1.0);
        let counts = Counts {
            tokens: 5,
            activations: vec![vec![6, 0, 0]],
            weight_sums: vec![vec![0.0; 3]],
        };
        let r = LoadReport::new(&p, &[4], &counts);
        assert_eq!(r.imbalance(), 2.0);
        assert_eq!(r.worst_layer(), 2.0);
    }
}
