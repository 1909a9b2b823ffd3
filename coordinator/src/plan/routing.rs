//! How a batch's tokens spread over experts and nodes: per MoE layer the probability `q[e]`
//! that a token selects expert `e` (they sum to top-k), from a recorded atlas, a Zipf skew, or
//! uniform. From it, with experts placed round-robin over the nodes (`Placement::round_robin`,
//! what `serve --nodes N` and the netns harness use), the expected per-node load of one layer
//! call at batch B: distinct experts read, (expert, row) pairs computed, activation rows sent.
//! Tokens are taken as independent draws, which ignores temporal locality (consecutive tokens
//! sharing experts), so touched-expert counts at batch > 1 are an upper bound.

use std::path::Path;

use nightshift_atlas_core::trace::Atlas;

use super::PlanError;

/// Per-layer selection probabilities.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub what: String,
    /// `q[slot][expert]`; a model with more MoE layers than slots reuses them in turn.
    pub q: Vec<Vec<f64>>,
}

/// Expected load of one node in one layer call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NodeLoad {
    /// Distinct experts read.
    pub experts: f64,
    /// (expert, row) pairs computed (= output rows returned).
    pub pairs: f64,
    /// Activation rows sent to it.
    pub rows: f64,
    /// Probability that the node gets a call at all.
    pub called: f64,
}

impl Routing {
    /// Every expert equally likely.
    pub fn uniform(n_expert: usize, top_k: usize) -> Routing {
        Routing {
            what: "uniform routing".into(),
            q: vec![vec![top_k as f64 / n_expert as f64; n_expert]],
        }
    }

    /// Expert of rank r (0-based) chosen with weight (r+1)^-s, scaled so a token picks `top_k`
    /// (no expert above probability 1: the excess goes to the others).
    pub fn zipf(n_expert: usize, top_k: usize, s: f64) -> Result<Routing, PlanError> {
        if !(s.is_finite() && s >= 0.0) {
            return Err(PlanError::Routing(format!(
                "expected a Zipf exponent >= 0, found {s}"
            )));
        }
        let w: Vec<f64> = (0..n_expert).map(|r| ((r + 1) as f64).powf(-s)).collect();
        Ok(Routing {
            what: format!("Zipf({s}) routing"),
            q: vec![scale_to(&w, top_k as f64)],
        })
    }

    /// From a recorded atlas (its window if it has tokens, else all-time counts).
    pub fn from_atlas(path: &Path, n_expert: usize, top_k: usize) -> Result<Routing, PlanError> {
        let a = Atlas::load(path).map_err(|e| PlanError::Routing(e.to_string()))?;
        if a.shape.n_experts != n_expert {
            return Err(PlanError::Routing(format!(
                "{}: expected an atlas of a model with {n_expert} experts per layer, found {}",
                path.display(),
                a.shape.n_experts
            )));
        }
        let c = a.preferred_counts();
        if c.tokens == 0 {
            return Err(PlanError::Routing(format!(
                "{}: expected recorded tokens, found an empty atlas",
                path.display()
            )));
        }
        let q = c
            .activations
            .iter()
            .map(|layer| {
                let w: Vec<f64> = layer.iter().map(|&n| n as f64).collect();
                scale_to(&w, top_k as f64)
            })
            .collect();
        Ok(Routing {
            what: format!(
                "atlas {} ({} tokens, {} layers)",
                path.display(),
                c.tokens,
                a.shape.moe_layers.len()
            ),
            q,
        })
    }

    /// Expected load of each of `nodes` round-robin nodes in a layer call of `batch` tokens,
    /// for the routing slot of MoE layer `layer`.
    pub fn node_loads(&self, layer: usize, nodes: usize, batch: usize) -> Vec<NodeLoad> {
        let q = &self.q[layer % self.q.len()];
        let b = batch as f64;
        let mut out = vec![NodeLoad::default(); nodes.max(1)];
        let mut none = vec![1.0f64; out.len()];
        for (e, &p) in q.iter().enumerate() {
            let n = &mut out[e % nodes.max(1)];
            n.experts += 1.0 - (1.0 - p).powf(b);
            n.pairs += b * p;
            none[e % nodes.max(1)] *= 1.0 - p;
        }
        for (n, miss) in out.iter_mut().zip(none) {
            // a row goes to a node when one of its k experts lives there
            n.rows = b * (1.0 - miss);
            n.called = 1.0 - miss.powf(b);
        }
        out
    }

    /// MoE layers' routing slots in the model's order (cycled when the atlas has fewer).
    pub fn slots(&self) -> usize {
        self.q.len()
    }
}

/// Scales non-negative weights to sum `k`, capping each at 1 and spreading the excess over the
/// uncapped ones (a token selects an expert at most once).
fn scale_to(w: &[f64], k: f64) -> Vec<f64> {
    let mut q = vec![0.0; w.len()];
    let mut capped = vec![false; w.len()];
    let mut left = k.min(w.len() as f64);
    loop {
        let free: f64 = w
            .iter()
            .zip(&capped)
            .filter(|(_, c)| !**c)
            .map(|(x, _)| *x)
            .sum();
        if free <= 0.0 {
            break;
        }
        let mut changed = false;
        for i in 0..w.len() {
            if !capped[i] {
                q[i] = w[i] / free * left;
                if q[i] > 1.0 {
                    q[i] = 1.0;
                    capped[i] = true;
                    left -= 1.0;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_batch_one_touches_top_k_experts() {
        let r = Routing::uniform(16, 4);
        let loads = r.node_loads(0, 2, 1);
        let experts: f64 = loads.iter().map(|l| l.experts).sum();
        let pairs: f64 = loads.iter().map(|l| l.pairs).sum();
        assert!((experts - 4.0).abs() < 1e-9, "{experts}");
        assert!((pairs - 4.0).abs() < 1e-9, "{pairs}");
        // 8 experts per node, each with p = 1/4: P(no expert on a node) = (3/4)^8
        let rows = loads[0].rows;
        assert!((rows - (1.0 - 0.75f64.powi(8))).abs() < 1e-9, "{rows}");
    }

    #[test]
    fn large_batches_touch_every_expert_once() {
        let r = Routing::uniform(16, 4);
        let experts: f64 = r.node_loads(0, 3, 4096).iter().map(|l| l.experts).sum();
        assert!((experts - 16.0).abs() < 1e-6, "{experts}");
    }

    #[test]
    fn zipf_skew_caps_at_one_and_sums_to_k() {
        let r = Routing::zipf(8, 4, 3.0).expect("zipf");
        let q = &r.q[0];
        assert!(q.iter().all(|&p| p <= 1.0 + 1e-12));
        assert!((q.iter().sum::<f64>() - 4.0).abs() < 1e-9);
        assert_eq!(q[0], 1.0);
        assert!(q.windows(2).all(|w| w[0] >= w[1]));
        assert!(Routing::zipf(8, 4, f64::NAN).is_err());
        assert!(Routing::zipf(8, 4, -1.0).is_err());
    }
}
