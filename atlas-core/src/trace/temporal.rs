//! Temporal locality of routing: how many of a token's experts were also chosen by the previous
//! token of the same sequence, and by any of the previous [`LOCALITY_WINDOW`] tokens (published
//! for Qwen3-30B-A3B: ~45% and ~80%). Counts are kept per MoE layer in [`Temporal`], an optional
//! section of the atlas file; [`TemporalTracker`] computes them from routing seen one sequence at
//! a time in token order (`nightshift-atlas record --model`; the coordinator's batches mix
//! sequences, so its atlases carry no such section).
//!
//! The same recording keeps the decode tokens' routing itself, in order ([`Temporal::trace`], at
//! most [`TRACE_TOKENS`] tokens): what a cache of experts would have hit depends on the order
//! of uses, not only their counts, so `nightshift-atlas plan --memory-budget` replays it to
//! choose how much of a budget stays a fixed resident set and how much follows the recent past
//! (the staging cache's LRU).

use serde::{Deserialize, Serialize};

/// Tokens of history the windowed statistic looks back over.
pub const LOCALITY_WINDOW: usize = 8;

/// Decode tokens whose routing [`TemporalTracker`] keeps in [`Temporal::trace`] (the first ones
/// seen): ~2 MB of atlas for a 61-layer, top-8 model.
pub const TRACE_TOKENS: usize = 2048;

/// Temporal locality counts, one entry per MoE layer (the atlas's slots).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Temporal {
    /// tokens that had a previous token in their sequence
    pub lag1_tokens: Vec<u64>,
    /// experts of those tokens that the previous token also chose
    pub lag1_shared: Vec<u64>,
    /// tokens that had at least `window` previous tokens
    pub window_tokens: Vec<u64>,
    /// experts of those tokens chosen by at least one of the `window` previous tokens
    pub window_shared: Vec<u64>,
    pub window: usize,
    /// The routing of decode tokens (steps of one row) in token order, per MoE layer:
    /// `trace[s]` holds `top_k` expert ids per token, the same tokens in every layer (empty in
    /// atlases recorded without it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trace: Vec<Vec<u16>>,
}

impl Temporal {
    /// Fraction of a token's experts the previous token also chose, in slot `s` (None: no data).
    pub fn lag1(&self, s: usize, top_k: usize) -> Option<f64> {
        rate(self.lag1_shared.get(s)?, self.lag1_tokens.get(s)?, top_k)
    }

    /// Fraction of a token's experts chosen within the previous `window` tokens, in slot `s`.
    pub fn within_window(&self, s: usize, top_k: usize) -> Option<f64> {
        rate(
            self.window_shared.get(s)?,
            self.window_tokens.get(s)?,
            top_k,
        )
    }

    /// Both rates over all slots (None when nothing was counted).
    pub fn overall(&self, top_k: usize) -> (Option<f64>, Option<f64>) {
        let sum = |v: &[u64]| v.iter().sum::<u64>();
        (
            rate(&sum(&self.lag1_shared), &sum(&self.lag1_tokens), top_k),
            rate(&sum(&self.window_shared), &sum(&self.window_tokens), top_k),
        )
    }

    /// Decode tokens in [`Temporal::trace`].
    pub fn trace_tokens(&self, top_k: usize) -> usize {
        match self.trace.first() {
            Some(t) if top_k > 0 => t.len() / top_k,
            _ => 0,
        }
    }

    /// Consistency with an atlas of `n` slots of `n_experts` and `top_k`: a reason when
    /// inconsistent.
    pub(crate) fn check(
        &self,
        n: usize,
        n_experts: usize,
        top_k: usize,
    ) -> Result<(), (String, String, String)> {
        for (name, v) in [
            ("lag1_tokens", &self.lag1_tokens),
            ("lag1_shared", &self.lag1_shared),
            ("window_tokens", &self.window_tokens),
            ("window_shared", &self.window_shared),
        ] {
            if v.len() != n {
                return Err((
                    format!("temporal.{name}"),
                    format!("{n} layers"),
                    v.len().to_string(),
                ));
            }
        }
        if self.window == 0 {
            return Err(("temporal.window".into(), "at least 1".into(), "0".into()));
        }
        if !self.trace.is_empty() {
            if self.trace.len() != n {
                return Err((
                    "temporal.trace".into(),
                    format!("{n} layers"),
                    self.trace.len().to_string(),
                ));
            }
            let len = self.trace[0].len();
            for (s, t) in self.trace.iter().enumerate() {
                if t.len() != len || top_k == 0 || len % top_k != 0 {
                    return Err((
                        format!("temporal.trace[{s}]"),
                        format!("the same whole number of {top_k}-expert tokens in every layer ({len} ids in layer 0)"),
                        format!("{} ids", t.len()),
                    ));
                }
                if let Some(&e) = t.iter().find(|&&e| e as usize >= n_experts) {
                    return Err((
                        format!("temporal.trace[{s}]"),
                        format!("expert ids below {n_experts}"),
                        e.to_string(),
                    ));
                }
            }
        }
        for s in 0..n {
            for (name, shared, tokens) in [
                ("lag1_shared", self.lag1_shared[s], self.lag1_tokens[s]),
                (
                    "window_shared",
                    self.window_shared[s],
                    self.window_tokens[s],
                ),
            ] {
                if tokens
                    .checked_mul(top_k as u64)
                    .is_none_or(|max| shared > max)
                {
                    return Err((
                        format!("temporal.{name}[{s}]"),
                        format!("at most top_k x tokens = {top_k} x {tokens}"),
                        shared.to_string(),
                    ));
                }
            }
        }
        Ok(())
    }
}

