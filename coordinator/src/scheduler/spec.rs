//! Speculative decoding in the scheduler: the [`Speculator`] the engine thread consults every
//! step. It asks the drafter (`nightshift_model::spec`) for each decoding sequence's likely next
//! tokens, lets the policy choose how many of them ride in the step (from measured step times
//! by rows and each sequence's recent acceptance), and counts what was drafted and accepted per
//! drafter in `/metrics`. The verification itself (sampling every row in order, stopping at the
//! first token that differs from the draft, cutting the KV cache back) is in `engine_loop.rs`.

use nightshift_model::spec::ngram::predicted_output;
use nightshift_model::spec::policy::{plan, Candidate};
use nightshift_model::spec::{
    DraftKind, DraftRequest, Drafter, DrafterRecord, SeqAcceptance, StepTimes,
};

/// Running totals of the engine thread's steps, shared with the `Scheduler` handle so a
/// benchmark can say where a workload's time went: how many steps carried drafts, how many
/// rows they had, and the time spent in `forward` against the time spent drafting and
/// planning (the part of a step speculation adds even when it drafts nothing).
#[derive(Debug, Default)]
pub struct Tally(std::sync::Mutex<Counts>);

/// A [`Tally`]'s totals at one moment; [`Counts::since`] gives a run's share.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub steps: u64,
    pub rows: u64,
    /// Steps with at least one draft row, and the draft rows.
    pub draft_steps: u64,
    pub draft_rows: u64,
    /// Draft tokens accepted (by verification).
    pub accepted: u64,
    pub forward_nanos: u64,
    /// Plain decode steps (one row per decoding sequence, no prefill, no drafts) and their
    /// `forward` time: the same steps with and without speculation.
    pub plain_steps: u64,
    pub plain_nanos: u64,
    /// Drafting and the policy (`Speculator::drafts` and the grammar cut), per step.
    pub drafting_nanos: u64,
    /// Whole steps (drafting, forward, sampling and verification, cache cuts).
    pub step_nanos: u64,
}

impl Counts {
    fn fields(&mut self) -> [&mut u64; 10] {
        [
            &mut self.steps,
            &mut self.rows,
            &mut self.draft_steps,
            &mut self.draft_rows,
            &mut self.accepted,
            &mut self.forward_nanos,
            &mut self.plain_steps,
            &mut self.plain_nanos,
            &mut self.drafting_nanos,
            &mut self.step_nanos,
        ]
    }

    /// What was counted after `earlier`.
    pub fn since(&self, earlier: &Counts) -> Counts {
        let mut out = *self;
        let mut earlier = *earlier;
        for (x, e) in out.fields().into_iter().zip(earlier.fields()) {
            *x = x.saturating_sub(*e);
        }
        out
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Counts) {
        let mut other = *other;
        for (x, o) in self.fields().into_iter().zip(other.fields()) {
            *x += *o;
        }
    }
}

/// What one engine step was, for [`Tally::step`].
pub struct StepShape {
    pub rows: usize,
    /// Rows that are one decoding sequence's next token (the rest are drafts and prefill).
    pub decode_rows: usize,
    pub draft_rows: usize,
    pub forward: std::time::Duration,
    pub drafting: std::time::Duration,
}

