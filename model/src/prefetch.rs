//! Cold-expert prefetch, one MoE layer ahead (`--memory-budget`'s cold path).
//!
//! When MoE layer `l`'s experts are called, its activation rows (the normalised hidden state)
//! also go through the *next* MoE layer's router, with the model's own routing rule
//! ([`crate::moe::route`]): the experts it picks are a prediction of what layer `l'` will ask
//! for (the residual changes little in one layer; Colibri reports ~72% predictable). The
//! predicted experts that are not resident are handed to a dedicated I/O thread, which advises
//! their file pages `MADV_WILLNEED` (readahead into the page cache) while layer `l`'s experts and
//! layer `l'`'s attention run. When layer `l'` is called, its actual experts are scored against
//! the prediction: precision and recall over all experts, and the share of the cold experts it
//! needs that were requested before it started (the target: >= 60%). Those requested
//! are *in time* when all their pages are in the page cache as the layer starts (`mincore`),
//! *late* when the readahead is still under way; requested experts the layer does not use are
//! *wasted* reads. Only calls of at most [`MAX_PREDICTED_ROWS`] rows (decode steps) predict.
//!
//! How a cold expert comes in ([`ColdReads`]): by default the cold path reads whole experts
//! itself. The expert tensors are advised `MADV_RANDOM`, so a fault reads its page and not the
//! kernel's read-around window (`read_ahead_kb` around the faulting page: 8 MiB on this VM's
//! disk, i.e. mostly neighbouring experts' bytes, which under a memory limit evict pages that
//! were needed). Every cold expert a decode step's layer uses that the prediction did not
//! request is advised `MADV_WILLNEED` as the layer starts (the kernel reads all of them at
//! once, in large requests); in prefill chunks, which are not predicted, each cold expert is
//! advised just before it is computed (one request per matrix instead of page faults).
//!
//! The prediction itself is [`NextLayer`]; the coordinator runs it too when its experts are on
//! nodes, and sends each node the predicted experts it holds as a hint (`PrefetchHint` of the
//! node protocol), which a node with a staging cache reads ahead the same way. How predictions
//! fared is scored in one place, [`PrefetchLedger`] (`prefetch/ledger.rs`), here and on nodes.
//!
//! Prefetching only moves pages into the cache earlier: **it never changes outputs** (the same
//! bytes are read either way), and a wrong prediction costs only I/O.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};

use crate::cold::ColdCache;
use crate::error::ExpertError;
use crate::expert::{ActRows, ExpertPair};
use crate::gguf::{AccessHint, Gguf};
use crate::model::Model;
use crate::moe::{gate_probs, route};
use crate::ops::matmul;
use crate::weights::{FfnWeights, MoeWeights};

mod ledger;
pub use ledger::PrefetchLedger;

/// Calls of more rows (prefill chunks) are not predicted: they use nearly every expert of a
/// layer, and reading all of them ahead would evict what the page cache holds under a limit.
pub const MAX_PREDICTED_ROWS: usize = 8;

/// How the cold path reads experts that are not in the page cache (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ColdReads {
    /// Whole experts, advised `MADV_WILLNEED` when a layer needs them (the expert tensors are
    /// `MADV_RANDOM`: no read-around on a fault).
    #[default]
    WholeExperts,
    /// Page faults and the kernel's read-around window (what a plain mapping does).
    ReadAround,
}

/// Counters of the predictions made and how they fared (all since start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchStats {
    /// distinct experts predicted for a layer, summed over layer calls
    pub predicted: u64,
    /// of those, experts the layer then used
    pub predicted_used: u64,
    /// distinct experts layers used (calls that had a prediction)
    pub used: u64,
    /// distinct non-resident experts layers used (calls that had a prediction)
    pub cold_needed: u64,
    /// of those, experts requested from the I/O thread before the layer started
    pub cold_requested: u64,
    /// expert ranges advised to the kernel by the I/O thread
    pub advised: u64,
    /// cold experts requested from the I/O thread (predicted, not resident)
    pub issued: u64,
    /// of `cold_requested`, experts whose pages were all in the page cache when the layer started
    pub in_time: u64,
    /// of `cold_requested`, experts whose pages were still being read when the layer started
    pub late: u64,
    /// requested experts the layer then did not use
    pub wasted: u64,
    /// cold experts a decode step's layer used that the prediction had not requested, advised
    /// as the layer started ([`ColdReads::WholeExperts`])
    pub demand: u64,
}

impl PrefetchStats {
    /// Share of predicted experts that were used (None before any prediction was scored).
    pub fn precision(&self) -> Option<f64> {
        (self.predicted > 0).then(|| self.predicted_used as f64 / self.predicted as f64)
    }

    /// Share of used experts that were predicted.
    pub fn recall(&self) -> Option<f64> {
        (self.used > 0).then(|| self.predicted_used as f64 / self.used as f64)
    }

