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
///
/// A count is only measured while the policy chooses it, so one step measured at a bad moment
/// (the VM busy) could keep its count, and those interpolated through it, looking dear for the
/// rest of a run (in simulation one 3x step at the count that pays cost 24-40% of the speed
/// for good; one `bench spec` run in 23 drafted 2.3 rows a step). So a mean ages: one not
/// updated for [`FRESH_STEPS`] steps is left out of the estimates until a new step of its
/// count starts it afresh. A count that really is dear is then tried again at most once per
/// that many steps, and only when the estimates without it say it pays.
#[derive(Clone, Debug, Default)]
pub struct StepTimes {
    /// Index = rows.
    by_rows: Vec<Mean>,
    /// Steps recorded so far.
    clock: u64,
}

/// One row count's running mean.
#[derive(Clone, Copy, Debug, Default)]
struct Mean {
    secs: f64,
    /// Samples since it last started afresh.
    samples: u32,
    /// [`StepTimes::clock`] at its last sample.
    at: u64,
}

/// Weight of a new sample in the running mean (after the first few).
const EWMA: f64 = 0.2;
/// Assumed cost of one more row past the measured ones, as a share of the mean per-row cost
/// of the largest measured step: optimistic, so drafting is tried at all.
const EXPLORE_ROW: f64 = 0.25;
/// Steps a mean stays in the estimates without a new sample of its count.
const FRESH_STEPS: u64 = 64;

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
            self.by_rows.resize(rows + 1, Mean::default());
        }
        self.clock += 1;
        let stale = self.measured(rows).is_none();
        let e = &mut self.by_rows[rows];
        if stale {
            // a mean left out of the estimates (or none yet) starts afresh
            *e = Mean::default();
        }
        e.samples = e.samples.saturating_add(1);
        e.at = self.clock;
        // a plain mean of the first samples, then a running one
        let w = (1.0 / e.samples as f64).max(EWMA);
        e.secs += w * (secs - e.secs);
    }

    /// The mean for `rows`, if it still counts in the estimates (sampled within
    /// [`FRESH_STEPS`] recorded steps).
    fn measured(&self, rows: usize) -> Option<f64> {
        self.by_rows
            .get(rows)
            .filter(|e| e.samples > 0 && self.clock - e.at <= FRESH_STEPS)
            .map(|e| e.secs)
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

    /// (rows, mean seconds, samples since it started afresh) of every measured row count, aged
    /// ones included, for reports.
    pub fn curve(&self) -> Vec<(usize, f64, u32)> {
        self.by_rows
            .iter()
            .enumerate()
            .filter(|(_, e)| e.samples > 0)
            .map(|(r, e)| (r, e.secs, e.samples))
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
        Acceptance::scaled(recent, PRIOR_TRIES)
    }

    /// [`seeded`](Acceptance::seeded) with each count worth at most `most` tries.
    fn scaled(recent: &Acceptance, most: f64) -> Acceptance {
        let scaled = |(a, t): (f64, f64)| {
            let s = if t > most { most / t } else { 1.0 };
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

/// Most tries every verification's record adds to a new sequence's openers-seeded counts
/// ([`DrafterRecord::seed`]).
const RECENT_TRIES: f64 = 1.0;

/// A drafter's record over every sequence, which new sequences start from and idle ones relax
/// toward: `recent`, every verification; and `openers`, the first verification of each
/// sequence whose request has no prediction. Such a sequence's first draft is a quote found in
/// its prompt, and whether the model takes the quote up at once has other odds than drafts
/// later on: judged by `recent` (where long accepted runs from the middles of sequences
/// dominate), each quoting request on the skewed 30B shape opened with 7-9 draft rows of which
/// 1-3 were accepted, and a 13-row step at four sequences takes 2.3x a plain step's time for
/// 1.25x its tokens. So its opening draft is judged by the openers' record with `recent` worth
/// [`RECENT_TRIES`] beside it ([`SeqAcceptance`]), and its later drafts by its own record,
/// seeded from `recent` as before. Seeding the whole record from the openers was tried: it
/// opened as short, but where the model leaves the quote and its later drafts are right it
/// kept them short for about ten verifications (`openings_that_fail_early_open_short`, the
/// Kimi-K2 curve: 1.56x against 1.88x judged by `recent` alone; this 2.26x). A request with a
/// prediction (the client's own statement of the output) opens by `recent`: pooled with the
/// quoting requests' openings it opened short after them (15.7 -> 8.2 tokens per step).
#[derive(Clone, Copy, Debug, Default)]
pub struct DrafterRecord {
    recent: Acceptance,
    openers: Acceptance,
}

/// A sequence's acceptance as the policy reads it: its record and, until its first draft is
/// verified, what its opening draft is judged by ([`DrafterRecord::seed`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct SeqAcceptance {
    pub record: Acceptance,
    opening: Option<Acceptance>,
    /// Its next verification is its first, and its request has no prediction: the openers'
    /// record counts it.
    opens: bool,
}

impl SeqAcceptance {
    /// What the sequence's next draft is judged by.
    pub fn current(&self) -> &Acceptance {
        self.opening.as_ref().unwrap_or(&self.record)
    }
}

impl DrafterRecord {
    /// Every verification, all sequences pooled.
    pub fn recent(&self) -> &Acceptance {
        &self.recent
    }

    /// A new sequence's acceptance (`predicted`: its request has a prediction): its record
    /// seeded from `recent`; without a prediction, once an opening was verified, its opening
    /// judged by the openings' record with `recent` worth [`RECENT_TRIES`] more beside it (a
    /// position no opening reached, since an opening right as far as it went says nothing past
    /// it, leans on that, and a few openings do not outweigh it).
    pub fn seed(&self, predicted: bool) -> SeqAcceptance {
        let opening = (!predicted && self.openers.tried > 0.0).then(|| {
            let mut a = Acceptance::seeded(&self.openers);
            let r = Acceptance::scaled(&self.recent, RECENT_TRIES);
            a.accepted += r.accepted;
            a.tried += r.tried;
            for (e, p) in a.by_pos.iter_mut().zip(&r.by_pos) {
                e.0 += p.0;
                e.1 += p.1;
            }
            a
        });
        SeqAcceptance {
            record: Acceptance::seeded(&self.recent),
            opening,
            opens: !predicted,
        }
    }

    /// A verification of sequence `seq`'s draft: `drafted` tokens, the first `accepted` kept.
    pub fn verified(&mut self, seq: &mut SeqAcceptance, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        if seq.opens {
            self.openers.update(drafted, accepted);
        }
        seq.opens = false;
        seq.opening = None;
        seq.record.update(drafted, accepted);
        self.recent.update(drafted, accepted);
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
mod tests;
