//! When speculation pays: a running table of measured step times by rows ([`StepTimes`]), each
//! sequence's recent acceptance ([`Acceptance`]), and [`plan`], which picks how many draft
//! tokens each sequence's row carries so that the expected tokens per second of the step is
//! highest, against the same step without drafts. With no drafts accepted (no overlap) or a
//! full batch (a step already bandwidth efficient, so extra rows cost time) it chooses none:
//! speculation turns itself off from measurements, not a constant.

/// Step wall time by rows, a running mean per row count (exponentially weighted, so drift is
/// followed). Rows never measured are interpolated between measured neighbours; past the
/// largest measured count the cost of a row is extrapolated optimistically, so a step with
/// more rows gets tried and measured; below the smallest, in proportion to the rows, so the
/// step without drafts is measured before drafts are judged against it.
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
            // below the smallest measured count (usually a prefill chunk): in proportion to
            // the rows, the most a step can save by having fewer, so drafts look dear until
            // a step without them was measured (the measured curve then decides)
            (None, Some((b, tb))) => Some(tb * rows as f64 / b as f64),
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

/// A sequence's recent acceptance, by draft position: for each position j, the chance that
/// the j-th draft token is accepted once the ones before it were, from decayed counts of the
/// verifications that reached it. Acceptance is not independent of the position (a drafter
/// that copies a span is right until the span ends, a noisy prediction breaks runs at random),
/// so the chance of emitting a long draft is the product of what each position measured, not
/// one rate raised to a power. A position with few tries leans on the position before it (the
/// first on the sequence's overall rate: all positions pooled, a prior of one each way, 0.5 at
/// first): a draft that was right for as far as it was tried is expected to stay right a little
/// further, and a position that was wrong makes the ones past it no likelier. Leaning on the
/// pooled rate instead kept every untried position at that rate (at most 0.92 after ten
/// accepted tokens, with the prior's weight), so the product fell below what a further row
/// costs a few positions past the longest draft tried, and a copy drafter right 100% of the
/// time never tried longer drafts.
#[derive(Clone, Copy, Debug, Default)]
pub struct Acceptance {
    /// All positions pooled: decayed (accepted, tried).
    accepted: f64,
    tried: f64,
    /// By position (the last one also counts every position past it): decayed (accepted,
    /// tried) of the verifications that reached it.
    by_pos: [(f64, f64); POSITIONS],
    /// Steps since it last drafted (its estimate relaxes toward the prior so it is retried).
    idle: u32,
    /// Halvings of [`PROBE_EVERY`] before the next probe ([`Acceptance::skipped`]): set to
    /// [`PROBE_HALVINGS`] by an accepted draft token, one fewer per probe that found nothing.
    probe_halvings: u32,
    /// A probe is out: its verification is the one [`Acceptance::update`] sees next.
    probing: bool,
    /// The last verification accepted a draft token.
    last_accepted: bool,
}

/// Draft positions with their own counts; later ones share the last.
pub const POSITIONS: usize = 32;
/// Decay of the counts per verification (recent steps weigh most).
const DECAY: f64 = 0.7;
/// Most tries a new sequence's seeded counts are worth ([`Acceptance::seeded`]).
const PRIOR_TRIES: f64 = 3.0;
/// How many tries of the pooled rate the first position's own counts are blended with.
const POOL_WEIGHT: f64 = 2.0;
/// How many tries of the previous position's chance a further position's own counts are
/// blended with: fewer than the first position's, so a position's own record (at most ~3.3
/// decayed tries) outweighs a neighbour that was right where it is wrong.
const CHAIN_WEIGHT: f64 = 1.0;
/// Decay per verification of the counts of a position it did not reach. A position is only
/// measured when a draft reaches it, and a draft only reaches it while its record says it pays:
/// without this, one early rejection (one decayed try at 0) kept a position's chance near half
/// its predecessor's for the rest of the sequence, so drafts that were right 80% of the time
/// stayed one token long. Aged, such a record gives way to the position before it after
/// about seven verifications and the position is tried again; one that is really wrong is
/// then retried about every tenth verification, one row each time (both at the skewed 30B
/// shape's step curve: `a_position_rejected_once_long_ago_is_tried_again`).
const STALE_DECAY: f64 = 0.9;
/// Steps with a draft available but none carried between moves toward the drafter's record
/// ([`Acceptance::skipped`]).
const RELAX_EVERY: u32 = 8;
/// Most steps with a draft available but none carried between probes
/// ([`Acceptance::skipped`]).
pub const PROBE_EVERY: u32 = 32;
/// Halvings of [`PROBE_EVERY`] after an accepted draft token: the first probe once a sequence
/// stops drafting comes after 2 idle steps, then 4, 8, 16 and 32 while probes find nothing.
const PROBE_HALVINGS: u32 = 4;

