//! `nightshift-atlas report`: the figures an operator reads off an atlas — per-layer and overall
//! coverage (the hottest x% of experts take y% of activations), Gini coefficient, and, given a
//! placement, its expected per-node load and imbalance — rendered as a plain-text table.

use std::fmt::Write as _;

use crate::placement::{Placement, PlacementError};
use crate::stats::{coverage_at, flatten, gini, LoadReport};
use crate::trace::{Atlas, Counts};

/// The expert fractions coverage is reported at.
pub const COVERAGE_POINTS: [f64; 4] = [0.10, 0.25, 0.50, 0.75];

#[derive(Clone, Debug, PartialEq)]
pub struct LayerFigures {
    pub layer: usize,
    pub activations: u64,
    /// Share of the layer's activations taken by its single hottest expert.
    pub top1: f64,
    /// `coverage[i]` at `COVERAGE_POINTS[i]`.
    pub coverage: Vec<f64>,
    pub gini: f64,
    /// Experts that never fired.
    pub cold: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PlacementFigures {
    pub nodes: Vec<String>,
    pub loads: LoadReport,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub model: String,
    pub tokens: u64,
    pub span: &'static str,
    pub layers: Vec<LayerFigures>,
    /// Over all (layer, expert) pairs.
    pub overall: LayerFigures,
    pub placement: Option<PlacementFigures>,
    /// Rows the recorder saw per node (name, rows).
    pub recorded_nodes: Vec<(String, u64)>,
}

fn figures(layer: usize, counts: &[u64]) -> LayerFigures {
    let total: u64 = counts.iter().sum();
    let max = counts.iter().copied().max().unwrap_or(0);
    LayerFigures {
        layer,
        activations: total,
        top1: if total == 0 {
            0.0
        } else {
            max as f64 / total as f64
        },
        coverage: COVERAGE_POINTS
            .iter()
            .map(|&f| coverage_at(counts, f))
            .collect(),
        gini: gini(counts),
        cold: counts.iter().filter(|&&c| c == 0).count(),
    }
}

impl Report {
    /// Figures for `atlas` (window counts if `window`, else all-time), and for `placement` if given
    /// (checked against the atlas's shape first).
    pub fn new(
        atlas: &Atlas,
        window: bool,
        placement: Option<&Placement>,
    ) -> Result<Report, PlacementError> {
        let (counts, span): (&Counts, &'static str) = if window {
            (&atlas.window, "window")
        } else {
            (&atlas.all_time, "all-time")
        };
        let layers = atlas
            .shape
            .moe_layers
            .iter()
            .zip(&counts.activations)
            .map(|(&l, c)| figures(l, c))
            .collect();
        let placement = match placement {
            Some(p) => {
                let p = p.resolve(&atlas.shape)?;
                Some(PlacementFigures {
                    nodes: p.nodes.iter().map(|n| n.name.clone()).collect(),
                    loads: LoadReport::new(&p, &atlas.shape.moe_layers, counts),
                })
            }
            None => None,
        };
        Ok(Report {
            model: atlas.model.clone(),
            tokens: counts.tokens,
            span,
            layers,
            overall: figures(usize::MAX, &flatten(counts)),
            placement,
            recorded_nodes: atlas
                .nodes
                .iter()
                .map(|n| (n.name.clone(), n.rows))
                .collect(),
        })
    }

