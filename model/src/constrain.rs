//! Constrained decoding: a grammar (a JSON Schema, any JSON object, or a Lark grammar such as a
//! model's tool-call format with `%json` arguments) turned into a token mask per step, so the
//! generated text is valid by construction, whatever the weights. The engine is llguidance (the
//! one llama.cpp and vLLM use): an Earley parser over a lexer whose token masks walk a trie of
//! the vocabulary (`toktrie`), ~50 µs per mask on 128k-token vocabularies, no grammar-sized
//! precomputation, and a JSON Schema compiler that names what it does not support.
//!
//! [`ConstraintVocab`] is built once per model from the GGUF vocabulary: normal tokens are their
//! bytes; control, user-defined-but-bracketed and unused tokens are *special* (never produced by
//! text, only by name in a grammar: `<|tool_call_begin|>`), so a constrained sequence cannot
//! slip an end-of-turn marker into a JSON string. [`SeqConstraint`] is one sequence's matcher:
//! `mask()` before sampling, `accept(token)` after.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};

use crate::tokenizer::{TokenType, Tokenizer};

/// Why a grammar cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// The grammar or schema is invalid or uses something the engine does not support (the
    /// message names it).
    #[error("{0}")]
    Unsupported(String),
    /// The vocabulary cannot back a constraint.
    #[error("the vocabulary cannot be used for constrained decoding: {0}")]
    Vocab(String),
    /// The matcher failed on a token (it was not allowed).
    #[error("constrained decoding failed: {0}")]
    Matcher(String),
}

/// What a sequence's output must be.
#[derive(Clone, Debug)]
pub enum Grammar {
    /// Any JSON object.
    JsonObject,
    /// A value valid against this JSON Schema.
    JsonSchema(serde_json::Value),
    /// A Lark grammar (llguidance's dialect: `%json {..}`, `<special>` tokens).
    Lark(String),
}

/// The JSON layout constrained JSON follows: Python's separators, no free whitespace, so the
/// text is what `json.dumps` writes and a sequence cannot spend its tokens on blanks.
pub fn json_layout() -> serde_json::Value {
    serde_json::json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    })
}

/// A JSON Schema with [`json_layout`] as its `x-guidance` options (kept when it has its own).
pub fn with_layout(schema: &serde_json::Value) -> serde_json::Value {
    match schema {
        serde_json::Value::Object(m) if !m.contains_key("x-guidance") => {
            let mut out = serde_json::Map::new();
            out.insert("x-guidance".into(), json_layout());
            out.extend(m.clone());
            serde_json::Value::Object(out)
        }
        other => other.clone(),
    }
}

/// The model's vocabulary as the constraint engine sees it; shared by every sequence.
pub struct ConstraintVocab {
    factory: Arc<ParserFactory>,
    env: TokEnv,
}

impl std::fmt::Debug for ConstraintVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ConstraintVocab({} tokens)",
            self.env.tok_trie().vocab_size()
        )
    }
}

impl ConstraintVocab {
    /// From each token's bytes and whether it is special; `eos` ends a finished grammar.
    pub fn new(tokens: Vec<(Vec<u8>, bool)>, eos: u32) -> Result<ConstraintVocab, ConstraintError> {
        let n = tokens.len() as u32;
        if eos >= n {
            return Err(ConstraintError::Vocab(format!(
                "the end token {eos} is outside the vocabulary of {n}"
            )));
        }
        let words: Vec<Vec<u8>> = tokens
            .into_iter()
            .map(|(bytes, special)| {
                if special {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(&bytes);
                    w
                } else {
                    bytes
                }
            })
            .collect();
        let info = TokRxInfo::new(n, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Vocab(e.to_string()))?;
        factory.quiet();
        Ok(ConstraintVocab {
            factory: Arc::new(factory),
            env,
        })
    }

    /// From a model's tokenizer: control, unused and unknown tokens are special, and so are
    /// user-defined ones written like markers (`<|...|>`, `<｜...｜>`); others are their bytes.
    pub fn from_tokenizer(tok: &Tokenizer) -> Result<ConstraintVocab, ConstraintError> {
        let eos = tok
            .eot()
            .or(tok.eos())
            .ok_or_else(|| ConstraintError::Vocab("the model has no end token".into()))?;
        let tokens = (0..tok.vocab_size() as u32)
            .map(|id| {
                let bytes = tok.token_bytes(id).to_vec();
                let special = match tok.token_type(id) {
                    Some(TokenType::Control | TokenType::Unused | TokenType::Unknown) => true,
                    Some(TokenType::UserDefined) => {
                        let s = String::from_utf8_lossy(&bytes);
                        (s.starts_with("<|") && s.ends_with("|>"))
                            || (s.starts_with("<｜") && s.ends_with("｜>"))
                    }
                    _ => false,
                };
                (bytes, special || tok.is_eog(id))
            })
            .collect();
        ConstraintVocab::new(tokens, eos)
    }