impl Acceptance {
    /// The probability that a draft token is accepted, all positions pooled.
    pub fn rate(&self) -> f64 {
        (self.accepted + 1.0) / (self.tried + 2.0)
    }

    /// The probability that draft token `j` (0-based) is accepted given that the ones before
    /// it were: its position's counts blended with [`CHAIN_WEIGHT`] tries at the chance of the
    /// position before it (the first's with [`POOL_WEIGHT`] tries at the pooled rate).
    pub fn chance(&self, j: usize) -> f64 {
        self.chances().nth(j).unwrap_or(0.0)
    }

    /// [`chance`](Acceptance::chance) of positions 0, 1, 2, ...
    fn chances(&self) -> impl Iterator<Item = f64> + '_ {
        (0..).scan(self.rate(), |prior, j: usize| {
            let (a, t) = self.by_pos[j.min(POSITIONS - 1)];
            let w = if j == 0 { POOL_WEIGHT } else { CHAIN_WEIGHT };
            *prior = ((a + w * *prior) / (t + w)).clamp(0.0, 1.0);
            Some(*prior)
        })
    }

    /// The probabilities that draft tokens 0..n are emitted (each the product of the chances
    /// up to it): what each of them is worth in expected tokens.
    pub fn emitted(&self, n: usize) -> impl Iterator<Item = f64> + '_ {
        self.chances().take(n).scan(1.0, |p, c| {
            *p *= c;
            Some(*p)
        })
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
        // each position reached decays and counts this try; the ones not reached say nothing
        // new, and their old record ages more slowly ([`STALE_DECAY`])
        for j in 0..tried {
            let e = &mut self.by_pos[j.min(POSITIONS - 1)];
            e.0 = e.0 * DECAY + f64::from(u8::from(j < accepted));
            e.1 = e.1 * DECAY + 1.0;
        }
        for e in &mut self.by_pos[tried.min(POSITIONS)..] {
            e.0 *= STALE_DECAY;
            e.1 *= STALE_DECAY;
        }
        self.idle = 0;
        if accepted > 0 {
            self.probe_halvings = PROBE_HALVINGS;
        } else if self.probing {
            self.probe_halvings = self.probe_halvings.saturating_sub(1);
        }
        self.probing = false;
        self.last_accepted = accepted > 0;
    }

    /// Idle steps before the next probe.
    fn probe_gap(&self) -> u32 {
        PROBE_EVERY >> self.probe_halvings.min(PROBE_HALVINGS)
    }

    /// A new sequence's start from the drafter's recent record (`recent`, its verifications
    /// over all sequences): the same rates, pooled and by position, each worth at most
    /// [`PRIOR_TRIES`] tries, so a drafter whose drafts were all rejected lately does not make
    /// every new request pay for trying again, and one that is usually right drafts from the
    /// first step. The sequence's own verifications soon outweigh it. It probes soon after it
    /// stops drafting if the drafter's last verification accepted something, else at the
    /// longest gap.
    pub fn seeded(recent: &Acceptance) -> Acceptance {
        let scaled = |(a, t): (f64, f64)| {
            let s = if t > PRIOR_TRIES {
                PRIOR_TRIES / t
            } else {
                1.0
            };
            (a * s, t * s)
        };
        let (accepted, tried) = scaled((recent.accepted, recent.tried));
        Acceptance {
            accepted,
            tried,
            by_pos: recent.by_pos.map(scaled),
            idle: 0,
            probe_halvings: if recent.last_accepted {
                PROBE_HALVINGS
            } else {
                0
            },
            probing: false,
            last_accepted: false,
        }
    }

    /// A step in which the sequence had a draft but carried none. Every [`RELAX_EVERY`] such steps its
    /// counts move halfway toward the drafter's recent record (`recent`, as a new sequence is
    /// [`seeded`](Acceptance::seeded) from it), not toward an empty prior: a sequence whose
    /// drafts were rejected for a while is tried again when the drafter is doing well
    /// elsewhere (or was, before its last rejections), and stays off while it is not. An empty
    /// prior (0.5) would leave it off for good wherever a draft token needs better odds than
    /// a coin to pay for its row.
    ///
    /// Returns true when a probe is due: the caller then lets one draft token ride anyway.
    /// Without probes a drafter whose first tries were unlucky, or made before the step curve
    /// was known, stays below the bar for good, every sequence seeded from its record with it;
    /// and a sequence whose estimate fell below the bar is never measured again, since only
    /// drafts that ride are verified: a few rejections in a row (the end of a copied span, bad
    /// luck at 70% acceptance) kept it off for [`PROBE_EVERY`] steps, often the rest of the
    /// request. So probes back off: 2 idle steps after the sequence (or, for a new one, the
    /// drafter) last had a draft token accepted, doubling per probe that finds nothing up to
    /// [`PROBE_EVERY`]. Where drafts stay wrong that is five probes in the first 62 idle steps
    /// after the last accepted token (at 2, 6, 14, 30, 62), then one row every [`PROBE_EVERY`]
    /// steps as before (`probes_back_off_and_find_drafts_that_came_right`). A caller that cannot probe (a
    /// draft model's draft is not made before the plan takes it) passes `can_probe` false.
    pub fn skipped(&mut self, recent: &Acceptance, can_probe: bool) -> bool {
        self.idle += 1;
        if self.idle.is_multiple_of(RELAX_EVERY) {
            let toward = Acceptance::seeded(recent);
            let mid = |a: f64, b: f64| 0.5 * (a + b);
            self.accepted = mid(self.accepted, toward.accepted);
            self.tried = mid(self.tried, toward.tried);
            for (e, t) in self.by_pos.iter_mut().zip(&toward.by_pos) {
                *e = (mid(e.0, t.0), mid(e.1, t.1));
            }
        }
        let due = can_probe && self.idle.is_multiple_of(self.probe_gap());
        self.probing |= due;
        due
    }
}

