//! How one-layer-ahead predictions fared ([`PrefetchLedger`]): the one scoring of predictions
//! for the in-process [`Prefetcher`](super::Prefetcher) and for expert nodes taking the
//! coordinator's hints (`nightshift-expert-node`), and the one hand-over of predicted cold
//! experts to a staging cache ([`PrefetchLedger::read_ahead`]).
//!
//! A prediction for MoE layer `l` opens a *round* of `l`; the calls of `l` that follow score
//! it: each distinct expert they use counts once per round (used, and cold: requested before
//! the call or not, and then in time or late by whether it was in memory as the call started).
//! A layer may be called more than once per engine step (two micro-batches, or a node's share
//! of each), and a node may receive two predictions for one layer (one per micro-batch) before
//! either call: they merge into one round while none of its calls has started (its predicted
//! experts are counted when the first one does). A round is closed (its requested experts no
//! call used counted *wasted*) by the next prediction for its layer once a call of it has
//! started, or by a call of the layer before it (the next engine step has begun); calls of a
//! layer with no open round (prefill chunks, which are not predicted) are not scored.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::PrefetchStats;
use crate::cold::ColdCache;
use crate::error::ExpertError;

#[derive(Default)]
pub(super) struct Counters {
    pub(super) predicted: AtomicU64,
    pub(super) predicted_used: AtomicU64,
    pub(super) used: AtomicU64,
    pub(super) cold_needed: AtomicU64,
    pub(super) cold_requested: AtomicU64,
    pub(super) advised: AtomicU64,
    pub(super) issued: AtomicU64,
    pub(super) in_time: AtomicU64,
    pub(super) late: AtomicU64,
    pub(super) wasted: AtomicU64,
    pub(super) demand: AtomicU64,
}

/// The predictions of one layer not yet closed.
#[derive(Default)]
struct Round {
    /// predicted experts, sorted and distinct
    predicted: Vec<u32>,
    /// of those, the cold ones requested (read ahead)
    requested: Vec<u32>,
    /// distinct experts the round's calls used so far
    used: Vec<u32>,
    /// a call of the layer has been scored against it
    started: bool,
}

/// Predictions waiting for their layers and the counters of how they fared (module doc).
pub struct PrefetchLedger {
    /// the MoE layer before each layer (None: the first, or not MoE)
    prev_moe: Vec<Option<usize>>,
    rounds: Mutex<HashMap<usize, Round>>,
    pub(super) counters: Arc<Counters>,
}

