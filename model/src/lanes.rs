//! The rows of one engine step as they go through the layers: one lane holding the whole
//! batch, or, when the experts are out on nodes (`ExpertBackend::overlaps` and
//! `micro_batches`), two micro-batches of whole sequences whose layer calls alternate: while one
//! half's experts are on the nodes the engine lands the other half's previous call, sums it, and
//! runs that half's next attention block and router (the dual-micro-batch overlap of large
//! expert-parallel deployments), for the step shapes where measured steps say it pays
//! ([`SplitPolicy`]). A row's values never depend on its lane: attention reads only
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

/// Steps of one shape each mode must have run before the faster one is kept.
const WARMUP: u32 = 3;
/// Steps of one shape between two runs of the mode not kept (its time may have changed).
const PROBE_EVERY: u32 = 16;
/// Weight of a step's time in its mode's running mean.
const ALPHA: f64 = 0.5;
/// Most step shapes remembered (prefill chunks make many; the table restarts past it).
const MAX_SHAPES: usize = 1024;

/// Whether two micro-batches pay, from measured step times: per step shape (rows, sequences),
/// each mode's recent step time; both are tried a few times, then the faster is kept and the
/// other is run again every [`PROBE_EVERY`] steps of that shape. They pay when the nodes compute
/// on cores of their own, and lose when the nodes share the coordinator's cores (one half's
/// attention then only takes cores from the other half's experts). Either mode gives the same
/// bits, so the choice changes only speed.
#[derive(Default)]
pub(crate) struct SplitPolicy {
    shapes: std::collections::HashMap<(usize, usize), ShapeRecord>,
}

/// One step shape's record: mean step seconds and steps of [whole, split], and steps since the
/// last probe.
type ShapeRecord = ([(f64, u32); 2], u32);

impl SplitPolicy {
    /// Whether the next step of `shape` runs as two micro-batches.
    pub(crate) fn choose(&mut self, shape: (usize, usize)) -> bool {
        if self.shapes.len() >= MAX_SHAPES && !self.shapes.contains_key(&shape) {
            self.shapes.clear();
        }
        let (arms, since) = self.shapes.entry(shape).or_default();
        let [(whole, n_whole), (split, n_split)] = *arms;
        if n_whole < WARMUP || n_split < WARMUP {
            return n_split <= n_whole;
        }
        let best = split <= whole;
        *since += 1;
        if *since >= PROBE_EVERY {
            *since = 0;
            return !best;
        }
        best
    }

    /// Records that a step of `shape` took `secs` in the mode `split`.
    pub(crate) fn record(&mut self, shape: (usize, usize), split: bool, secs: f64) {
        let (arms, _) = self.shapes.entry(shape).or_default();
        let (mean, n) = &mut arms[split as usize];
        *mean = if *n == 0 {
            secs
        } else {
            *mean + ALPHA * (secs - *mean)
        };
        *n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `steps` steps of one shape whose time is `time(split)`; how many were split.
    fn drive(p: &mut SplitPolicy, steps: usize, time: impl Fn(bool) -> f64) -> usize {
        let mut split = 0;
        for _ in 0..steps {
            let s = p.choose((8, 8));
            split += s as usize;
            p.record((8, 8), s, time(s));
        }
        split
    }

    #[test]
    fn the_split_policy_tries_both_keeps_the_faster_and_probes_the_other() {
        let mut p = SplitPolicy::default();
        // both modes three times first
        assert_eq!(drive(&mut p, 6, |s| if s { 2.0 } else { 1.0 }), 3);
        // then the faster (whole) with a probe of the split every 16 steps
        assert_eq!(drive(&mut p, 64, |s| if s { 2.0 } else { 1.0 }), 4);
        // when splitting becomes faster, the probes find it and it is kept
        let split = drive(&mut p, 96, |s| if s { 0.5 } else { 1.0 });
        assert!(split >= 60, "{split} of 96 split");
        // another shape starts over
        assert!(p.choose((2, 2)));
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