    /// Share of the cold experts layers needed that had been requested when the layer started.
    pub fn cold_hit_rate(&self) -> Option<f64> {
        (self.cold_needed > 0).then(|| self.cold_requested as f64 / self.cold_needed as f64)
    }

    /// Share of the cold experts layers needed whose pages were already cached thanks to the
    /// prefetch when the layer started.
    pub fn in_time_rate(&self) -> Option<f64> {
        (self.cold_needed > 0).then(|| self.in_time as f64 / self.cold_needed as f64)
    }

    /// Share of the requested cold experts that layers did not use.
    pub fn wasted_rate(&self) -> Option<f64> {
        (self.issued > 0).then(|| self.wasted as f64 / self.issued as f64)
    }

    /// One line for logs and reports.
    pub fn summary(&self) -> String {
        let pct = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{:.1}%", 100.0 * x));
        format!(
            "prefetch: precision {} recall {} (next-layer router on this layer's rows), cold experts requested before their layer {} of {} (in time {}, late {}), {} requested of which {} wasted, {} cold experts the prediction missed advised as their layer started",
            pct(self.precision()),
            pct(self.recall()),
            pct(self.cold_hit_rate()),
            self.cold_needed,
            self.in_time,
            self.late,
            self.issued,
            self.wasted,
            self.demand
        )
    }
}

/// The one-layer-ahead prediction: the next MoE layer's router on a layer's rows (module doc).
/// The in-process [`Prefetcher`] runs it, and so does the coordinator's remote backend to send
/// expert nodes hints of what they will be asked for next.
pub struct NextLayer {
    model: Arc<Model>,
    /// the model's MoE layers, ascending
    moe: Vec<usize>,
    /// the next MoE layer of each layer (None: last)
    next_moe: Vec<Option<usize>>,
}

impl NextLayer {
    pub fn new(model: Arc<Model>) -> NextLayer {
        let c = model.config();
        let moe: Vec<usize> = (0..c.n_layer).filter(|&l| c.is_moe_layer(l)).collect();
        let mut next_moe = vec![None; c.n_layer];
        for w in moe.windows(2) {
            next_moe[w[0]] = Some(w[1]);
        }
        NextLayer {
            model,
            moe,
            next_moe,
        }
    }

    /// The model's MoE layers, ascending.
    pub fn moe_layers(&self) -> &[usize] {
        &self.moe
    }

    /// The MoE layer after `layer` and the distinct experts its router picks for the rows of
    /// `acts` (`layer`'s activation rows), ascending; None when `layer` is the last MoE layer or
    /// the call has more than [`MAX_PREDICTED_ROWS`] rows.
    pub fn predict(
        &self,
        layer: usize,
        acts: &ActRows,
    ) -> Result<Option<(usize, Vec<u32>)>, ExpertError> {
        Ok(self
            .predicted(layer, acts, false)?
            .map(|p| (p.layer, p.experts)))
    }

    /// [`NextLayer::predict`] with the predicted router probabilities ([`Predicted::peaks`]).
    pub fn predict_scored(
        &self,
        layer: usize,
        acts: &ActRows,
    ) -> Result<Option<Predicted>, ExpertError> {
        self.predicted(layer, acts, true)
    }

    /// The prediction for the MoE layer after `layer`, its peaks only when `scored`.
    fn predicted(
        &self,
        layer: usize,
        acts: &ActRows,
        scored: bool,
    ) -> Result<Option<Predicted>, ExpertError> {
        let Some(next) = self.next_moe.get(layer).copied().flatten() else {
            return Ok(None);
        };
        if acts.n_rows > MAX_PREDICTED_ROWS {
            return Ok(None);
        }
        let c = self.model.config();
        let mut p = Predicted {
            layer: next,
            experts: Vec::new(),
            peaks: Vec::new(),
        };
        let Some((logits, mw)) = self.logits(next, acts)? else {
            return Ok(Some(p));
        };
        for row in logits.chunks_exact(c.n_expert) {
            let (chosen, _) = route(c, row, mw.exp_probs_b.as_deref());
            p.experts.extend(chosen.iter().map(|&x| x as u32));
        }
        p.experts.sort_unstable();
        p.experts.dedup();
        if scored {
            p.peaks = self.peaks(mw, &logits);
        }
        Ok(Some(p))
    }

    /// Layer `layer`'s own router probabilities for the rows of `acts`, as [`Predicted::peaks`]
    /// (empty when `layer` is not a MoE layer).
    pub fn router_peaks(&self, layer: usize, acts: &ActRows) -> Result<Vec<f32>, ExpertError> {
        Ok(self
            .logits(layer, acts)?
            .map_or_else(Vec::new, |(l, mw)| self.peaks(mw, &l)))
    }