impl PrefetchLedger {
    /// A ledger over a model whose MoE layers are `moe_layers` (ascending).
    pub fn new(moe_layers: &[usize]) -> PrefetchLedger {
        let n = moe_layers.iter().max().map_or(0, |&l| l + 1);
        let mut prev_moe = vec![None; n];
        for w in moe_layers.windows(2) {
            prev_moe[w[1]] = Some(w[0]);
        }
        PrefetchLedger {
            prev_moe,
            rounds: Mutex::new(HashMap::new()),
            counters: Arc::new(Counters::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<usize, Round>> {
        self.rounds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a round's requested experts no call used as wasted.
    fn close(&self, r: Round) {
        let wasted = r.requested.iter().filter(|e| !r.used.contains(e)).count() as u64;
        self.counters.wasted.fetch_add(wasted, Ordering::Relaxed);
    }

    /// A prediction for `layer`: the experts `predicted` (any order, repeats allowed), of which
    /// `requested` (cold ones) were asked to be read ahead.
    pub fn predicted(&self, layer: usize, predicted: &[u32], requested: &[u32]) {
        let mut rounds = self.lock();
        if rounds.get(&layer).is_some_and(|r| r.started) {
            if let Some(old) = rounds.remove(&layer) {
                self.close(old);
            }
        }
        let r = rounds.entry(layer).or_default();
        let mut fresh = 0u64;
        for &e in requested {
            if !r.requested.contains(&e) {
                r.requested.push(e);
                fresh += 1;
            }
        }
        r.predicted.extend_from_slice(predicted);
        r.predicted.sort_unstable();
        r.predicted.dedup();
        self.counters.issued.fetch_add(fresh, Ordering::Relaxed);
    }

    /// A call of `layer` using `experts` (any order, repeats allowed) is starting: closes the
    /// started round of the next MoE layer (a new step has begun) and scores this layer's
    /// round, `cold(e)` telling whether expert `e` is outside the resident set and `ready(e)`
    /// whether it is in memory now. Returns the cold experts the round had requested (empty
    /// without one).
    pub fn call(
        &self,
        layer: usize,
        experts: &[u32],
        cold: &dyn Fn(u32) -> bool,
        ready: &dyn Fn(u32) -> bool,
    ) -> Vec<u32> {
        let mut rounds = self.lock();
        let next = (layer + 1..self.prev_moe.len()).find(|&l| self.prev_moe[l] == Some(layer));
        if let Some(next) = next {
            if rounds.get(&next).is_some_and(|r| r.started) {
                if let Some(old) = rounds.remove(&next) {
                    self.close(old);
                }
            }
        }
        let Some(r) = rounds.get_mut(&layer) else {
            return Vec::new();
        };
        let c = &self.counters;
        if !r.started {
            // no prediction merges into a started round: its predicted set is final
            r.started = true;
            c.predicted
                .fetch_add(r.predicted.len() as u64, Ordering::Relaxed);
        }
        let mut fresh: Vec<u32> = experts
            .iter()
            .copied()
            .filter(|e| !r.used.contains(e))
            .collect();
        fresh.sort_unstable();
        fresh.dedup();
        let hit = fresh
            .iter()
            .filter(|e| r.predicted.binary_search(e).is_ok())
            .count() as u64;
        let (mut needed, mut requested, mut in_time) = (0u64, 0u64, 0u64);
        for &e in &fresh {
            if !cold(e) {
                continue;
            }
            needed += 1;
            if r.requested.contains(&e) {
                requested += 1;
                in_time += ready(e) as u64;
            }
        }
        r.used.extend_from_slice(&fresh);
        c.predicted_used.fetch_add(hit, Ordering::Relaxed);
        c.used.fetch_add(fresh.len() as u64, Ordering::Relaxed);
        c.cold_needed.fetch_add(needed, Ordering::Relaxed);
        c.cold_requested.fetch_add(requested, Ordering::Relaxed);
        c.in_time.fetch_add(in_time, Ordering::Relaxed);
        c.late.fetch_add(requested - in_time, Ordering::Relaxed);
        r.requested.clone()
    }

    /// Hands the experts of `predicted` for `layer` that are not resident (`resident(e)`) to
    /// `cache` as predictions (read ahead where there is room, after the reads calls wait
    /// for) and opens their round. Returns how many were requested.
    pub fn read_ahead(
        &self,
        cache: &ColdCache,
        layer: usize,
        predicted: &[u32],
        resident: &dyn Fn(u32) -> bool,
    ) -> Result<usize, ExpertError> {
        let mut requested: Vec<u32> = predicted
            .iter()
            .copied()
            .filter(|&e| !resident(e))
            .collect();
        requested.sort_unstable();
        requested.dedup();
        if !requested.is_empty() {
            cache.prefetch(layer, &requested)?;
            self.counters
                .advised
                .fetch_add(requested.len() as u64, Ordering::Relaxed);
        }
        self.predicted(layer, predicted, &requested);
        Ok(requested.len())
    }

    /// The counters so far (rounds still open count their scored calls, not yet their waste).
    pub fn stats(&self) -> PrefetchStats {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PrefetchStats {
            predicted: g(&c.predicted),
            predicted_used: g(&c.predicted_used),
            used: g(&c.used),
            cold_needed: g(&c.cold_needed),
            cold_requested: g(&c.cold_requested),
            advised: g(&c.advised),
            issued: g(&c.issued),
            in_time: g(&c.in_time),
            late: g(&c.late),
            wasted: g(&c.wasted),
            demand: g(&c.demand),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never(_: u32) -> bool {
        false
    }

    #[test]
    fn micro_batch_predictions_merge_and_a_new_step_closes_the_round() {
        // MoE layers 1, 2, 3; every expert cold, expert 7 in memory
        let l = PrefetchLedger::new(&[1, 2, 3]);
        let cold = |_| true;
        let ready = |e| e == 7;
        // step 1: both halves' calls of layer 1 predict layer 2
        assert!(l.call(1, &[0, 1], &cold, &ready).is_empty(), "no round");
        l.predicted(2, &[7, 8], &[7, 8]);
        l.predicted(2, &[8, 9], &[8, 9]);
        assert_eq!(l.stats().issued, 3, "8 is requested once");
        // the halves' calls of layer 2: 7 in time, 9 late, 5 not requested, 8 unused
        assert_eq!(l.call(2, &[7, 5, 7], &cold, &ready), vec![7, 8, 9]);
        l.call(2, &[9, 7], &cold, &ready);
        let s = l.stats();
        assert_eq!((s.used, s.cold_needed, s.cold_requested), (3, 3, 2));
        assert_eq!((s.in_time, s.late, s.predicted_used), (1, 1, 2));
        assert_eq!((s.wasted, s.predicted), (0, 3), "the round is still open");
        // the next step's call of layer 1 closes layer 2's round: 8 was wasted
        l.call(1, &[0], &cold, &ready);
        let s = l.stats();
        assert_eq!((s.wasted, s.predicted), (1, 3));
        // a prefill call of layer 2 without a prediction is not scored
        l.call(2, &[1, 2, 3], &cold, &ready);
        assert_eq!(l.stats().used, 3);
    }

    #[test]
    fn a_prediction_after_a_started_round_closes_it() {
        let l = PrefetchLedger::new(&[0, 4]);
        l.predicted(4, &[1, 2], &[2]);
        l.call(4, &[1], &|e| e == 1, &never);
        // no call of layer 0 came (a node that held none of its experts): the next prediction
        // for layer 4 closes the round instead
        l.predicted(4, &[3], &[3]);
        let s = l.stats();
        assert_eq!((s.wasted, s.predicted, s.issued), (1, 2, 2));
        assert_eq!((s.cold_needed, s.cold_requested, s.late), (1, 0, 0));
    }
}
