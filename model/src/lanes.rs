//! The rows of one engine step as they go through the layers: one lane holding the whole
//! batch, or, when the experts are out on nodes (`ExpertBackend::overlaps` and
//! `micro_batches`), two micro-batches of whole sequences whose layer calls alternate: while one
//! half's experts are on the nodes the engine lands the other half's previous call, sums it, and
//! runs that half's next attention block and router (the dual-micro-batch overlap of large
//! expert-parallel deployments), for the step shapes where measured steps say it pays
//! ([`ModePolicy`]). A row's values never depend on its lane: attention reads only
//! its own sequence's cache, every other op works row by row, and an expert's output row depends
//! only on its expert and activation row (`expert::run_claimed`), so the logits are the same
//! bits either way (`coordinator/tests/cluster_netns.rs`).

use std::time::Instant;

use crate::arch::Tok;
use crate::engine::{SharedRows, StepProfile};
use crate::error::ModelError;
use crate::expert::{ExpertBackend, PostedExperts};
use crate::moe::Routed;

/// A MoE layer whose experts ran: (routing, expert outputs, its normalised rows for the shared
/// expert, layer), summed into the lane's residual at the start of its next phase.
pub(crate) type Finished = (Routed, Vec<f32>, SharedRows, usize);
/// A MoE layer whose call is out on the nodes (`ExpertBackend::post_experts`).
pub(crate) type InFlight = (Routed, PostedExperts, SharedRows, usize);

/// Rows of a step that go through the layers together: the whole batch, or one of two
/// micro-batches (whole sequences each) whose layer calls alternate, so one half's attention
/// and routing run while the other half's experts are out. A row's values never depend on which
/// lane it is in: attention reads only its own sequence, and every other op is row by row.
pub(crate) struct Lane {
    /// The batch rows of this lane, ascending.
    pub(crate) rows: Vec<usize>,
    pub(crate) toks: Vec<Tok>,
    pub(crate) ropes: Vec<Vec<f32>>,
    pub(crate) x: Vec<f32>,
    pub(crate) h: Vec<f32>,
    pub(crate) y: Vec<f32>,
    pub(crate) pending: Option<Finished>,
    pub(crate) inflight: Option<InFlight>,
}

impl Lane {
    pub(crate) fn whole(x: Vec<f32>, toks: &[Tok], ropes: Vec<Vec<f32>>) -> Lane {
        let len = x.len();
        Lane {
            rows: (0..toks.len()).collect(),
            toks: toks.to_vec(),
            ropes,
            x,
            h: vec![0.0; len],
            y: vec![0.0; len],
            pending: None,
            inflight: None,
        }
    }

    pub(crate) fn gather(
        rows: Vec<usize>,
        x: &[f32],
        toks: &[Tok],
        ropes: &[Vec<f32>],
        e: usize,
    ) -> Lane {
        let mut lx = Vec::with_capacity(rows.len() * e);
        for &r in &rows {
            lx.extend_from_slice(&x[r * e..(r + 1) * e]);
        }
        Lane {
            toks: rows.iter().map(|&r| toks[r]).collect(),
            ropes: rows.iter().map(|&r| ropes[r].clone()).collect(),
            x: lx,
            h: vec![0.0; rows.len() * e],
            y: vec![0.0; rows.len() * e],
            rows,
            pending: None,
            inflight: None,
        }
    }

    /// Lands the lane's call in flight (waits for its outputs): it becomes `pending`.
    pub(crate) fn land(
        &mut self,
        backend: &dyn ExpertBackend,
        e: usize,
        prof: &mut StepProfile,
    ) -> Result<(), ModelError> {
        if let Some((r, posted, sh_rows, il)) = self.inflight.take() {
            let t = Instant::now();
            let mut eo = vec![0.0f32; r.pairs.len() * e];
            backend.collect_experts(posted, &mut eo)?;
            prof.experts += t.elapsed().as_secs_f64();
            self.pending = Some((r, eo, sh_rows, il));
        }
        Ok(())
    }

    /// The batch's residual rows back in batch order.
    pub(crate) fn scatter(lanes: &mut [Lane], n: usize, e: usize) -> Vec<f32> {
        if let [one] = lanes {
            return std::mem::take(&mut one.x);
        }
        let mut x = vec![0.0f32; n * e];
        for l in lanes.iter() {
            for (k, &r) in l.rows.iter().enumerate() {
                x[r * e..(r + 1) * e].copy_from_slice(&l.x[k * e..(k + 1) * e]);
            }
        }
        x
    }
}