    /// The plain-text table printed on stdout.
    pub fn to_table(&self) -> String {
        let mut s = String::new();
        let pct = |x: f64| format!("{:5.1}%", 100.0 * x);
        let _ = writeln!(
            s,
            "atlas: {} ({} counts, {} tokens)",
            self.model, self.span, self.tokens
        );
        let head: Vec<String> = COVERAGE_POINTS
            .iter()
            .map(|f| format!("top{:>3.0}%", 100.0 * f))
            .collect();
        let _ = writeln!(
            s,
            "{:>7} {:>12} {:>6} {} {:>6} {:>5}",
            "layer",
            "activations",
            "top1",
            head.iter()
                .map(|h| format!("{h:>7}"))
                .collect::<Vec<_>>()
                .join(" "),
            "gini",
            "cold"
        );
        let row = |s: &mut String, name: String, f: &LayerFigures| {
            let cov: Vec<String> = f
                .coverage
                .iter()
                .map(|&c| format!("{:>7}", pct(c)))
                .collect();
            let _ = writeln!(
                s,
                "{:>7} {:>12} {:>6} {} {:>6.3} {:>5}",
                name,
                f.activations,
                pct(f.top1),
                cov.join(" "),
                f.gini,
                f.cold
            );
        };
        for f in &self.layers {
            row(&mut s, f.layer.to_string(), f);
        }
        row(&mut s, "all".to_string(), &self.overall);
        let _ = writeln!(
            s,
            "coverage: the hottest 50% of experts take {} of activations (per layer, averaged: {})",
            pct(self.overall.coverage[2]),
            pct(self.layers.iter().map(|l| l.coverage[2]).sum::<f64>()
                / self.layers.len().max(1) as f64)
        );
        if let Some(p) = &self.placement {
            let _ = writeln!(s, "\nplacement: expected load per node (rows, all layers)");
            let mean = p.loads.total.iter().sum::<f64>() / p.loads.total.len().max(1) as f64;
            for (name, load) in p.nodes.iter().zip(&p.loads.total) {
                let rel = if mean > 0.0 { load / mean } else { 1.0 };
                let _ = writeln!(s, "  {name:<16} {load:>14.0}  {rel:>5.3} x mean");
            }
            let _ = writeln!(
                s,
                "load imbalance (max/mean): per-step {:.3} (sum over layers of max / sum of mean), worst layer {:.3}, node totals {:.3}",
                p.loads.imbalance(),
                p.loads.worst_layer(),
                p.loads.total_imbalance()
            );
        }
        if !self.recorded_nodes.is_empty() {
            let _ = writeln!(s, "\nrecorded rows per node:");
            for (name, rows) in &self.recorded_nodes {
                let _ = writeln!(s, "  {name:<16} {rows:>14}");
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{ModelShape, NodeSpec};

    #[test]
    fn table_shows_coverage_gini_and_imbalance() {
        let shape = ModelShape {
            moe_layers: vec![1, 2],
            n_experts: 4,
            expert_bytes: 1,
        };
        let mut atlas = Atlas::empty("m", shape.clone(), 2, 0);
        atlas.all_time.tokens = 10;
        atlas.all_time.activations = vec![vec![8, 0, 0, 0], vec![1, 1, 1, 1]];
        let rr =
            Placement::round_robin(vec![NodeSpec::named("a"), NodeSpec::named("b")], &[1, 2], 4);
        let r = Report::new(&atlas, false, Some(&rr)).unwrap();
        assert_eq!(r.layers[0].coverage, vec![1.0, 1.0, 1.0, 1.0]);
        assert_eq!(r.layers[0].cold, 3);
        assert_eq!(r.layers[1].coverage, vec![0.25, 0.25, 0.5, 0.75]);
        assert_eq!(r.overall.activations, 12);
        let loads = &r.placement.as_ref().unwrap().loads;
        assert_eq!(loads.total, vec![10.0, 2.0]);
        // layer 1: max 8, mean 4; layer 2: max 2, mean 2 -> (8 + 2) / (4 + 2)
        assert!((loads.imbalance() - 10.0 / 6.0).abs() < 1e-12);
        let t = r.to_table();
        assert!(
            t.contains("      1            8 100.0%  100.0%  100.0%  100.0%  100.0%  0.750     3"),
            "{t}"
        );
        assert!(t.contains("per-step 1.667"), "{t}");
        let other = ModelShape {
            n_experts: 5,
            ..shape
        };
        let bad = Placement::round_robin(vec![NodeSpec::named("a")], &[1, 2], 5);
        let _ = other;
        assert!(Report::new(&atlas, false, Some(&bad)).is_err());
    }
}