    /// Each expert's largest selection score over the rows whose router `logits` (of the layer
    /// `mw` is) these are: its probability, plus the layer's selection bias where it has one
    /// (DeepSeek's and Kimi K2's `exp_probs_b`), which is what top-k ranks by.
    fn peaks(&self, mw: &MoeWeights, logits: &[f32]) -> Vec<f32> {
        let c = self.model.config();
        if logits.len() < c.n_expert {
            return Vec::new();
        }
        let bias = mw.exp_probs_b.as_deref();
        let mut peak = vec![f32::NEG_INFINITY; c.n_expert];
        for row in logits.chunks_exact(c.n_expert) {
            for (e, (p, q)) in peak.iter_mut().zip(gate_probs(c, row)).enumerate() {
                let b = bias.and_then(|b| b.get(e)).copied().unwrap_or(0.0);
                *p = p.max(q + b);
            }
        }
        peak
    }

    /// Layer `layer`'s router logits for the rows of `acts` (`n_rows * n_expert`), with its MoE
    /// weights; None when it is not a MoE layer.
    fn logits(
        &self,
        layer: usize,
        acts: &ActRows,
    ) -> Result<Option<(Vec<f32>, &MoeWeights)>, ExpertError> {
        let c = self.model.config();
        let e = c.n_embd;
        let FfnWeights::Moe(mw) = &self.model.weights().layers[layer].ffn else {
            return Ok(None);
        };
        let n = acts.n_rows;
        let h = acts.to_f32(e)?;
        let mut logits = vec![0.0f32; n * c.n_expert];
        match &mw.gate_inp_packed {
            Some(packed) => packed.gemm(&h, n, &mut logits, None)?,
            None => matmul(&mw.gate_inp, 0, &h, n, &mut logits, None)
                .map_err(|e| ExpertError::Backend(format!("router of layer {layer}: {e}")))?,
        }
        Ok(Some((logits, mw)))
    }
}

/// A one-layer-ahead prediction ([`NextLayer::predict_scored`]).
pub struct Predicted {
    /// the MoE layer predicted
    pub layer: usize,
    /// the distinct experts its router picks for the call's rows, ascending
    pub experts: Vec<u32>,
    /// per expert, its largest selection score over the call's rows (router probability plus
    /// any selection bias: what [`ColdCache::score`] takes)
    pub peaks: Vec<f32>,
}

/// One-layer-ahead predictor and its I/O thread (module doc).
pub struct Prefetcher {
    model: Arc<Model>,
    next: NextLayer,
    ledger: PrefetchLedger,
    io: Mutex<Sender<(usize, Vec<u32>)>>,
    cold_reads: ColdReads,
    /// the staging cache predictions are read into (None: the page cache)
    cold: Option<Arc<ColdCache>>,
}

impl Prefetcher {
    /// A predictor over `model`'s MoE layers with its I/O thread (which ends with the
    /// predictor), reading cold experts whole ([`ColdReads::WholeExperts`]).
    pub fn new(model: Arc<Model>) -> std::io::Result<Prefetcher> {
        Prefetcher::with_cold_reads(model, ColdReads::default())
    }