/// The rows of two micro-batches: the batch's sequences in order of first appearance, the first
/// ones to the first half until it holds about half the rows; `None` with a single sequence.
pub(crate) fn micro_batches(toks: &[Tok]) -> Option<Vec<Vec<usize>>> {
    let mut seqs: Vec<(usize, usize)> = Vec::new();
    for t in toks {
        match seqs.iter_mut().find(|s| s.0 == t.slot) {
            Some(s) => s.1 += 1,
            None => seqs.push((t.slot, 1)),
        }
    }
    if seqs.len() < 2 {
        return None;
    }
    let mut first = Vec::new();
    let mut rows = 0;
    for &(slot, count) in &seqs[..seqs.len() - 1] {
        if first.is_empty() || 2 * (rows + count) <= toks.len() {
            first.push(slot);
            rows += count;
        }
    }
    let (a, b): (Vec<usize>, Vec<usize>) =
        (0..toks.len()).partition(|&i| first.contains(&toks[i].slot));
    Some(vec![a, b])
}

/// How a step's MoE layers meet an expert backend that can start a call early
/// ([`ExpertBackend::overlaps`]); every mode gives the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StepMode {
    /// Each layer waits for its routed experts, then computes its shared expert.
    Plain,
    /// A layer's shared expert is computed while its routed experts are out.
    Overlap,
    /// Two micro-batches whose layer calls alternate (with the shared-expert overlap).
    Split,
}

/// The modes a step of `seqs` sequences can run in with `backend`: [`StepMode::Plain`] only,
/// unless the backend starts calls early ([`ExpertBackend::overlaps`]); then those that change
/// something for this step: no overlap (unless the backend [`ExpertBackend::overlap_always`]),
/// the overlap where the model has shared experts (or where nothing else is left), the split
/// where the step holds two sequences ([`micro_batches`] splits it) and the backend takes
/// micro-batches.
pub(crate) fn step_modes(
    backend: &dyn ExpertBackend,
    has_shared: bool,
    seqs: usize,
) -> Vec<StepMode> {
    if !backend.overlaps() {
        return vec![StepMode::Plain];
    }
    let mut modes = Vec::with_capacity(3);
    if !backend.overlap_always() {
        modes.push(StepMode::Plain);
    }
    if has_shared || modes.is_empty() {
        modes.push(StepMode::Overlap);
    }
    if backend.micro_batches() && seqs >= 2 {
        modes.push(StepMode::Split);
    }
    modes
}

/// A step's shape as [`ModePolicy`] keys it: (rows, sequences).
pub(crate) fn step_shape(toks: &[Tok]) -> (usize, usize) {
    let seqs = toks
        .iter()
        .map(|t| t.slot)
        .collect::<std::collections::BTreeSet<_>>();
    (toks.len(), seqs.len())
}

/// Steps of one shape each mode must have run before the fastest one is kept.
const WARMUP: u32 = 3;
/// Steps of one shape between two runs of a mode not kept (its time may have changed); the
/// modes not kept take turns.
const PROBE_EVERY: u32 = 16;
/// Recent steps per mode whose median is its time: one step slowed by something else (this VM's
/// neighbours, a node's hiccup) does not flip the choice for the next [`PROBE_EVERY`] steps.
const RECENT: usize = 3;
/// Most step shapes remembered (prefill chunks make many; the table restarts past it).
const MAX_SHAPES: usize = 1024;

/// Which [`StepMode`] a step runs in, from measured step times: per step shape (rows,
/// sequences) and mode, the recent step time; each mode the step can run in is tried a few
/// times, then the fastest is kept and the others are run again in turn every
/// [`PROBE_EVERY`] steps of that shape. The overlaps pay when the nodes compute on cores of
/// their own, and lose when the nodes share the coordinator's cores (the shared expert or one
/// half's attention then only takes cores from the routed experts). Every mode gives the same
/// bits, so the choice changes only speed.
#[derive(Default)]
pub(crate) struct ModePolicy {
    shapes: std::collections::HashMap<(usize, usize), ShapeRecord>,
}

