//! When speculation pays: a running table of measured step times by rows ([`StepTimes`]), each
//! sequence's recent acceptance ([`Acceptance`]), and [`plan`], which picks how many draft
//! tokens each sequence's row carries so that the expected tokens per second of the step is
//! highest, against the same step without drafts. With no drafts accepted (no overlap) or a
//! full batch (a step already bandwidth efficient, so extra rows cost time) it chooses none:
//! speculation turns itself off from measurements, not a constant.

/// Step wall time by rows, a running mean per row count (exponentially weighted, so drift is
/// followed). Rows never measured are interpolated between measured neighbours; past the
/// largest measured count the cost of a row is extrapolated optimistically, so a step with
/// more rows gets tried and measured.
#[derive(Clone, Debug, Default)]
pub struct StepTimes {
    /// Index = rows; (mean seconds, samples).
    by_rows: Vec<(f64, u32)>,
}

/// Weight of a new sample in the running mean (after the first few).
const EWMA: f64 = 0.2;
/// Assumed cost of one more row past the measured ones, as a share of the mean per-row cost
/// of the largest measured step: optimistic, so drafting is tried at all.
const EXPLORE_ROW: f64 = 0.25;

impl StepTimes {
    pub fn new() -> StepTimes {
        StepTimes::default()
    }

    /// Records a step of `rows` rows that took `secs`.
    pub fn record(&mut self, rows: usize, secs: f64) {
        if rows == 0 || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        if self.by_rows.len() <= rows {
            self.by_rows.resize(rows + 1, (0.0, 0));
        }
        let e = &mut self.by_rows[rows];
        e.1 = e.1.saturating_add(1);
        // a plain mean for the first samples, then a running one
        let w = (1.0 / e.1 as f64).max(EWMA);
        e.0 += w * (secs - e.0);
    }

    /// The measured mean for `rows`, if any.
    pub fn measured(&self, rows: usize) -> Option<f64> {
        self.by_rows.get(rows).filter(|e| e.1 > 0).map(|e| e.0)
    }

    /// The expected time of a step of `rows` rows (None before any step was measured).
    pub fn estimate(&self, rows: usize) -> Option<f64> {
        if let Some(t) = self.measured(rows) {
            return Some(t);
        }
        let below = (1..rows.min(self.by_rows.len()))
            .rev()
            .find_map(|r| self.measured(r).map(|t| (r, t)));
        let above = (rows + 1..self.by_rows.len()).find_map(|r| self.measured(r).map(|t| (r, t)));
        match (below, above) {
            (Some((a, ta)), Some((b, tb))) => {
                Some(ta + (tb - ta) * (rows - a) as f64 / (b - a) as f64)
            }
            (Some((a, ta)), None) => Some(ta + EXPLORE_ROW * ta / a as f64 * (rows - a) as f64),
            // below the smallest measured count a step costs at most as much
            (None, Some((_, tb))) => Some(tb),
            (None, None) => None,
        }
    }

    /// (rows, mean seconds, samples) of every measured row count, for reports.
    pub fn curve(&self) -> Vec<(usize, f64, u32)> {
        self.by_rows
            .iter()
            .enumerate()
            .filter(|(_, e)| e.1 > 0)
            .map(|(r, e)| (r, e.0, e.1))
            .collect()
    }
}

/// A sequence's recent acceptance: the chance that its next draft token is accepted, from
/// decayed counts of draft tokens accepted and tried (a prior of one each way: 0.5 at first).
#[derive(Clone, Copy, Debug)]
pub struct Acceptance {
    accepted: f64,
    tried: f64,
    /// Steps since it last drafted (its estimate relaxes toward the prior so it is retried).
    idle: u32,
}

impl Default for Acceptance {
    fn default() -> Self {
        Acceptance {
            accepted: 0.0,
            tried: 0.0,
            idle: 0,
        }
    }
}

/// Decay of the counts per verification (recent steps weigh most).
const DECAY: f64 = 0.7;
/// Most tries a new sequence's seeded counts are worth ([`Acceptance::seeded`]).
const PRIOR_TRIES: f64 = 3.0;

impl Acceptance {
    /// The probability that the next draft token is accepted.
    pub fn rate(&self) -> f64 {
        (self.accepted + 1.0) / (self.tried + 2.0)
    }

    /// After a verification of `drafted` tokens of which the first `accepted` were accepted.
    pub fn update(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        // accepted tokens, then the one rejected (a full acceptance rejected none)
        let tried = accepted + usize::from(accepted < drafted);
        self.accepted = self.accepted * DECAY + accepted as f64;
        self.tried = self.tried * DECAY + tried as f64;
        self.idle = 0;
    }

