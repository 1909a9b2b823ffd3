//! The engine step with the token masks of constrained sequences computed beside it: a helper
//! thread walks every constrained sequence's grammar while `forward` runs (a mask depends only
//! on the tokens already accepted, never on this step's logits). A speculating constrained
//! sequence gets one mask per row: its next token's, then each draft row's as if the drafts
//! before it were accepted ([`SeqConstraint::masks_along`], which rolls the matcher back), so
//! every row is sampled under exactly the mask decoding without drafts would use there. A step
//! without constrained sequences spawns nothing.

use super::{Loop, Seq};
use crate::scheduler::backend::{BatchToken, SeqId, StepEngine, StepError};
use nightshift_model::constrain::SeqConstraint;

/// One row's mask: None = unconstrained, Err = the matcher failed (the sequence fails).
pub(super) type RowMask = Option<Result<Vec<u32>, String>>;

/// What a draft row past the grammar's refusal holds: verification never samples it (the
/// row before it cannot be accepted), so reaching it is a bug, failed loudly.
const UNREACHABLE: &str = "internal error: a draft row past the grammar's refusal was sampled";

impl<E: StepEngine> Loop<E> {
    /// Runs the step; meanwhile a helper thread computes the token masks of every constrained
    /// sequence that gets logits (one entry per row of `owners`). `drafts[i]` are running
    /// sequence `i`'s draft tokens (its rows follow its decode row); `spec_rows` says which
    /// sequences carry how many.
    pub(super) fn forward_with_masks(
        &mut self,
        batch: &[BatchToken],
        owners: &[usize],
        drafts: &[Vec<u32>],
        spec_rows: &[(SeqId, usize)],
    ) -> (Result<Vec<Vec<f32>>, StepError>, Vec<RowMask>) {
        let constrained = owners.iter().any(|&i| self.running[i].constraint.is_some());
        if !constrained {
            return (self.forward(batch, spec_rows), vec![None; owners.len()]);
        }
        let text = self.text.clone();
        let Loop {
            engine, running, ..
        } = self;
        let running: &mut Vec<Seq> = running;
        // a sequence's first row takes its constraint and its draft (its other rows follow)
        let decoding: Vec<bool> = running.iter().map(|s| s.n_past >= s.n_prompt).collect();
        let mut slots: Vec<Option<&mut SeqConstraint>> =
            running.iter_mut().map(|s| s.constraint.as_mut()).collect();
        let mut jobs: Vec<(usize, &mut SeqConstraint, &[u32])> = Vec::new();
        for (row, &i) in owners.iter().enumerate() {
            if let Some(c) = slots.get_mut(i).and_then(Option::take) {
                let draft = match drafts.get(i) {
                    Some(d) if decoding[i] => &d[..],
                    _ => &[][..],
                };
                jobs.push((row, c, draft));
            }
        }
        let rows: Vec<(usize, usize)> = jobs.iter().map(|j| (j.0, j.2.len())).collect();
        std::thread::scope(|scope| {
            let helper = scope.spawn(move || {
                jobs.into_iter()
                    .map(|(row, c, draft)| (row, c.masks_along(draft, |t| text.is_eog(t))))
                    .collect::<Vec<_>>()
            });
            let result = if spec_rows.is_empty() {
                engine.forward(batch)
            } else {
                engine.forward_drafts(batch, spec_rows)
            };
            let mut masks: Vec<RowMask> = vec![None; owners.len()];
            match helper.join() {
                Ok(done) => {
                    for ((row, along), &(_, k)) in done.into_iter().zip(&rows) {
                        for j in 0..=k {
                            masks[row + j] = Some(Err(UNREACHABLE.to_string()));
                        }
                        for (j, m) in along.into_iter().enumerate().take(k + 1) {
                            masks[row + j] = Some(m.map_err(|e| e.to_string()));
                        }
                    }
                }
                Err(_) => {
                    for (row, k) in rows {
                        for j in 0..=k {
                            masks[row + j] = Some(Err("the mask thread panicked".to_string()));
                        }
                    }
                }
            }
            (result, masks)
        })
    }

    /// The step without masks: a plain forward, or a verification step with draft rows.
    fn forward(
        &mut self,
        batch: &[BatchToken],
        spec_rows: &[(SeqId, usize)],
    ) -> Result<Vec<Vec<f32>>, StepError> {
        if spec_rows.is_empty() {
            self.engine.forward(batch)
        } else {
            self.engine.forward_drafts(batch, spec_rows)
        }
    }
}