fn nanos(d: std::time::Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

impl Tally {
    fn with(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A step computed (its `forward` succeeded).
    pub fn step(&self, s: &StepShape) {
        self.with(|c| {
            c.steps += 1;
            c.rows += s.rows as u64;
            if s.draft_rows > 0 {
                c.draft_steps += 1;
                c.draft_rows += s.draft_rows as u64;
            }
            if s.draft_rows == 0 && s.rows == s.decode_rows {
                c.plain_steps += 1;
                c.plain_nanos += nanos(s.forward);
            }
            c.forward_nanos += nanos(s.forward);
            c.drafting_nanos += nanos(s.drafting);
        })
    }

    /// A step ended, `whole` after it began (drafting, forward, verification).
    pub fn step_ended(&self, whole: std::time::Duration) {
        self.with(|c| c.step_nanos += nanos(whole))
    }

    /// `n` draft tokens were accepted.
    pub fn accepted(&self, n: usize) {
        self.with(|c| c.accepted += n as u64)
    }

    pub fn counts(&self) -> Counts {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A sequence's speculation state.
#[derive(Debug, Default)]
pub struct SeqSpec {
    /// Key the drafter knows the sequence by.
    pub key: u64,
    pub acceptance: SeqAcceptance,
    /// The request's `prediction`, tokenized, after the prompt's end it follows (an extra
    /// lookup source, [`nightshift_model::spec::ngram::predicted_output`]).
    pub prediction: Vec<u32>,
    /// Where the prediction itself starts in `prediction`.
    pub prediction_from: usize,
    /// Draft tokens verified and accepted / rejected, for the response's usage (the engine
    /// thread counts them row by row).
    pub accepted: u32,
    pub rejected: u32,
}

/// What the engine thread asks for one sequence.
pub struct Ask<'a> {
    pub index: usize,
    pub spec: &'a mut SeqSpec,
    pub tokens: &'a [u32],
    /// Most draft tokens this sequence may carry (remaining budget, context room).
    pub room: usize,
}

/// The drafter, the step-time table and the policy switches of one scheduler.
pub struct Speculator {
    drafter: Box<dyn Drafter>,
    times: StepTimes,
    /// A draft model's time per drafted token by the sequences drafting together (its catch-up
    /// on the tokens accepted since it last drafted included), for the policy.
    draft_times: StepTimes,
    draft_max: usize,
    /// false: every available draft token (up to `draft_max`) rides, whatever it costs (tests,
    /// and the benchmark's forced curve).
    gated: bool,
    next_key: u64,
    kind: &'static str,
    /// The drafter's acceptance over every sequence's verifications and over their first
    /// ones: new sequences start from it ([`DrafterRecord::seed`]).
    record: DrafterRecord,
}

impl Speculator {
    /// Speculation with `drafter`, at most `draft_max` draft tokens per sequence and step,
    /// gated by the policy (`gated`) or always on.
    pub fn new(drafter: Box<dyn Drafter>, draft_max: usize, gated: bool) -> Speculator {
        let kind = drafter.kind().name();
        // every series exists from the start, so a scrape never misses one
        metrics::counter!("nightshift_spec_drafted_tokens_total", "drafter" => kind).increment(0);
        metrics::counter!("nightshift_spec_accepted_tokens_total", "drafter" => kind).increment(0);
        Speculator {
            drafter,
            times: StepTimes::new(),
            draft_times: StepTimes::new(),
            draft_max,
            gated,
            next_key: 0,
            kind,
            record: DrafterRecord::default(),
        }
    }

    pub fn kind(&self) -> DraftKind {
        self.drafter.kind()
    }

    /// The measured step time by rows.
    pub fn times(&self) -> &StepTimes {
        &self.times
    }

    /// A sequence starts: its state, with the drafter told its prompt.
    pub fn begin(&mut self, prompt: &[u32], prediction: Vec<u32>) -> SeqSpec {
        self.next_key += 1;
        self.drafter.begin(self.next_key, prompt);
        let (prediction, prediction_from) = predicted_output(prompt, &prediction);
        SeqSpec {
            key: self.next_key,
            acceptance: self.record.seed(!prediction.is_empty()),
            prediction,
            prediction_from,
            ..SeqSpec::default()
        }
    }

    /// A sequence ended holding `tokens`.
    pub fn end(&mut self, spec: &SeqSpec, tokens: &[u32]) {
        self.drafter.end(spec.key, tokens);
    }

    /// The draft tokens of each asked sequence for a step whose other rows number `base`
    /// (indexed like `asks`; empty = no draft). The engine loop then cuts a constrained
    /// sequence's draft before the first token its grammar refuses (`plan_drafts`); each row
    /// left is sampled under its own mask at verification (`engine_loop/masks.rs`).
    pub fn drafts(&mut self, base: usize, asks: &mut [Ask]) -> Vec<Vec<u32>> {
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); asks.len()];
        // a model drafter costs a step per token: plan first, draft only what rides (all
        // sequences together); lookups are cheap: draft first, plan over what they found
        let model = self.drafter.kind() == DraftKind::Draft;
        let mut found: Vec<Vec<u32>> = vec![Vec::new(); asks.len()];
        if !model {
            let maxes: Vec<usize> = asks.iter().map(|a| a.room.min(self.draft_max)).collect();
            found = self.ask_all(asks, &maxes);
        }
        let cands: Vec<Candidate> = asks
            .iter()
            .zip(&found)
            .map(|(a, f)| {
                let available = if model {
                    a.room.min(self.draft_max)
                } else {
                    f.len()
                };
                Candidate::of(a.spec.acceptance.current(), available)
            })
            .collect();
        let take = if self.gated {
            plan(
                &self.times,
                base,
                &cands,
                model.then_some(&self.draft_times),
            )
        } else {
            cands.iter().map(Candidate::available).collect()
        };
        if model {
            let started = std::time::Instant::now();
            found = self.ask_all(asks, &take);
            // one draft-model step per token of the longest draft, as wide as those drafting
            let (steps, width) = (
                take.iter().copied().max().unwrap_or(0),
                take.iter().filter(|&&k| k > 0).count(),
            );
            if steps > 0 {
                let per_step = started.elapsed().as_secs_f64() / steps as f64;
                self.draft_times.record(width, per_step);
            }
        }
        for (i, a) in asks.iter_mut().enumerate() {
            let mut k = take[i];
            if k == 0 && cands[i].available() > 0 {
                // a lookup's draft is already found: a due probe rides one token of it
                // (a draft model's was not drafted, and would cost its own steps)
                if a.spec
                    .acceptance
                    .record
                    .skipped(self.record.recent(), !model)
                {
                    k = 1;
                }
            }
            if k == 0 {
                continue;
            }
            let mut d = std::mem::take(&mut found[i]);
            d.truncate(k);
            out[i] = d;
        }
        out
    }

    /// Each ask's draft of at most `maxes[i]` tokens (none where it is 0), from one call of the
    /// drafter for all of them.
    fn ask_all(&mut self, asks: &mut [Ask], maxes: &[usize]) -> Vec<Vec<u32>> {
        let who: Vec<usize> = (0..asks.len()).filter(|&i| maxes[i] > 0).collect();
        let reqs: Vec<DraftRequest> = who
            .iter()
            .map(|&i| DraftRequest {
                key: asks[i].spec.key,
                tokens: asks[i].tokens,
                extra: &asks[i].spec.prediction,
                extra_from: asks[i].spec.prediction_from,
                max: maxes[i],
            })
            .collect();
        let got = if reqs.is_empty() {
            Vec::new()
        } else {
            self.drafter.draft_many(&reqs)
        };
        let mut out = vec![Vec::new(); asks.len()];
        for (&i, res) in who.iter().zip(got) {
            match res {
                Ok(d) => out[i] = d,
                Err(e) => {
                    tracing::warn!(drafter = self.kind, error = %e, "drafting failed; no draft this step");
                }
            }
        }
        out
    }

    /// A step of `rows` rows took `secs`.
    pub fn record_step(&mut self, rows: usize, secs: f64) {
        self.times.record(rows, secs);
    }

    /// A sequence's verification: `drafted` draft tokens, the first `accepted` accepted.
    pub fn verified(&mut self, spec: &mut SeqSpec, drafted: usize, accepted: usize) {
        self.record
            .verified(&mut spec.acceptance, drafted, accepted);
        metrics::counter!("nightshift_spec_drafted_tokens_total", "drafter" => self.kind)
            .increment(drafted as u64);
        metrics::counter!("nightshift_spec_accepted_tokens_total", "drafter" => self.kind)
            .increment(accepted as u64);
    }
}