    /// A new sequence's start from the drafter's recent record (`recent`, its verifications
    /// over all sequences): the same rate evidence, worth at most [`PRIOR_TRIES`] tries, so a
    /// drafter whose drafts were all rejected lately does not make every new request pay for
    /// trying again, and one that is usually right drafts from the first step. The sequence's
    /// own verifications soon outweigh it.
    pub fn seeded(recent: &Acceptance) -> Acceptance {
        let scale = if recent.tried > PRIOR_TRIES {
            PRIOR_TRIES / recent.tried
        } else {
            1.0
        };
        Acceptance {
            accepted: recent.accepted * scale,
            tried: recent.tried * scale,
            idle: 0,
        }
    }

    /// A step in which the sequence had a draft but carried none: after a while the counts
    /// decay, so a sequence whose text starts repeating itself is tried again.
    pub fn skipped(&mut self) {
        self.idle += 1;
        if self.idle.is_multiple_of(8) {
            self.accepted *= 0.5;
            self.tried *= 0.5;
        }
    }
}

/// One sequence's candidate draft: its acceptance rate and the draft tokens available.
#[derive(Clone, Copy, Debug)]
pub struct Candidate {
    pub rate: f64,
    pub available: usize,
}

/// How many draft tokens each candidate carries in a step whose other rows number `base`
/// (`base` counts one row per decoding sequence plus prefill rows; each is worth one token):
/// draft tokens are added in order of their expected value (the j-th draft token of a sequence
/// with acceptance a is emitted with probability a^j), and the number of them that maximises
/// expected tokens over the estimated time is taken; none when nothing beats the step without
/// drafts (or no step has been measured yet).
///
/// With `draft` (a draft model's own steps: [`StepTimes`] by the number of sequences drafting
/// together, one drafted token each), the time of a choice is the target step plus drafting it:
/// as many draft-model steps as the longest draft, each as wide as the sequences that draft.
/// Before a draft step was measured it is counted as free, so drafting is tried and measured.
pub fn plan(
    times: &StepTimes,
    base: usize,
    cands: &[Candidate],
    draft: Option<&StepTimes>,
) -> Vec<usize> {
    let mut take = vec![0usize; cands.len()];
    let Some(t0) = times.estimate(base.max(1)) else {
        return take;
    };
    // (longest draft, sequences drafting) of the first n tokens of `gains`, as n grows
    let mut shape = (0usize, 0usize);
    let drafting = |shape: (usize, usize)| -> f64 {
        match draft {
            Some(d) if shape.0 > 0 => shape.0 as f64 * d.estimate(shape.1).unwrap_or(0.0),
            _ => 0.0,
        }
    };
    // every (candidate, j) with its value a^j; values fall with j, so a sort keeps each
    // candidate's tokens in order
    let mut gains: Vec<(f64, usize)> = Vec::new();
    for (i, c) in cands.iter().enumerate() {
        let mut g = 1.0;
        for _ in 0..c.available {
            g *= c.rate.clamp(0.0, 1.0);
            gains.push((g, i));
        }
    }
    gains.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut best = (base as f64 / t0, 0usize);
    let mut tokens = base as f64;
    for (n, &(g, i)) in gains.iter().enumerate() {
        tokens += g;
        take[i] += 1;
        shape = (shape.0.max(take[i]), shape.1 + usize::from(take[i] == 1));
        let Some(t) = times.estimate(base + n + 1) else {
            break;
        };
        let rate = tokens / (t + drafting(shape));
        if rate > best.0 * (1.0 + 1e-9) {
            best = (rate, n + 1);
        }
    }
    take.fill(0);
    for &(_, i) in &gains[..best.1] {
        take[i] += 1;
    }
    take
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(points: &[(usize, f64)]) -> StepTimes {
        let mut t = StepTimes::new();
        for &(r, s) in points {
            t.record(r, s);
        }
        t
    }

    #[test]
    fn estimates_interpolate_and_extrapolate_optimistically() {
        let t = times(&[(1, 1.0), (5, 3.0)]);
        assert_eq!(t.estimate(1), Some(1.0));
        assert_eq!(t.estimate(3), Some(2.0));
        assert_eq!(t.estimate(9), Some(3.0 + 0.25 * 3.0 / 5.0 * 4.0));
        assert_eq!(StepTimes::new().estimate(2), None);
    }

    #[test]
    fn drafts_are_taken_only_while_they_pay() {
        // a row costs half a one-row step
        let t = times(&[(1, 1.0), (2, 1.5), (3, 2.0), (4, 2.5), (5, 3.0), (6, 3.5)]);
        let sure = Candidate {
            rate: 0.95,
            available: 5,
        };
        let k = plan(&t, 1, &[sure], None)[0];
        assert!(k >= 3, "high acceptance drafts several tokens, took {k}");
        let poor = Candidate {
            rate: 0.3,
            available: 5,
        };
        assert_eq!(
            plan(&t, 1, &[poor], None),
            vec![0],
            "a low acceptance rate drafts nothing"
        );
        // a flat curve (rows are free) makes even a modest rate worth drafting
        let flat = times(&[(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0)]);
        assert!(plan(&flat, 1, &[poor], None)[0] > 0);
        // nothing measured: no drafts
        assert_eq!(plan(&StepTimes::new(), 1, &[sure], None), vec![0]);
    }

    #[test]
    fn a_draft_models_own_steps_are_paid_for() {
        // rows are nearly free on the target: high acceptance drafts the most it may
        let t = times(&[
            (1, 1.0),
            (2, 1.05),
            (3, 1.1),
            (4, 1.15),
            (5, 1.2),
            (6, 1.25),
        ]);
        let sure = Candidate {
            rate: 0.9,
            available: 5,
        };
        assert_eq!(plan(&t, 1, &[sure], None), vec![5]);
        // not measured yet: drafting is free until it is
        assert_eq!(plan(&t, 1, &[sure], Some(&StepTimes::new())), vec![5]);
        // at acceptance 0.7 the free draft takes all 5; a draft step a tenth of a target step
        // is still worth paying for, but fewer tokens (3: 2.53 expected tokens in 1.45)
        let likely = Candidate {
            rate: 0.7,
            available: 5,
        };
        assert_eq!(plan(&t, 1, &[likely], None), vec![5]);
        let cheap = times(&[(1, 0.1)]);
        assert_eq!(plan(&t, 1, &[likely], Some(&cheap)), vec![3]);
        // a draft step as slow as the target's: nothing pays
        let slow = times(&[(1, 1.0)]);
        assert_eq!(plan(&t, 1, &[sure], Some(&slow)), vec![0]);
        // two sequences drafting together share the draft model's steps
        let wide = times(&[(1, 0.1), (2, 0.1)]);
        let two = plan(&t, 2, &[likely, likely], Some(&wide));
        assert!(
            two.iter().all(|&k| k > 0),
            "both draft in the same steps: {two:?}"
        );
    }

    #[test]
    fn acceptance_follows_recent_verifications() {
        let mut a = Acceptance::default();
        assert_eq!(a.rate(), 0.5);
        for _ in 0..10 {
            a.update(4, 4);
        }
        assert!(a.rate() > 0.9);
        for _ in 0..10 {
            a.update(4, 0);
        }
        assert!(a.rate() < 0.3);
        let low = a.rate();
        for _ in 0..16 {
            a.skipped();
        }
        assert!(a.rate() > low, "an idle sequence relaxes toward the prior");
    }

    #[test]
    fn new_sequences_start_from_the_drafters_record() {
        assert_eq!(Acceptance::seeded(&Acceptance::default()).rate(), 0.5);
        let mut rejected = Acceptance::default();
        for _ in 0..20 {
            rejected.update(3, 0);
        }
        let cold = Acceptance::seeded(&rejected);
        // worth 3 tries of which none accepted: 1 / 5
        assert!((cold.rate() - 0.2).abs() < 1e-9, "{}", cold.rate());
        // at the benchmark's measured step curve (2 rows cost 1.4x one) it drafts nothing
        let t = times(&[(1, 1.0), (2, 1.4), (3, 1.96)]);
        let c = Candidate {
            rate: cold.rate(),
            available: 4,
        };
        assert_eq!(plan(&t, 1, &[c], None), vec![0]);
        let mut right = Acceptance::default();
        for _ in 0..20 {
            right.update(4, 4);
        }
        let warm = Acceptance::seeded(&right);
        assert!((warm.rate() - 0.8).abs() < 1e-9, "{}", warm.rate());
        assert!(
            plan(
                &t,
                1,
                &[Candidate {
                    rate: warm.rate(),
                    available: 4
                }],
                None
            )[0] > 0
        );
        // its own rejections soon outweigh a good record
        let mut a = warm;
        a.update(4, 0);
        a.update(4, 0);
        assert!(a.rate() < 0.5, "{}", a.rate());
    }
}