    pub fn vocab_size(&self) -> usize {
        self.env.tok_trie().vocab_size()
    }

    /// Whether `name` (e.g. `<|tool_call_begin|>`) is a special token of the vocabulary.
    pub fn has_special(&self, name: &str) -> bool {
        let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        w.extend_from_slice(name.as_bytes());
        self.env.tok_trie().token_id_at_bytes(&w).is_some()
    }

    /// Compiles a grammar for one sequence; errors name what is wrong or unsupported.
    pub fn compile(&self, g: &Grammar) -> Result<SeqConstraint, ConstraintError> {
        let top = match g {
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(with_layout(
                &serde_json::json!({"type": "object"}),
            )),
            Grammar::JsonSchema(s) => TopLevelGrammar::from_json_schema(with_layout(s)),
            Grammar::Lark(l) => TopLevelGrammar::from_lark(l.clone()),
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| ConstraintError::Unsupported(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::Unsupported(e));
        }
        Ok(SeqConstraint {
            matcher,
            vocab: self.vocab_size(),
        })
    }
}

/// One sequence's constraint.
pub struct SeqConstraint {
    matcher: Matcher,
    vocab: usize,
}

impl std::fmt::Debug for SeqConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SeqConstraint(stopped: {})", self.matcher.is_stopped())
    }
}