/// One sequence's candidate draft: what each of its available draft tokens is worth, the
/// probability that it is emitted (non-increasing: token j is emitted only if the ones before
/// it were accepted). Its length is the number of draft tokens available.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Candidate {
    pub worth: Vec<f64>,
}

impl Candidate {
    /// `available` draft tokens of a sequence with acceptance `a` ([`Acceptance::emitted`]).
    pub fn of(a: &Acceptance, available: usize) -> Candidate {
        Candidate {
            worth: a.emitted(available).collect(),
        }
    }

    /// `available` draft tokens each accepted with probability `rate`, independently.
    pub fn geometric(rate: f64, available: usize) -> Candidate {
        let r = rate.clamp(0.0, 1.0);
        Candidate {
            worth: (1..=available as i32).map(|j| r.powi(j)).collect(),
        }
    }

    pub fn available(&self) -> usize {
        self.worth.len()
    }
}

/// How many draft tokens each candidate carries in a step whose other rows number `base`
/// (`base` counts one row per decoding sequence plus prefill rows; each is worth one token):
/// draft tokens are added in order of their worth (the probability that they are emitted),
/// and the number of them that maximises expected tokens over the estimated time is taken;
/// none when nothing beats the step without drafts (or no step has been measured yet).
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
    // every (candidate, j) with its worth; worth falls with j, so a stable sort keeps each
    // candidate's tokens in order
    let mut gains: Vec<(f64, usize)> = cands
        .iter()
        .enumerate()
        .flat_map(|(i, c)| c.worth.iter().map(move |&g| (g.clamp(0.0, 1.0), i)))
        .collect();
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
        // only a prefill chunk measured: fewer rows cost proportionally less, so no draft
        // rides before the one-row step is measured
        let prefill = times(&[(16, 8.0)]);
        assert_eq!(prefill.estimate(1), Some(0.5));
        assert_eq!(
            plan(&prefill, 1, &[Candidate::geometric(0.9, 4)], None),
            vec![0]
        );
    }

    #[test]
    fn drafts_are_taken_only_while_they_pay() {
        // a row costs half a one-row step
        let t = times(&[(1, 1.0), (2, 1.5), (3, 2.0), (4, 2.5), (5, 3.0), (6, 3.5)]);
        let sure = Candidate::geometric(0.95, 5);
        let k = plan(&t, 1, &[sure.clone()], None)[0];
        assert!(k >= 3, "high acceptance drafts several tokens, took {k}");
        let poor = Candidate::geometric(0.3, 5);
        assert_eq!(
            plan(&t, 1, &[poor.clone()], None),
            vec![0],
            "a low acceptance rate drafts nothing"
        );
        // a flat curve (rows are free) makes even a modest rate worth drafting
        let flat = times(&[(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0)]);
        assert!(plan(&flat, 1, &[poor.clone()], None)[0] > 0);
        // nothing measured: no drafts
        assert_eq!(plan(&StepTimes::new(), 1, &[sure.clone()], None), vec![0]);
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
        let sure = Candidate::geometric(0.9, 5);
        assert_eq!(plan(&t, 1, &[sure.clone()], None), vec![5]);
        // not measured yet: drafting is free until it is
        assert_eq!(
            plan(&t, 1, &[sure.clone()], Some(&StepTimes::new())),
            vec![5]
        );
        // at acceptance 0.7 the free draft takes all 5; a draft step a tenth of a target step
        // is still worth paying for, but fewer tokens (3: 2.53 expected tokens in 1.45)
        let likely = Candidate::geometric(0.7, 5);
        assert_eq!(plan(&t, 1, &[likely.clone()], None), vec![5]);
        let cheap = times(&[(1, 0.1)]);
        assert_eq!(plan(&t, 1, &[likely.clone()], Some(&cheap)), vec![3]);
        // a draft step as slow as the target's: nothing pays
        let slow = times(&[(1, 1.0)]);
        assert_eq!(plan(&t, 1, &[sure.clone()], Some(&slow)), vec![0]);
        // two sequences drafting together share the draft model's steps
        let wide = times(&[(1, 0.1), (2, 0.1)]);
        let two = plan(&t, 2, &[likely.clone(), likely], Some(&wide));
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
        let mut b = a;
        for _ in 0..16 {
            let _ = a.skipped(&Acceptance::default(), true);
        }
        assert!(a.rate() > low, "an idle sequence relaxes toward the prior");
        // toward the drafter's record, not a coin: with the drafter right elsewhere it drafts
        // again at a step curve where a coin's odds do not pay, and stays off while the
        // drafter is wrong everywhere
        let t = times(&[(1, 1.0), (2, 1.55), (3, 2.1), (5, 3.0), (9, 5.0)]);
        assert_eq!(plan(&t, 1, &[Candidate::geometric(0.5, 8)], None), vec![0]);
        assert_eq!(plan(&t, 1, &[Candidate::of(&b, 8)], None), vec![0]);
        let mut right = Acceptance::default();
        for _ in 0..20 {
            right.update(8, 8);
        }
        let mut c = b;
        for _ in 0..16 {
            let _ = b.skipped(&right, true);
            let _ = c.skipped(&a, true);
        }
        assert!(
            plan(&t, 1, &[Candidate::of(&b, 8)], None)[0] > 0,
            "{}",
            b.rate()
        );
        assert_eq!(plan(&t, 1, &[Candidate::of(&c, 8)], None), vec![0]);
        // while it stays off, a probe is due every PROBE_EVERY idle steps, and a verification
        // starts the count again
        let probes = |a: &mut Acceptance, steps: u32| {
            (0..steps)
                .filter(|_| a.skipped(&Acceptance::default(), true))
                .count()
        };
        let mut d = Acceptance::default();
        assert_eq!(probes(&mut d, 3 * PROBE_EVERY), 3);
        assert_eq!(probes(&mut d, PROBE_EVERY - 1), 0);
        d.update(1, 0);
        assert_eq!(probes(&mut d, PROBE_EVERY - 1), 0);
        assert_eq!(probes(&mut d, 1), 1);
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
        assert_eq!(plan(&t, 1, &[Candidate::of(&cold, 4)], None), vec![0]);
        let mut right = Acceptance::default();
        for _ in 0..20 {
            right.update(4, 4);
        }
        let warm = Acceptance::seeded(&right);
        assert!((warm.rate() - 0.8).abs() < 1e-9, "{}", warm.rate());
        assert!(plan(&t, 1, &[Candidate::of(&warm, 4)], None)[0] > 0);
        // its own rejections soon outweigh a good record
        let mut a = warm;
        a.update(4, 0);
        a.update(4, 0);
        assert!(a.rate() < 0.5, "{}", a.rate());
    }

    /// Expected tokens per second of `k` draft tokens of `c` in a one-sequence step.
    fn speed(t: &StepTimes, c: &Candidate, k: usize) -> f64 {
        (1.0 + c.worth[..k].iter().sum::<f64>()) / t.estimate(1 + k).expect("measured")
    }

    #[test]
    fn the_chosen_length_maximises_expected_tokens_per_second() {
        // random step-time curves (not always convex or even monotone, as measured ones are
        // not) and random acceptance by position: the plan for one sequence is the length
        // with the most expected tokens per second, none unless some length beats no draft
        let mut rng = nightshift_kernels::rng::SplitMix64::new(20);
        let mut drafted = 0;
        for case in 0..2000 {
            let mut t = StepTimes::new();
            let mut at = 1.0;
            t.record(1, at);
            for rows in 2..=9 {
                at += rng.next_f64() * 1.2 - 0.1;
                t.record(rows, at.max(0.5));
            }
            let mut a = Acceptance::default();
            for _ in 0..rng.below(12) {
                let drafted = 1 + rng.below(8) as usize;
                a.update(drafted, rng.below(drafted as u64 + 1) as usize);
            }
            let c = Candidate::of(&a, rng.below(9) as usize);
            let k = plan(&t, 1, std::slice::from_ref(&c), None)[0];
            let best = (0..=c.available())
                .map(|k| speed(&t, &c, k))
                .fold(f64::MIN, f64::max);
            assert!(
                speed(&t, &c, k) >= best * (1.0 - 1e-9),
                "case {case}: took {k} at {} but {best} was possible ({c:?}, {t:?})",
                speed(&t, &c, k)
            );
            if k > 0 {
                assert!(speed(&t, &c, k) > speed(&t, &c, 0), "case {case}");
                drafted += 1;
            }
        }
        assert!(drafted > 100, "the cases draft sometimes: {drafted}");
    }

    #[test]
    fn drafting_stops_when_its_rows_cost_more_than_they_return() {
        // a row costs a whole step: no acceptance short of certainty pays for one
        let linear = times(&[(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]);
        let mut a = Acceptance::default();
        for _ in 0..20 {
            a.update(3, 3);
        }
        assert!(a.chance(0) > 0.9);
        assert_eq!(plan(&linear, 1, &[Candidate::of(&a, 3)], None), vec![0]);
        // the measured curve of the uniformly routed 30B shape (release, 2 threads): 2 rows
        // cost 1.33x one, 3 rows 2x: at a 30% chance nothing pays, at 90% one token does
        // (1.9 / 1.33) and more do not (2.71 / 2)
        let q4 = times(&[(1, 1.0), (2, 1.33), (3, 2.0), (4, 2.64)]);
        assert_eq!(plan(&q4, 1, &[Candidate::geometric(0.3, 3)], None), vec![0]);
        assert_eq!(plan(&q4, 1, &[Candidate::geometric(0.9, 3)], None), vec![1]);
    }

    #[test]
    fn acceptance_by_position_stops_where_drafts_stop_being_right() {
        // drafts are right for two tokens, then wrong (a copied span that ends): the pooled
        // rate is 2/3, but the third position has never been accepted
        let mut a = Acceptance::default();
        for _ in 0..12 {
            a.update(5, 2);
        }
        assert!(a.chance(0) > 0.85 && a.chance(1) > 0.85, "{a:?}");
        assert!(a.chance(2) < 0.3, "{a:?}");
        let worth: Vec<f64> = a.emitted(5).collect();
        assert!(worth[1] > 0.7 && worth[2] < 0.2, "{worth:?}");
        // rows are cheap (a tenth of a step each): a geometric 0.64 would take three or more,
        // the positions' own record takes the two that are right
        let cheap = times(&[(1, 1.0), (2, 1.1), (3, 1.2), (4, 1.3), (5, 1.4), (6, 1.5)]);
        assert!(plan(&cheap, 1, &[Candidate::geometric(a.rate(), 5)], None)[0] >= 3);
        assert_eq!(plan(&cheap, 1, &[Candidate::of(&a, 5)], None), vec![2]);
        // positions never reached lean on the last one reached: past a position that is
        // always wrong no likelier than it, past positions always right about as likely
        assert!(a.chance(4) < 0.3, "{a:?}");
        let mut b = Acceptance::default();
        for _ in 0..12 {
            b.update(3, 3);
        }
        assert!(
            b.rate() < 0.93,
            "the pooled rate keeps its prior: {}",
            b.rate()
        );
        assert!(b.chance(2) > 0.97 && b.chance(12) > 0.97, "{b:?}");
        assert!((b.chance(12) - b.chance(2)).abs() < 1e-3, "{b:?}");
    }

    #[test]
    fn a_draft_right_as_far_as_it_was_tried_is_tried_further() {
        // the step curve the bench measured on the uniformly routed 30B shape at 2 threads
        // (a row ~0.5 of a one-row step), a copy drafter right every time: a sequence that
        // carried three draft tokens per step goes past three, and with rows measured up to
        // 17 takes all 16 it has
        let t = times(&[
            (1, 1.0),
            (2, 1.55),
            (3, 2.1),
            (4, 2.7),
            (5, 3.1),
            (9, 5.0),
            (17, 7.7),
        ]);
        let mut a = Acceptance::default();
        for _ in 0..12 {
            a.update(3, 3);
        }
        let k = plan(&t, 1, &[Candidate::of(&a, 16)], None)[0];
        assert_eq!(k, 16, "{a:?}");
        // the same record where the fourth token was always wrong stops at three
        let mut b = Acceptance::default();
        for _ in 0..12 {
            b.update(4, 3);
        }
        assert_eq!(plan(&t, 1, &[Candidate::of(&b, 16)], None), vec![3]);
        // a noisy drafter (each token right 70% of the time) does not draft long
        let noisy = Candidate::geometric(0.7, 16);
        assert!(plan(&t, 1, &[noisy], None)[0] <= 2);
    }

    /// Step-time curves `bench spec` measured (one sequence, rows 1..=10, relative to one
    /// row; release, 2 threads, 2026-12-04): the skewed Qwen3-30B-A3B shape at Q4_K_M and the
    /// Kimi-K2 shape.
    const SKEWED_30B: [f64; 10] = [1.0, 1.42, 1.81, 2.20, 2.81, 3.20, 3.59, 3.96, 4.32, 4.72];
    const K2_SHAPE: [f64; 10] = [1.0, 1.37, 1.93, 2.35, 3.02, 3.37, 3.75, 4.04, 4.49, 4.78];

    /// One stream decoding `requests` requests of `tokens` tokens in turn under the policy as
    /// the scheduler runs it (each request seeded from the drafter's record; a skipped step
    /// with a draft may probe one token), where a draft token for output position i of request
    /// r is right when `right(r, i)` and 16 are always available; past the curve's end a row
    /// costs what its last one did. Returns the speed relative to decoding without drafts.
    fn simulate(
        curve: &[f64],
        requests: usize,
        tokens: usize,
        right: &dyn Fn(usize, usize) -> bool,
    ) -> f64 {
        let n = curve.len();
        let cost = |rows: usize| {
            curve[rows.min(n) - 1] + (curve[n - 1] - curve[n - 2]) * rows.saturating_sub(n) as f64
        };
        let t = times(&(1..=17).map(|r| (r, cost(r))).collect::<Vec<_>>());
        let mut recent = Acceptance::default();
        let mut time = 0.0;
        for r in 0..requests {
            let mut a = Acceptance::seeded(&recent);
            let mut pos = 0;
            while pos < tokens {
                let avail = 16.min(tokens - pos - 1);
                let mut k = plan(&t, 1, &[Candidate::of(&a, avail)], None)[0];
                if k == 0 && avail > 0 && a.skipped(&recent, true) {
                    k = 1;
                }
                let accepted = (0..k).take_while(|&j| right(r, pos + j)).count();
                if k > 0 {
                    a.update(k, accepted);
                    recent.update(k, accepted);
                }
                time += cost(1 + k);
                pos += accepted + 1;
            }
        }
        (requests * tokens) as f64 / time
    }

    /// The most any policy reaches on `curve` when each draft token is right with
    /// probability `p`: the best k of (1 + p + ... + p^k) over a (k+1)-row step.
    fn ceiling(curve: &[f64], p: f64) -> f64 {
        (0..curve.len())
            .map(|k| (0..=k).map(|j| p.powi(j as i32)).sum::<f64>() / curve[k])
            .fold(0.0, f64::max)
    }

    /// Whether a draft token for position i of request r is right, with probability p.
    fn coin(seed: u64, r: usize, i: usize, p: f64) -> bool {
        let z = nightshift_kernels::rng::mix(seed ^ ((r as u64) << 32) ^ i as u64);
        ((z >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    #[test]
    fn at_a_steady_acceptance_the_policy_comes_near_the_ceiling() {
        // each draft token right with probability p (a noisy prediction): the policy only sees
        // what its drafts' verifications say, so it must measure, stop when a few rejections
        // in a row say the rows do not pay, and come back. Over 20 requests of 48 tokens (the
        // benchmark's) it reaches at least 90% of what the best fixed draft length would on
        // both measured curves; before probes backed off (one every 32 steps) it reached 87-89%
        // at p = 0.7 and 0.8: a few early rejections kept a sequence off for the rest of it
        for (name, curve) in [("skewed 30B", &SKEWED_30B), ("K2", &K2_SHAPE)] {
            for p in [0.6, 0.7, 0.8, 0.9] {
                let got = (0..8)
                    .map(|seed| simulate(curve, 20, 48, &|r, i| coin(seed, r, i, p)))
                    .sum::<f64>()
                    / 8.0;
                let best = ceiling(curve, p);
                assert!(
                    got >= 0.9 * best,
                    "{name} at p = {p}: {got:.3}x against a ceiling of {best:.3}x"
                );
            }
            // drafts always wrong: the probes cost under 2%
            let wrong = simulate(curve, 20, 48, &|_, _| false);
            assert!(wrong > 0.98, "{name}, drafts always wrong: {wrong:.3}x");
            // always right: long drafts, past what the curve's first 10 rows show
            let right = simulate(curve, 20, 48, &|_, _| true);
            assert!(right > 2.0, "{name}, drafts always right: {right:.3}x");
        }
    }

    #[test]
    fn probes_back_off_and_find_drafts_that_came_right() {
        let t = times(&[(1, 1.0), (2, 1.42), (3, 1.81), (4, 2.2)]);
        let pays = |a: &Acceptance| plan(&t, 1, &[Candidate::of(a, 4)], None)[0] > 0;
        // the drafter's record elsewhere: wrong (idle sequences relax toward it)
        let mut wrong = Acceptance::default();
        for _ in 0..10 {
            wrong.update(2, 0);
        }
        // a sequence right for a while, then wrong until it stops drafting
        let mut a = Acceptance::default();
        for _ in 0..6 {
            a.update(3, 3);
        }
        while pays(&a) {
            a.update(1, 0);
        }
        // idle steps between probes while they find nothing: 2, 4, 8, 16, 32, 32, ...
        let mut gaps = Vec::new();
        let mut idle = 0;
        while gaps.len() < 7 {
            idle += 1;
            if a.skipped(&wrong, true) {
                gaps.push(idle);
                idle = 0;
                a.update(1, 0);
            }
            assert!(!pays(&a), "off while its drafts are wrong");
        }
        assert_eq!(gaps, [2, 4, 8, 16, PROBE_EVERY, PROBE_EVERY, PROBE_EVERY]);
        // the drafts come right again: the next probe is accepted, the gaps are short again,
        // and the sequence drafts again after a few accepted probes
        let mut steps = 0;
        let mut probes = 0;
        while !pays(&a) {
            steps += 1;
            if a.skipped(&wrong, true) {
                a.update(1, 1);
                probes += 1;
            }
            assert!(
                steps < 3 * PROBE_EVERY,
                "still off after {steps} steps: {a:?}"
            );
        }
        assert!(
            probes >= 2 && steps <= PROBE_EVERY + 8,
            "{probes} probes, {steps} steps"
        );
        // a new sequence probes after 2 idle steps if the drafter's last verification
        // accepted a draft token, else after PROBE_EVERY
        let mut warm = Acceptance::seeded(&a);
        assert!(!warm.skipped(&a, true) && warm.skipped(&a, true));
        let mut cold = Acceptance::seeded(&wrong);
        assert!(!(1..PROBE_EVERY).any(|_| cold.skipped(&wrong, true)));
        assert!(cold.skipped(&wrong, true));
        // a caller that cannot probe (a draft model) never gets one
        let mut model = Acceptance::seeded(&a);
        assert!(!(0..3 * PROBE_EVERY).any(|_| model.skipped(&a, false)));
    }

    #[test]
    fn a_position_rejected_once_long_ago_is_tried_again() {
        // the skewed 30B shape's measured curve (2 rows 1.43x one, 3 rows 1.85x): one early
        // rejection of the second draft token, then one-token drafts always right
        let t = times(&[(1, 1.0), (2, 1.43), (3, 1.85), (4, 2.3)]);
        let mut a = Acceptance::default();
        a.update(3, 1);
        let mut steps = 0;
        while plan(&t, 1, &[Candidate::of(&a, 4)], None)[0] < 2 {
            a.update(1, 1);
            steps += 1;
            assert!(
                steps < 20,
                "still one token after {steps} verifications: {a:?}"
            );
        }
        assert!(steps >= 3, "the rejection counted for something: {steps}");
        // a position rejected every time it is tried is retried only now and then: over 100
        // verifications of a drafter right for exactly one token, a second token rides in
        // at most one in eight
        let mut b = Acceptance::default();
        let mut second = 0;
        for _ in 0..100 {
            let k = plan(&t, 1, &[Candidate::of(&b, 4)], None)[0];
            second += usize::from(k >= 2);
            b.update(k.max(1), 1);
        }
        assert!(
            second <= 12,
            "{second} of 100 verifications carried a second token"
        );
    }
}