/// One step shape's record: per mode its recent step times, the steps since the last probe, and
/// how many probes were run (whose turn is next).
#[derive(Default)]
struct ShapeRecord {
    modes: Vec<ModeTimes>,
    since: u32,
    probes: u32,
}

/// A mode's last [`RECENT`] step times (seconds) and how many steps it ran.
struct ModeTimes {
    mode: StepMode,
    recent: [f64; RECENT],
    runs: u32,
}

impl ModeTimes {
    /// The median of the recent step times.
    fn time(&self) -> f64 {
        let n = (self.runs as usize).min(RECENT);
        let mut v = self.recent;
        v[..n].sort_by(f64::total_cmp);
        match n {
            0 => f64::INFINITY,
            n if n % 2 == 1 => v[n / 2],
            n => 0.5 * (v[n / 2 - 1] + v[n / 2]),
        }
    }
}

impl ModePolicy {
    /// The mode the next step of `shape` runs in, of `modes` (those it can run in; not empty).
    pub(crate) fn choose(&mut self, shape: (usize, usize), modes: &[StepMode]) -> StepMode {
        let Some(&first) = modes.first() else {
            return StepMode::Plain;
        };
        if modes.len() == 1 {
            return first;
        }
        if self.shapes.len() >= MAX_SHAPES && !self.shapes.contains_key(&shape) {
            self.shapes.clear();
        }
        let rec = self.shapes.entry(shape).or_default();
        let seen = |m: StepMode| {
            rec.modes
                .iter()
                .find(|r| r.mode == m)
                .map_or((f64::INFINITY, 0), |r| (r.time(), r.runs))
        };
        // warm-up: the mode run least so far (the first of them)
        let least = modes
            .iter()
            .copied()
            .min_by_key(|&m| seen(m).1)
            .unwrap_or(first);
        if seen(least).1 < WARMUP {
            return least;
        }
        let best = modes
            .iter()
            .copied()
            .min_by(|&a, &b| seen(a).0.total_cmp(&seen(b).0))
            .unwrap_or(first);
        rec.since += 1;
        if rec.since >= PROBE_EVERY {
            rec.since = 0;
            let others: Vec<StepMode> = modes.iter().copied().filter(|&m| m != best).collect();
            let probe = others[rec.probes as usize % others.len()];
            rec.probes = rec.probes.wrapping_add(1);
            return probe;
        }
        best
    }

