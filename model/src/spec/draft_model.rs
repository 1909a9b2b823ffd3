//! The draft-model drafter: a second, small [`Engine`] over a model with the target's
//! vocabulary (checked token by token) drafts greedily with its own KV cache. Per sequence it
//! keeps what its cache holds; each call cuts that back to the longest prefix shared with the
//! sequence's verified tokens ([`Engine::truncate`], so rejected drafts are rolled back), feeds
//! the rest in one step and then proposes one token per step.

use super::{DraftKind, DraftRequest, Drafter};
use crate::engine::{Engine, EngineOptions, SeqId};
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

    fn draft_inner(&mut self, req: &DraftRequest) -> Result<Vec<u32>, ModelError> {
        if req.max == 0 || req.tokens.is_empty() {
            return Ok(Vec::new());
        }
        let ds = match self.seqs.remove(&req.key) {
            Some(d) => d,
            None => DraftSeq {
                seq: self.engine.add_sequence()?,
                held: Vec::new(),
            },
        };
        let DraftSeq { seq, mut held } = ds;
        // the key is re-inserted only on success; on error the sequence is dropped
        let res = (|| {
            let common = held
                .iter()
                .zip(req.tokens)
                .take_while(|(a, b)| a == b)
                .count();
            // the last token is fed again when the cache holds it: its logits are needed
            let keep = common.min(req.tokens.len() - 1);
            self.engine.truncate(seq, keep)?;
            held.truncate(keep);
            let mut logits = self.engine.prefill(seq, &req.tokens[keep..])?;
            held.extend_from_slice(&req.tokens[keep..]);
            let mut out = Vec::with_capacity(req.max);
            loop {
                let next = argmax(&logits);
                out.push(next);
                if out.len() == req.max {
                    break;
                }
                logits = self.engine.prefill(seq, &[next])?;
                held.push(next);
            }
            Ok(out)
        })();
        match res {
            Ok(out) => {
                self.seqs.insert(req.key, DraftSeq { seq, held });
                Ok(out)
            }
            Err(e) => {
                self.engine.remove_sequence(seq);
                Err(e)
            }
        }
    }
}

impl Drafter for DraftModel {
    fn kind(&self) -> DraftKind {
        DraftKind::Draft
    }

    fn draft(&mut self, req: &DraftRequest) -> Result<Vec<u32>, ModelError> {
        self.draft_inner(req)
    }

    fn end(&mut self, key: u64, _tokens: &[u32]) {
        if let Some(d) = self.seqs.remove(&key) {
            self.engine.remove_sequence(d.seq);
        }
    }
}
