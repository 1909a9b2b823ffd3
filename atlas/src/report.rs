//! `nightshift-atlas report`: the figures an operator reads off an atlas — per-layer and overall
//! coverage (the hottest x% of experts take y% of activations), Gini coefficient, and, given a
//! placement, its expected per-node load and imbalance — rendered as a plain-text table. When the
//! atlas has temporal locality counts, each layer also gets the share of a token's experts the
//! previous token chose and the share chosen within the previous 8 tokens; the skew, locality and
//! hot-set overlap between layers are printed next to the published targets (`skew_model::PUBLISHED`, the ones `gen-model` aims at).

use std::fmt::Write as _;

use crate::placement::{Placement, PlacementError};
use crate::stats::{coverage_at, flatten, gini, LoadReport};
use nightshift_model::gen::skew_model::PUBLISHED;

use crate::trace::{Atlas, Counts};

/// The expert fractions coverage is reported at.
pub const COVERAGE_POINTS: [f64; 4] = [0.10, 0.25, 0.50, 0.75];

/// Relative tolerance a recorded statistic is "on target" within.
pub const TARGET_TOLERANCE: f64 = 0.10;

/// `x` within [`TARGET_TOLERANCE`] of `target` (relative).
pub fn on_target(x: f64, target: f64) -> bool {
    (x / target - 1.0).abs() <= TARGET_TOLERANCE
}

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
    /// Temporal locality (previous token, within 8 tokens), when the atlas has it.
    pub locality: Option<(f64, f64)>,
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
    pub n_experts: usize,
    pub span: &'static str,
    pub layers: Vec<LayerFigures>,
    /// Over all (layer, expert) pairs.
    pub overall: LayerFigures,
    pub placement: Option<PlacementFigures>,
    /// Rows the recorder saw per node (name, rows).
    pub recorded_nodes: Vec<(String, u64)>,
    /// Mean share of a layer's hottest-half experts (by id) that are also among the next MoE
    /// layer's hottest half (independent layers: ~50%).
    pub hot_overlap: Option<f64>,
}

/// What a decode step reads with one and with `n` sequences, and the speed-up those bytes allow
/// (issue 22's batching bound): a step reads the dense weights once and every expert any of its
/// tokens chose; tokens of different sequences choose independently, expert `e` of a layer with
/// the atlas's rate `p_e` (activations / tokens), so a layer reads `sum_e 1 - (1 - p_e)^n`
/// experts. `n x bytes(1) / bytes(n)` is the most `n` sessions can gain over one when a step's
/// time is its bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchBound {
    pub sequences: u32,
    pub bytes_one: f64,
    pub bytes_n: f64,
    /// the same bound with every expert equally likely (uniform routing)
    pub uniform: f64,
}

impl BatchBound {
    pub fn new(
        counts: &Counts,
        top_k: usize,
        expert_bytes: u64,
        dense_bytes: u64,
        n: u32,
    ) -> BatchBound {
        let tokens = counts.tokens.max(1) as f64;
        let read = |n: u32, rates: &dyn Fn(&[u64]) -> Vec<f64>| -> f64 {
            let experts: f64 = counts
                .activations
                .iter()
                .map(|c| {
                    rates(c)
                        .iter()
                        .map(|p| 1.0 - (1.0 - p.min(1.0)).powi(n as i32))
                        .sum::<f64>()
                })
                .sum();
            dense_bytes as f64 + experts * expert_bytes as f64
        };
        let recorded = |c: &[u64]| c.iter().map(|&x| x as f64 / tokens).collect::<Vec<_>>();
        let uniform = |c: &[u64]| vec![top_k as f64 / c.len().max(1) as f64; c.len()];
        let bound = |r: &dyn Fn(&[u64]) -> Vec<f64>| f64::from(n) * read(1, r) / read(n, r);
        BatchBound {
            sequences: n,
            bytes_one: read(1, &recorded),
            bytes_n: read(n, &recorded),
            uniform: bound(&uniform),
        }
    }

    /// `n x bytes(1) / bytes(n)`.
    pub fn bound(&self) -> f64 {
        f64::from(self.sequences) * self.bytes_one / self.bytes_n.max(1.0)
    }

    /// One line for the report.
    pub fn line(&self) -> String {
        format!(
            "batching bound: a step reads {:.1} MiB with 1 sequence, {:.1} MiB with {}: {} sessions can reach at most {:.2}x the tok/s of one (uniform routing: {:.2}x)",
            self.bytes_one / 1048576.0,
            self.bytes_n / 1048576.0,
            self.sequences,
            self.sequences,
            self.bound(),
            self.uniform
        )
    }
}

