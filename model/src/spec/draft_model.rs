//! The draft-model drafter: a second, small [`Engine`] over a model with the target's
//! vocabulary (checked token by token) drafts greedily with its own KV cache. Per sequence it
//! keeps what its cache holds; each call cuts that back to the longest prefix shared with the
//! sequence's verified tokens ([`Engine::truncate`], so rejected drafts are rolled back), feeds
//! the rest in one step and then proposes one token per step. The sequences of one scheduler
//! step draft together ([`Drafter::draft_many`]): every draft-engine step carries one row per
//! sequence still drafting, so the draft model's weights are read once per step for all.

use super::{DraftKind, DraftRequest, Drafter};
use crate::engine::{BatchToken, Engine, EngineOptions, SeqId};
use crate::error::ModelError;
use crate::expert::LocalExperts;
use crate::model::Model;
use crate::sampler::argmax;
use rayon::ThreadPool;
use std::collections::HashMap;
use std::sync::Arc;

/// Checks that `draft` can draft for `target`: the same vocabulary size and the same bytes for
/// every token.
pub fn check_vocab(draft: &Model, target: &Model) -> Result<(), ModelError> {
    let (dt, tt) = (draft.tokenizer(), target.tokenizer());
    let (dn, tn) = (draft.config().n_vocab, target.config().n_vocab);
    if dn != tn || dt.vocab_size() != tt.vocab_size() {
        return Err(ModelError::Draft(format!(
            "expected the target's vocabulary of {tn} tokens, found {dn}"
        )));
    }
    if let Some(id) = (0..tt.vocab_size() as u32).find(|&i| dt.token_bytes(i) != tt.token_bytes(i))
    {
        return Err(ModelError::Draft(format!(
            "expected the target's vocabulary, found token {id} spelled {:?} instead of {:?}",
            String::from_utf8_lossy(dt.token_bytes(id)),
            String::from_utf8_lossy(tt.token_bytes(id))
        )));
    }
    Ok(())
}

/// One sequence's state in the draft engine: its id and the tokens its cache holds.
struct DraftSeq {
    seq: SeqId,
    held: Vec<u32>,
}

/// Greedy drafting with a small model.
pub struct DraftModel {
    engine: Engine,
    seqs: HashMap<u64, DraftSeq>,
}

impl DraftModel {
    /// A drafter over `draft` (experts in process, on `pool`) for sequences of `target`, with a
    /// cache of `kv_budget_tokens` positions shared by the sequences it drafts for.
    pub fn new(
        draft: Arc<Model>,
        target: &Model,
        pool: Arc<ThreadPool>,
        kv_budget_tokens: usize,
    ) -> Result<DraftModel, ModelError> {
        check_vocab(&draft, target)?;
        let backend = Arc::new(LocalExperts::new(draft.clone(), Some(pool.clone())));
        let opts = EngineOptions {
            pool: Some(pool),
            kv_budget_tokens,
            prefix_cache: false,
            ..EngineOptions::default()
        };
        Ok(DraftModel {
            engine: Engine::new(draft, backend, opts)?,
            seqs: HashMap::new(),
        })
    }

    /// The draft engine (its step profile, KV statistics).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Drafts for every request in the same draft-engine steps. On success each sequence's
    /// state goes back to the table; on an error every sequence of the call is dropped (its
    /// cache freed), to start afresh next time.
    fn draft_batch(&mut self, reqs: &[DraftRequest]) -> Result<Vec<Vec<u32>>, ModelError> {
        let mut live: Vec<(usize, DraftSeq)> = Vec::new();
        let res = self.draft_into(reqs, &mut live);
        match res {
            Ok(out) => {
                for (i, ds) in live {
                    self.seqs.insert(reqs[i].key, ds);
                }
                Ok(out)
            }
            Err(e) => {
                for (_, ds) in live {
                    self.engine.remove_sequence(ds.seq);
                }
                Err(e)
            }
        }
    }

    /// One step feeds every sequence what its cache lacks (cut back first to the longest
    /// prefix shared with its verified tokens; the last token is fed again when the cache
    /// holds it, its logits are needed), then each step proposes one more token for every
    /// sequence still short of its `max`. `live` collects the sequences taken out of the table.
    fn draft_into(
        &mut self,
        reqs: &[DraftRequest],
        live: &mut Vec<(usize, DraftSeq)>,
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        let mut out = vec![Vec::new(); reqs.len()];
        for (i, r) in reqs.iter().enumerate() {
            if r.max == 0 || r.tokens.is_empty() {
                continue;
            }
            let ds = match self.seqs.remove(&r.key) {
                Some(d) => d,
                None => DraftSeq {
                    seq: self.engine.add_sequence()?,
                    held: Vec::new(),
                },
            };
            live.push((i, ds));
        }
        if live.is_empty() {
            return Ok(out);
        }
        let mut batch = Vec::new();
        for (i, ds) in live.iter_mut() {
            let tokens = reqs[*i].tokens;
            let common = ds
                .held
                .iter()
                .zip(tokens)
                .take_while(|(a, b)| a == b)
                .count();
            let keep = common.min(tokens.len() - 1);
            self.engine.truncate(ds.seq, keep)?;
            ds.held.truncate(keep);
            let n = tokens.len() - keep;
            for (j, &token) in tokens[keep..].iter().enumerate() {
                batch.push(BatchToken {
                    seq: ds.seq,
                    token,
                    pos: (keep + j) as u32,
                    want_logits: j + 1 == n,
                });
            }
            ds.held.extend_from_slice(&tokens[keep..]);
        }
        // one row of logits per live sequence, in order
        let mut logits = self.engine.forward(&batch)?;
        let mut active: Vec<usize> = (0..live.len()).collect();
        loop {
            let mut batch = Vec::new();
            let mut still = Vec::new();
            for (&a, row) in active.iter().zip(&logits) {
                let (i, ds) = &mut live[a];
                let next = argmax(row);
                out[*i].push(next);
                if out[*i].len() < reqs[*i].max {
                    batch.push(BatchToken {
                        seq: ds.seq,
                        token: next,
                        pos: ds.held.len() as u32,
                        want_logits: true,
                    });
                    ds.held.push(next);
                    still.push(a);
                }
            }
            if still.is_empty() {
                return Ok(out);
            }
            logits = self.engine.forward(&batch)?;
            active = still;
        }
    }
}

impl Drafter for DraftModel {
    fn kind(&self) -> DraftKind {
        DraftKind::Draft
    }

    fn draft(&mut self, req: &DraftRequest) -> Result<Vec<u32>, ModelError> {
        let mut out = self.draft_batch(std::slice::from_ref(req))?;
        Ok(out.pop().unwrap_or_default())
    }

    /// All the sequences of a step draft together: each draft-engine step carries one row per
    /// sequence still drafting, so k tokens for n sequences cost k + 1 steps, not n (k + 1).
    fn draft_many(&mut self, reqs: &[DraftRequest]) -> Vec<Result<Vec<u32>, ModelError>> {
        match self.draft_batch(reqs) {
            Ok(out) => out.into_iter().map(Ok).collect(),
            Err(e) => {
                let msg = e.to_string();
                reqs.iter()
                    .map(|_| Err(ModelError::Draft(msg.clone())))
                    .collect()
            }
        }
    }

    fn end(&mut self, key: u64, _tokens: &[u32]) {
        if let Some(d) = self.seqs.remove(&key) {
            self.engine.remove_sequence(d.seq);
        }
    }
}
