//! Speculative decoding's model-side parts: the drafters that propose the next tokens of a
//! sequence (behind the one [`Drafter`] trait) and the [`policy`] that decides how many of them
//! a verification step carries. The scheduler owns the verification itself: a sequence's draft
//! tokens become extra rows of the same engine step, each row's logits go through the sequence's
//! one [`crate::Sampler`] in order, and the first sampled token that differs from the draft ends
//! the run (the KV cache is cut back with [`crate::Engine::truncate`]).
//!
//! Why sampling this way is exact: every draft here is a point mass q (model-free lookups and
//! the greedy draft model propose one token per position). Standard speculative sampling then
//! accepts draft d with probability p(d) and otherwise draws from p with d removed,
//! renormalised; drawing x ~ p and accepting iff x = d has the same law (P(accept) = p(d); given
//! a rejection, x is distributed as p without d, renormalised). Drawing x from the target's
//! distribution with the sequence's own seeded generator, one draw per emitted token, makes the
//! emitted tokens the very tokens decoding without speculation draws: **speculation never
//! changes the output, greedy or seeded**, as long as the verification rows' logits are the bits
//! a one-token step gives (the engine's kernels are batch invariant).
//!
//! Knows nothing about HTTP: the coordinator's scheduler drives it.

pub mod draft_model;
pub mod ngram;
pub mod policy;
pub mod suffix;

pub use draft_model::DraftModel;
pub use ngram::NgramDrafter;
pub use policy::{Acceptance, DrafterRecord, SeqAcceptance, StepTimes};
pub use suffix::SuffixDrafter;

use crate::error::ModelError;

/// Which drafter proposes tokens (`--speculative`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DraftKind {
    /// n-gram prompt lookup over the sequence's own prompt and output.
    Ngram,
    /// Suffix matching over the sequence and a window of recent requests' text.
    Suffix,
    /// A small model with the same vocabulary, drafting greedily.
    Draft,
}

impl DraftKind {
    /// The name used in flags and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            DraftKind::Ngram => "ngram",
            DraftKind::Suffix => "suffix",
            DraftKind::Draft => "draft",
        }
    }

    /// Parses `ngram|suffix|draft|off` (None = off).
    pub fn parse(s: &str) -> Result<Option<DraftKind>, String> {
        match s {
            "ngram" => Ok(Some(DraftKind::Ngram)),
            "suffix" => Ok(Some(DraftKind::Suffix)),
            "draft" => Ok(Some(DraftKind::Draft)),
            "off" => Ok(None),
            other => Err(format!(
                "expected one of ngram, suffix, draft, off for --speculative, found {other:?}"
            )),
        }
    }
}

/// What a drafter is asked for one sequence.
#[derive(Clone, Copy, Debug)]
pub struct DraftRequest<'a> {
    /// The sequence (the caller's key, stable for its lifetime).
    pub key: u64,
    /// Its prompt and the tokens generated so far; the draft continues them.
    pub tokens: &'a [u32],
    /// Extra text to look continuations up in (OpenAI's `prediction`, tokenized); may be empty.
    /// Its first `extra_from` tokens are the text it follows ([`ngram::predicted_output`]):
    /// they only extend matches back, never give a draft.
    pub extra: &'a [u32],
    pub extra_from: usize,
    /// Most tokens to propose.
    pub max: usize,
}

/// Proposes the likely next tokens of a sequence. A drafter may keep state per sequence
/// (`begin`/`end`) and across sequences (recent text); drafts only ever cost time, never
/// change the output.
pub trait Drafter: Send {
    fn kind(&self) -> DraftKind;
    /// A sequence starts with `prompt`.
    fn begin(&mut self, _key: u64, _prompt: &[u32]) {}
    /// Up to `req.max` tokens likely to follow `req.tokens` (possibly none).
    fn draft(&mut self, req: &DraftRequest) -> Result<Vec<u32>, ModelError>;
    /// [`Drafter::draft`] for several sequences of one step (distinct keys), answers in order. A
    /// drafter that runs a model overrides it to draft them all in the same steps.
    fn draft_many(&mut self, reqs: &[DraftRequest]) -> Vec<Result<Vec<u32>, ModelError>> {
        reqs.iter().map(|r| self.draft(r)).collect()
    }
    /// The sequence ended holding `tokens` (prompt and output).
    fn end(&mut self, _key: u64, _tokens: &[u32]) {}
}