/// The ids of the hottest half of `counts` (ties by id).
fn hot_half(counts: &[u64]) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..counts.len()).collect();
    ids.sort_by_key(|&i| (std::cmp::Reverse(counts[i]), i));
    ids.truncate(counts.len() / 2);
    ids.sort_unstable();
    ids
}

fn hot_overlap(layers: &[Vec<u64>]) -> Option<f64> {
    let halves: Vec<Vec<usize>> = layers.iter().map(|c| hot_half(c)).collect();
    let rates: Vec<f64> = halves
        .windows(2)
        .filter(|w| !w[0].is_empty())
        .map(|w| {
            let shared = w[1]
                .iter()
                .filter(|x| w[0].binary_search(x).is_ok())
                .count();
            shared as f64 / w[0].len() as f64
        })
        .collect();
    (!rates.is_empty()).then(|| rates.iter().sum::<f64>() / rates.len() as f64)
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
        locality: None,
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
        let t = atlas.temporal.as_ref();
        let k = atlas.top_k;
        let layers = atlas
            .shape
            .moe_layers
            .iter()
            .zip(&counts.activations)
            .enumerate()
            .map(|(s, (&l, c))| LayerFigures {
                locality: t.and_then(|t| Some((t.lag1(s, k)?, t.within_window(s, k)?))),
                ..figures(l, c)
            })
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
            n_experts: atlas.shape.n_experts,
            span,
            layers,
            overall: LayerFigures {
                locality: t.and_then(|t| match t.overall(k) {
                    (Some(a), Some(b)) => Some((a, b)),
                    _ => None,
                }),
                ..figures(usize::MAX, &flatten(counts))
            },
            hot_overlap: hot_overlap(&counts.activations),
            placement,
            recorded_nodes: atlas
                .nodes
                .iter()
                .map(|n| (n.name.clone(), n.rows))
                .collect(),
        })
    }

    /// Expert parallelism with one expert per rank (DeepSeek-V3's decode deployment): the
    /// busiest rank's load over the mean, averaged over layers (`top1 x experts`).
    pub fn ep_max_mean(&self) -> f64 {
        self.layers
            .iter()
            .map(|l| l.top1 * self.n_experts as f64)
            .sum::<f64>()
            / self.layers.len().max(1) as f64
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
        let temporal = self.overall.locality.is_some();
        let _ = writeln!(
            s,
            "{:>7} {:>12} {:>6} {} {:>6} {:>5}{}",
            "layer",
            "activations",
            "top1",
            head.iter()
                .map(|h| format!("{h:>7}"))
                .collect::<Vec<_>>()
                .join(" "),
            "gini",
            "cold",
            if temporal { "   prev  within8" } else { "" }
        );
        let row = |s: &mut String, name: String, f: &LayerFigures| {
            let cov: Vec<String> = f
                .coverage
                .iter()
                .map(|&c| format!("{:>7}", pct(c)))
                .collect();
            let loc = f.locality.map_or(String::new(), |(a, b)| {
                format!(" {:>6} {:>8}", pct(a), pct(b))
            });
            let _ = writeln!(
                s,
                "{:>7} {:>12} {:>6} {} {:>6.3} {:>5}{}",
                name,
                f.activations,
                pct(f.top1),
                cov.join(" "),
                f.gini,
                f.cold,
                loc
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
        let _ = writeln!(
            s,
            "\nagainst the published statistics (on target: within {:.0}%):",
            100.0 * TARGET_TOLERANCE
        );
        let line = |s: &mut String, label: &str, x: f64, target: f64| {
            let verdict = if on_target(x, target) {
                "on target"
            } else {
                "off target"
            };
            let _ = writeln!(
                s,
                "  {label:<54} {}   target {}  {verdict}",
                pct(x),
                pct(target)
            );
        };
        let per_layer50 = self.layers.iter().map(|l| l.coverage[2]).sum::<f64>()
            / self.layers.len().max(1) as f64;
        line(
            &mut s,
            "hottest 50% of a layer's experts take (mean)",
            per_layer50,
            PUBLISHED.coverage50,
        );
        let ep = self.ep_max_mean();
        let _ = writeln!(
            s,
            "  {:<54} {:5.2}x   target {:5.2}x  {}",
            "per-rank max/mean load, one expert per rank (mean)",
            ep,
            PUBLISHED.ep_max_mean,
            if on_target(ep, PUBLISHED.ep_max_mean) {
                "on target"
            } else {
                "off target"
            }
        );
        match self.overall.locality {
            Some((a, b)) => {
                line(
                    &mut s,
                    "a token's experts also chosen by the previous token",
                    a,
                    PUBLISHED.lag1,
                );
                line(
                    &mut s,
                    "a token's experts chosen within the previous 8 tokens",
                    b,
                    PUBLISHED.within8,
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    "  temporal locality: not in this atlas (record it with `nightshift-atlas record --model`)"
                );
            }
        }
        if let Some(o) = self.hot_overlap {
            let _ = writeln!(
                s,
                "  {:<54} {}   independent layers: 50.0%",
                "hot half shared with the next layer (by expert id)",
                pct(o)
            );
        }
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
        assert!(t.contains("temporal locality: not in this atlas"), "{t}");
        // layer 1's hot half {0, 1} vs layer 2's {0, 1} (ties by id)
        assert_eq!(r.hot_overlap, Some(1.0));
        // one expert per rank: layer 1 max 8 / mean 2 = 4, layer 2 1 / 1 = 1 -> 2.5
        assert!((r.ep_max_mean() - 2.5).abs() < 1e-12);
        assert!(t.contains("one expert per rank (mean)"), "{t}");
    }

    #[test]
    fn batch_bound_counts_distinct_experts() {
        let shape = ModelShape {
            moe_layers: vec![0],
            n_experts: 4,
            expert_bytes: 10,
        };
        let mut atlas = Atlas::empty("m", shape, 2, 0);
        atlas.all_time.tokens = 100;
        // uniform: every expert taken by half of the tokens (k = 2 of 4)
        atlas.all_time.activations = vec![vec![50, 50, 50, 50]];
        let b = BatchBound::new(&atlas.all_time, 2, 10, 0, 4);
        assert!((b.bytes_one - 20.0).abs() < 1e-9);
        // each expert is missed by 4 tokens with probability 1/16
        assert!((b.bytes_n - 4.0 * 10.0 * (1.0 - 1.0 / 16.0)).abs() < 1e-9);
        assert!((b.bound() - b.uniform).abs() < 1e-12);
        // fully skewed: the same two experts always; 4 sequences read what one does
        atlas.all_time.activations = vec![vec![100, 100, 0, 0]];
        let b = BatchBound::new(&atlas.all_time, 2, 10, 5, 4);
        assert!((b.bound() - 4.0).abs() < 1e-12);
        assert!(
            b.line().contains("4 sessions can reach at most 4.00x"),
            "{}",
            b.line()
        );
    }

    #[test]
    fn temporal_locality_is_printed_against_the_targets() {
        let shape = ModelShape {
            moe_layers: vec![1, 2],
            n_experts: 4,
            expert_bytes: 1,
        };
        let mut atlas = Atlas::empty("m", shape, 2, 0);
        atlas.all_time.tokens = 10;
        atlas.all_time.activations = vec![vec![6, 6, 3, 5], vec![9, 1, 1, 9]];
        let mut t = crate::trace::TemporalTracker::new(2, 2);
        // slot 0: 10 tokens alternating {0,1} {0,2}: each shares 1 of 2 with the previous
        for i in 0..10 {
            t.observe(0, if i % 2 == 0 { &[0, 1] } else { &[0, 2] });
        }
        atlas.temporal = Some(t.snapshot());
        let r = Report::new(&atlas, false, None).unwrap();
        assert_eq!(r.layers[0].locality, Some((0.5, 1.0)));
        assert_eq!(r.layers[1].locality, None);
        assert_eq!(r.overall.locality, Some((0.5, 1.0)));
        let table = r.to_table();
        assert!(table.contains("   prev  within8"), "{table}");
        assert!(
            table.contains("by the previous token     50.0%   target  45.0%  off target"),
            "{table}"
        );
        assert!(
            table.contains("previous 8 tokens  100.0%   target  80.0%  off target"),
            "{table}"
        );
        // layer 1's hot half {0, 1}, layer 2's {0, 3}
        assert_eq!(r.hot_overlap, Some(0.5));
        assert!(on_target(0.44, 0.45) && !on_target(0.40, 0.45));
    }
}