    /// Records that a step of `shape` took `secs` in `mode`.
    pub(crate) fn record(&mut self, shape: (usize, usize), mode: StepMode, secs: f64) {
        let rec = self.shapes.entry(shape).or_default();
        let times = match rec.modes.iter().position(|r| r.mode == mode) {
            Some(i) => &mut rec.modes[i],
            None => {
                rec.modes.push(ModeTimes {
                    mode,
                    recent: [0.0; RECENT],
                    runs: 0,
                });
                rec.modes.last_mut().expect("just pushed")
            }
        };
        times.recent[times.runs as usize % RECENT] = secs;
        times.runs = times.runs.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [StepMode; 3] = [StepMode::Plain, StepMode::Overlap, StepMode::Split];

    /// Runs `steps` steps of one shape whose time is `time(mode)`; how many ran in each mode
    /// (in the order of [`ALL`]).
    fn drive(
        p: &mut ModePolicy,
        modes: &[StepMode],
        steps: usize,
        mut time: impl FnMut(StepMode) -> f64,
    ) -> [usize; 3] {
        let mut n = [0; 3];
        for _ in 0..steps {
            let m = p.choose((8, 8), modes);
            assert!(modes.contains(&m), "{m:?} is not one of {modes:?}");
            n[ALL.iter().position(|&a| a == m).unwrap()] += 1;
            p.record((8, 8), m, time(m));
        }
        n
    }

    #[test]
    fn the_mode_policy_tries_each_keeps_the_fastest_and_probes_the_others() {
        let mut p = ModePolicy::default();
        let t = |m: StepMode| match m {
            StepMode::Plain => 1.0,
            StepMode::Overlap => 1.5,
            StepMode::Split => 2.0,
        };
        // every mode three times first
        assert_eq!(drive(&mut p, &ALL, 9, t), [3, 3, 3]);
        // then the fastest, with a probe every 16 steps, the other modes taking turns
        assert_eq!(drive(&mut p, &ALL, 64, t), [60, 2, 2]);
        // when the overlap becomes the fastest, the probes find it and it is kept
        let n = drive(&mut p, &ALL, 128, |m| {
            if m == StepMode::Overlap {
                0.5
            } else {
                t(m)
            }
        });
        assert!(n[1] >= 70, "{n:?}");
        // one slow step of the mode kept does not hand the next 16 steps to a slower one
        let mut slow_once = true;
        let n = drive(&mut p, &ALL, 32, |m| match m {
            StepMode::Overlap if std::mem::take(&mut slow_once) => 5.0,
            StepMode::Overlap => 0.5,
            m => t(m),
        });
        assert!(n[1] >= 27, "{n:?}");
        // a step that can run in one mode only runs in it, and records nothing
        assert_eq!(p.choose((1, 1), &[StepMode::Plain]), StepMode::Plain);
        // another shape starts over (the first mode run least)
        assert_eq!(p.choose((2, 2), &ALL), StepMode::Plain);
        // the modes offered are the only ones chosen, even when a faster one was recorded
        let n = drive(&mut p, &[StepMode::Plain, StepMode::Split], 40, t);
        assert!(n[1] == 0 && n[2] <= 3 && n[0] >= 37, "{n:?}");
    }

    /// A backend that only says what it can do.
    struct Flags {
        overlaps: bool,
        always: bool,
        micro_batches: bool,
    }

    impl ExpertBackend for Flags {
        fn run_experts(
            &self,
            _: usize,
            _: &crate::expert::ActRows,
            _: &[crate::expert::ExpertPair],
            _: &mut [f32],
        ) -> Result<(), crate::error::ExpertError> {
            Ok(())
        }
        fn overlaps(&self) -> bool {
            self.overlaps
        }
        fn overlap_always(&self) -> bool {
            self.always
        }
        fn micro_batches(&self) -> bool {
            self.micro_batches
        }
    }

    #[test]
    fn a_step_is_offered_the_modes_that_change_something() {
        use StepMode::*;
        let b = |overlaps, always, micro_batches| Flags {
            overlaps,
            always,
            micro_batches,
        };
        let (one, two) = (1, 2);
        // a backend in process (or --no-overlap): no overlap only
        assert_eq!(step_modes(&b(false, false, true), true, two), [Plain]);
        // the default: every mode that changes something
        assert_eq!(
            step_modes(&b(true, false, true), true, two),
            [Plain, Overlap, Split]
        );
        assert_eq!(
            step_modes(&b(true, false, true), true, one),
            [Plain, Overlap]
        );
        // no shared expert: the overlap alone changes nothing
        assert_eq!(
            step_modes(&b(true, false, true), false, two),
            [Plain, Split]
        );
        assert_eq!(step_modes(&b(true, false, true), false, one), [Plain]);
        // --always-overlap
        assert_eq!(
            step_modes(&b(true, true, true), true, two),
            [Overlap, Split]
        );
        assert_eq!(step_modes(&b(true, true, false), true, two), [Overlap]);
        assert_eq!(step_modes(&b(true, true, false), false, one), [Overlap]);
        assert_eq!(step_shape(&toks(&[0, 1, 0, 2])), (4, 3));
    }

    fn toks(slots: &[usize]) -> Vec<Tok> {
        slots.iter().map(|&slot| Tok { slot, pos: 0 }).collect()
    }

    #[test]
    fn halves_hold_whole_sequences_and_about_half_the_rows() {
        assert_eq!(micro_batches(&toks(&[3])), None);
        assert_eq!(micro_batches(&toks(&[3, 3, 3])), None);
        assert_eq!(micro_batches(&toks(&[0, 1])), Some(vec![vec![0], vec![1]]));
        assert_eq!(
            micro_batches(&toks(&[0, 1, 2, 3, 4])),
            Some(vec![vec![0, 1], vec![2, 3, 4]])
        );
        // a 5-row prefill chunk of sequence 0 among three decodes: 5 rows against 3
        assert_eq!(
            micro_batches(&toks(&[0, 0, 0, 0, 0, 1, 2, 3])),
            Some(vec![vec![0, 1, 2, 3, 4], vec![5, 6, 7]])
        );
        // rows of a sequence need not be adjacent; its rows stay together
        assert_eq!(
            micro_batches(&toks(&[0, 1, 0, 2])),
            Some(vec![vec![0, 2], vec![1, 3]])
        );
    }
}