    /// [`Prefetcher::new`] with the cold path's read mode. `WholeExperts` advises the mapped
    /// expert tensors `MADV_RANDOM` (this process's mapping only; resident copies are not
    /// affected).
    pub fn with_cold_reads(
        model: Arc<Model>,
        cold_reads: ColdReads,
    ) -> std::io::Result<Prefetcher> {
        if cold_reads == ColdReads::WholeExperts {
            for l in &model.weights().layers {
                if let FfnWeights::Moe(m) = &l.ffn {
                    for w in [&m.gate_exps, &m.up_exps, &m.down_exps] {
                        model.gguf().advise_bytes(w.data(), AccessHint::Random);
                    }
                }
            }
        }
        let next = NextLayer::new(model.clone());
        let ledger = PrefetchLedger::new(next.moe_layers());
        let (tx, rx) = channel::<(usize, Vec<u32>)>();
        let io_model = model.clone();
        let io_counters = ledger.counters.clone();
        std::thread::Builder::new()
            .name("nightshift-prefetch".into())
            .spawn(move || {
                for (layer, experts) in rx {
                    for e in experts {
                        if let Ok(w) = io_model.expert_weights(layer, e) {
                            let g: &Gguf = io_model.gguf();
                            for m in [w.gate.bytes(), w.up.bytes(), w.down.bytes()] {
                                g.advise_bytes(m, AccessHint::WillNeed);
                            }
                            io_counters.advised.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })?;
        Ok(Prefetcher {
            model,
            next,
            ledger,
            io: Mutex::new(tx),
            cold_reads,
            cold: None,
        })
    }

    /// Reads predicted cold experts into `cold` (the staging cache, [`crate::cold`]) instead of
    /// advising the page cache; cold experts a layer needs are then read by the caller
    /// ([`crate::expert::LocalExperts`] with the same cache).
    pub fn with_cold_cache(mut self, cold: Arc<ColdCache>) -> Prefetcher {
        self.cold = Some(cold);
        self
    }

    pub fn cold_reads(&self) -> ColdReads {
        self.cold_reads
    }

    /// Asks the kernel for expert `e` of `layer` now (`MADV_WILLNEED` on its three matrices:
    /// large reads instead of faults; nothing for pages already cached) under
    /// [`ColdReads::WholeExperts`]; nothing under `ReadAround`. Called for a cold expert just
    /// before it is computed.
    pub fn read_now(&self, layer: usize, e: u32) {
        if self.cold_reads != ColdReads::WholeExperts || self.cold.is_some() {
            return;
        }
        if let Ok(w) = self.model.expert_weights(layer, e) {
            let g = self.model.gguf();
            for m in [w.gate.bytes(), w.up.bytes(), w.down.bytes()] {
                g.advise_bytes(m, AccessHint::WillNeed);
            }
        }
    }

    /// A cold expert about to be computed for a call of `rows` rows: [`Prefetcher::read_now`]
    /// for calls [`Prefetcher::on_layer`] did not already cover (more than
    /// [`MAX_PREDICTED_ROWS`] rows: prefill chunks). A decode step's cold experts were all
    /// requested by the prediction or advised as its layer started, so asking again would
    /// only add three system calls per expert and layer.
    pub fn before_compute(&self, layer: usize, e: u32, rows: usize) {
        if rows > MAX_PREDICTED_ROWS {
            self.read_now(layer, e);
        }
    }

    pub fn stats(&self) -> PrefetchStats {
        self.ledger.stats()
    }

    /// Called at the start of MoE layer `layer`'s expert call: scores the prediction made for
    /// it, then predicts the next MoE layer from `acts` and requests its cold experts.
    /// `resident(layer, expert)` says whether an expert is in memory already.
    pub fn on_layer(
        &self,
        layer: usize,
        acts: &ActRows,
        pairs: &[ExpertPair],
        resident: &dyn Fn(usize, u32) -> bool,
    ) -> Result<(), ExpertError> {
        let used: Vec<u32> = pairs.iter().map(|p| p.expert).collect();
        let requested = self
            .ledger
            .call(layer, &used, &|e| !resident(layer, e), &|e| {
                self.cached(layer, e)
            });
        if self.cold_reads == ColdReads::WholeExperts
            && self.cold.is_none()
            && acts.n_rows <= MAX_PREDICTED_ROWS
        {
            // the cold experts the prediction missed: all of them asked for at once, before the
            // first is computed
            let mut missed: Vec<u32> = used
                .iter()
                .copied()
                .filter(|&e| !resident(layer, e) && !requested.contains(&e))
                .collect();
            missed.sort_unstable();
            missed.dedup();
            for &e in &missed {
                self.read_now(layer, e);
            }
            self.ledger
                .counters
                .demand
                .fetch_add(missed.len() as u64, Ordering::Relaxed);
        }
        if let Some(cold) = &self.cold {
            // the first MoE layer has no prediction to score it: its own router does
            if self.next.moe_layers().first() == Some(&layer) && acts.n_rows <= MAX_PREDICTED_ROWS {
                cold.score(layer, &self.next.router_peaks(layer, acts)?);
            }
        }
        let Some(p) = self.next.predict_scored(layer, acts)? else {
            return Ok(());
        };
        let (next, predicted) = (p.layer, p.experts);
        if let Some(cold) = &self.cold {
            // scored before the reads make room: what is read ahead is what is kept
            cold.score(next, &p.peaks);
            self.ledger
                .read_ahead(cold, next, &predicted, &|e| resident(next, e))?;
            return Ok(());
        }
        let requested: Vec<u32> = predicted
            .iter()
            .copied()
            .filter(|&e| !resident(next, e))
            .collect();
        if !requested.is_empty() {
            let tx = self.io.lock().unwrap_or_else(|p| p.into_inner());
            // the I/O thread only ends with the predictor: a send cannot fail before that
            let _ = tx.send((next, requested.clone()));
        }
        self.ledger.predicted(next, &predicted, &requested);
        Ok(())
    }

    /// Whether all pages of expert `e` of `layer` are in the page cache (false when it cannot
    /// be told).
    fn cached(&self, layer: usize, e: u32) -> bool {
        if let Some(cold) = &self.cold {
            return cold.is_ready(layer, e);
        }
        let Ok(w) = self.model.expert_weights(layer, e) else {
            return false;
        };
        let g = self.model.gguf();
        [w.gate.bytes(), w.up.bytes(), w.down.bytes()]
            .iter()
            .all(|m| g.is_cached(m) == Some(true))
    }
}