fn rate(shared: &u64, tokens: &u64, top_k: usize) -> Option<f64> {
    (*tokens > 0 && top_k > 0).then(|| *shared as f64 / (*tokens as f64 * top_k as f64))
}

/// Counts [`Temporal`] from routing in token order, one sequence at a time: `reset` when a new
/// sequence starts, then `observe` each step's rows of each MoE layer.
#[derive(Clone, Debug)]
pub struct TemporalTracker {
    top_k: usize,
    /// per slot, the expert sets of the last `window` tokens, newest last
    history: Vec<Vec<Vec<u32>>>,
    counts: Temporal,
    /// an expert id above `u16::MAX` was seen: the trace is off for good
    untraceable: bool,
}

impl TemporalTracker {
    pub fn new(n_slots: usize, top_k: usize) -> TemporalTracker {
        TemporalTracker {
            top_k,
            history: vec![Vec::new(); n_slots],
            counts: Temporal {
                lag1_tokens: vec![0; n_slots],
                lag1_shared: vec![0; n_slots],
                window_tokens: vec![0; n_slots],
                window_shared: vec![0; n_slots],
                window: LOCALITY_WINDOW,
                trace: vec![Vec::new(); n_slots],
            },
            untraceable: false,
        }
    }

    /// A new sequence starts: earlier tokens are no one's predecessors.
    pub fn reset(&mut self) {
        for h in &mut self.history {
            h.clear();
        }
    }

    /// The rows of one step of MoE slot `slot`, row-major `[rows x top_k]`, in token order.
    /// Rows of a wrong length or an unknown slot are ignored (the recorder reports those).
    pub fn observe(&mut self, slot: usize, experts: &[usize]) {
        let k = self.top_k;
        let Some(hist) = self.history.get_mut(slot) else {
            return;
        };
        if k == 0 || experts.len() % k != 0 {
            return;
        }
        let w = self.counts.window;
        // a decode step (one row) of a token the trace still has room for
        if experts.len() == k
            && !self.untraceable
            && self.counts.trace[slot].len() < TRACE_TOKENS * k
        {
            if experts.iter().all(|&e| e <= u16::MAX as usize) {
                self.counts.trace[slot].extend(experts.iter().map(|&e| e as u16));
            } else {
                // ids the trace cannot hold: no trace rather than layers that disagree
                self.untraceable = true;
                self.counts.trace.iter_mut().for_each(|t| *t = Vec::new());
            }
        }
        for row in experts.chunks_exact(k) {
            if let Some(prev) = hist.last() {
                let shared = row.iter().filter(|&&x| prev.contains(&(x as u32))).count();
                self.counts.lag1_tokens[slot] += 1;
                self.counts.lag1_shared[slot] += shared as u64;
            }
            if hist.len() >= w {
                let shared = row
                    .iter()
                    .filter(|&&x| hist.iter().any(|h| h.contains(&(x as u32))))
                    .count();
                self.counts.window_tokens[slot] += 1;
                self.counts.window_shared[slot] += shared as u64;
            }
            // reuse the oldest set's allocation for the newest
            let mut set = if hist.len() >= w {
                hist.remove(0)
            } else {
                Vec::with_capacity(k)
            };
            set.clear();
            set.extend(row.iter().map(|&x| x as u32));
            hist.push(set);
        }
    }

    pub fn snapshot(&self) -> Temporal {
        self.counts.clone()
    }
}