impl SeqConstraint {
    /// The tokens allowed next (bit `t` of the words; see `sampler::TokenMask`); only the end
    /// token once the grammar is complete.
    pub fn mask(&mut self) -> Result<Vec<u32>, ConstraintError> {
        let m = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| ConstraintError::Matcher(e.to_string()))?;
        let mut words = m.as_slice().to_vec();
        words.truncate(self.vocab.div_ceil(32));
        Ok(words)
    }

    /// Records the sampled token.
    pub fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstraintError::Matcher(e.to_string()))
    }

    /// Whether the grammar is complete (only the end token is allowed).
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// How many leading tokens of `draft` the grammar allows in turn from here, without moving
    /// the matcher: a draft is cut there before it becomes rows, since verification could never
    /// accept a token past it. On a matcher error nothing is cut (the masks report it).
    pub fn allowed_prefix(&mut self, draft: &[u32]) -> usize {
        if draft.is_empty() || self.matcher.is_stopped() {
            return 0;
        }
        self.matcher
            .validate_tokens(draft)
            .map_or(draft.len(), |n| n.min(draft.len()))
    }

    /// The masks of a verification step's rows: the next token's, then, for each draft token
    /// in turn, the mask as if the drafts before it had been accepted. The walk stops after
    /// the mask of the first draft token the grammar refuses or that ends the sequence (`ends`):
    /// a verification cannot get past it, so later rows get no mask. The matcher is rolled back
    /// to where it started, so sampling then accepts the tokens actually drawn; the masks are
    /// the ones decoding without drafts computes at the same positions. A matcher error (a
    /// grammar engine limit; llguidance's errors are sticky) is the last row's entry.
    pub fn masks_along(
        &mut self,
        draft: &[u32],
        ends: impl Fn(u32) -> bool,
    ) -> Vec<Result<Vec<u32>, ConstraintError>> {
        let mut out = Vec::with_capacity(draft.len() + 1);
        let mut consumed = 0;
        for j in 0..=draft.len() {
            let mask = self.mask();
            let next = match (&mask, draft.get(j)) {
                (Ok(m), Some(&t)) if !ends(t) && crate::sampler::TokenMask(m).allows(t) => Some(t),
                _ => None,
            };
            out.push(mask);
            let Some(t) = next else { break };
            if let Err(e) = self.accept(t) {
                out.push(Err(e));
                break;
            }
            consumed += 1;
        }
        if let Err(e) = self.matcher.rollback(consumed) {
            // the matcher is not where sampling expects it: the sequence fails at this step
            return vec![Err(ConstraintError::Matcher(e.to_string()))];
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::TokenMask;
    use nightshift_kernels::rng::SplitMix64;

    /// Bytes 0..=255 plus a special end token (256).
    fn byte_vocab() -> ConstraintVocab {
        let mut t: Vec<(Vec<u8>, bool)> = (0..=255u8).map(|b| (vec![b], false)).collect();
        t.push((b"<end>".to_vec(), true));
        ConstraintVocab::new(t, 256).unwrap()
    }

    /// Walks a constraint with random allowed tokens until only the end is allowed.
    fn walk(v: &ConstraintVocab, g: &Grammar, seed: u64) -> String {
        let mut c = v.compile(g).unwrap();
        let mut r = SplitMix64::new(seed);
        let mut out = Vec::new();
        for _ in 0..2000 {
            let m = c.mask().unwrap();
            let allowed: Vec<u32> = (0..v.vocab_size() as u32)
                .filter(|&t| TokenMask(&m).allows(t))
                .collect();
            assert!(!allowed.is_empty());
            // prefer ending when possible, so walks are short
            let t = if allowed.contains(&256) && r.below(2) == 0 {
                256
            } else {
                allowed[r.below(allowed.len() as u64) as usize]
            };
            if t == 256 {
                return String::from_utf8(out).unwrap();
            }
            c.accept(t).unwrap();
            out.push(t as u8);
        }
        panic!(
            "no end after 2000 tokens: {:?}",
            String::from_utf8_lossy(&out)
        );
    }

    #[test]
    fn random_walks_give_valid_json() {
        let v = byte_vocab();
        let schema = serde_json::json!({"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 5},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}},
            "required": ["city", "days"], "additionalProperties": false});
        for seed in 0..20 {
            let s = walk(&v, &Grammar::JsonSchema(schema.clone()), seed);
            let j: serde_json::Value =
                serde_json::from_str(&s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert!(
                j["city"].as_str().is_some_and(|c| c.chars().count() <= 5),
                "{s}"
            );
            assert!(
                j["days"].as_i64().is_some_and(|d| (1..=14).contains(&d)),
                "{s}"
            );
            assert!(s.starts_with("{\"city\": \""), "python layout: {s}");
        }
        let s = walk(&v, &Grammar::JsonObject, 3);
        assert!(serde_json::from_str::<serde_json::Value>(&s)
            .unwrap()
            .is_object());
    }

    #[test]
    fn masks_along_a_draft_are_the_masks_of_accepting_it_and_roll_back() {
        let v = byte_vocab();
        let schema = serde_json::json!({"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 8}},
            "required": ["city"], "additionalProperties": false});
        let g = Grammar::JsonSchema(schema);
        let text = b"{\"city\": \"Oslo\"}";
        let ends = |t: u32| t == 256;
        let mut r = SplitMix64::new(11);
        for start in [0usize, 3, 10] {
            for trial in 0..12 {
                // the sequence so far: `start` bytes of a valid text
                let mut c = v.compile(&g).unwrap();
                for &b in &text[..start] {
                    c.accept(u32::from(b)).unwrap();
                }
                // a draft that follows the text, then may go wrong or end
                let len = 1 + r.below(6) as usize;
                let mut draft: Vec<u32> = text[start..]
                    .iter()
                    .take(len)
                    .map(|&b| u32::from(b))
                    .collect();
                let bad = trial % 3;
                if bad > 0 && !draft.is_empty() {
                    let j = r.below(draft.len() as u64) as usize;
                    draft[j] = if bad == 1 { u32::from(b'#') } else { 256 };
                }
                let before = c.mask().unwrap();
                let got = c.masks_along(&draft, ends);
                // a fresh matcher fed the same tokens gives the same masks, row by row
                let mut f = v.compile(&g).unwrap();
                for &b in &text[..start] {
                    f.accept(u32::from(b)).unwrap();
                }
                let mut want = Vec::new();
                for j in 0..=draft.len() {
                    let m = f.mask().unwrap();
                    let goes_on = draft
                        .get(j)
                        .is_some_and(|&t| !ends(t) && TokenMask(&m).allows(t));
                    want.push(m);
                    if !goes_on {
                        break;
                    }
                    f.accept(draft[j]).unwrap();
                }
                let got: Vec<Vec<u32>> = got.into_iter().map(Result::unwrap).collect();
                assert_eq!(got, want, "start {start}, draft {draft:?}");
                // rolled back: the next mask is the one before the walk, and it goes on
                assert_eq!(c.mask().unwrap(), before);
                for &b in &text[start..] {
                    c.accept(u32::from(b)).unwrap();
                }
                assert!(TokenMask(&c.mask().unwrap()).allows(256));
            }
        }
    }

    #[test]
    fn unsupported_schemas_are_errors_naming_the_problem() {
        let v = byte_vocab();
        let bad = serde_json::json!({"type": "string", "pattern": "(?<=a)b"});
        let e = v
            .compile(&Grammar::JsonSchema(bad))
            .unwrap_err()
            .to_string();
        assert!(!e.is_empty());
        let e = v
            .compile(&Grammar::Lark("start: nope".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope"), "{e}");
    }
}
