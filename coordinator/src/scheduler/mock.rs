//! A deterministic stand-in for the model, for the scheduler and gateway tests: byte tokens
//! (id = byte, 256 = EOS), a toy chat template, and an engine whose logits depend on the whole
//! history of the sequence (so any mix-up between batched sequences changes the output). The
//! engine checks that every sequence is fed contiguous positions and fails the step otherwise.
//! The toy template writes tool calls in the Hermes format (and opens a think block in the
//! prompt with `chat_template_kwargs` `thinking`), and the byte vocabulary backs
//! constrained decoding, so the gateway's tool and structured-output paths run on it too.
//! Like the real engine it can keep prefixes (its state after every full block of 16 tokens) and
//! start a new sequence from the longest one its prompt begins with; its output is the same
//! either way.

use super::backend::{
    AdmitError, Admitted, Attached, BatchToken, ChatPrompt, KvStats, SeqId, StepEngine, StepError,
    TextModel,
};
use nightshift_model::constrain::ConstraintVocab;
use nightshift_model::toolcall::ToolFormat;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub const EOS: u32 = 256;
pub const VOCAB: usize = 257;

pub struct MockText;

/// The byte vocabulary (EOS special), built once.
fn mock_vocab() -> Option<Arc<ConstraintVocab>> {
    static VOCAB: std::sync::OnceLock<Option<Arc<ConstraintVocab>>> = std::sync::OnceLock::new();
    VOCAB
        .get_or_init(|| {
            let mut tokens: Vec<(Vec<u8>, bool)> = (0..=255u8).map(|b| (vec![b], false)).collect();
            tokens.push((b"<eos>".to_vec(), true));
            ConstraintVocab::new(tokens, EOS).ok().map(Arc::new)
        })
        .clone()
}

impl TextModel for MockText {
    fn render_chat(&self, prompt: &ChatPrompt) -> Result<String, String> {
        let mut s = String::new();
        if let Some(tools) = &prompt.tools {
            let names: Vec<&str> = tools
                .iter()
                .filter_map(|t| t.pointer("/function/name").and_then(|n| n.as_str()))
                .collect();
            s.push_str(&format!("<tools>{}\n", names.join(",")));
        }
        for t in &prompt.messages {
            s.push_str(&format!("<{}>{}", t.role, t.content));
            for c in &t.tool_calls {
                s.push_str(&format!(
                    "<tool_call>{}({})</tool_call>",
                    c.name, c.arguments
                ));
            }
            if let Some(id) = &t.tool_call_id {
                s.push_str(&format!("<id>{id}"));
            }
            s.push('\n');
        }
        s.push_str("<assistant>");
        // `thinking` opens the think block in the prompt, as DeepSeek-V3.1's template does
        let thinking = prompt.extra.as_ref().and_then(|e| e.get("thinking"));
        if thinking == Some(&serde_json::Value::Bool(true)) {
            s.push_str("<think>\n");
        }
        Ok(s)
    }
    fn tool_format(&self) -> Option<ToolFormat> {
        Some(ToolFormat::Hermes)
    }

    /// The toy template takes think blocks as the thinking models' do.
    fn splits_reasoning(&self, asked: Option<bool>) -> bool {
        asked.unwrap_or(true)
    }

    fn constraint_vocab(&self) -> Option<Arc<ConstraintVocab>> {
        mock_vocab()
    }
    fn encode(&self, text: &str, _chat: bool) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        if id < 256 {
            vec![id as u8]
        } else {
            Vec::new()
        }
    }
    fn max_token_bytes(&self) -> usize {
        1
    }
    fn is_eog(&self, id: u32) -> bool {
        id == EOS
    }
    fn vocab_size(&self) -> usize {
        VOCAB
    }
}

/// The toy model with a BOS token, which it puts before every prompt it tokenizes: the EOS
/// token, as GPT-2's `<|endoftext|>` is both. Otherwise `MockText`.
pub struct MockBosText;

impl TextModel for MockBosText {
    fn render_chat(&self, prompt: &ChatPrompt) -> Result<String, String> {
        MockText.render_chat(prompt)
    }
    fn tool_format(&self) -> Option<ToolFormat> {
        MockText.tool_format()
    }
    fn splits_reasoning(&self, asked: Option<bool>) -> bool {
        MockText.splits_reasoning(asked)
    }
    fn constraint_vocab(&self) -> Option<Arc<ConstraintVocab>> {
        MockText.constraint_vocab()
    }
    fn encode(&self, text: &str, chat: bool) -> Vec<u32> {
        let mut ids = vec![EOS];
        ids.extend(MockText.encode(text, chat));
        ids
    }
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        MockText.token_bytes(id)
    }
    fn max_token_bytes(&self) -> usize {
        MockText.max_token_bytes()
    }
    fn is_eog(&self, id: u32) -> bool {
        MockText.is_eog(id)
    }
    fn vocab_size(&self) -> usize {
        MockText.vocab_size()
    }
}

/// Positions per cached prefix block.
pub const BLOCK: usize = 16;

/// Per-sequence state: next expected position, a hash of everything seen, the tokens seen and
/// the positions admission promised.
#[derive(Default)]
struct MockSeq {
    next_pos: u32,
    hash: u64,
    tokens: Vec<u32>,
    max_len: usize,
    /// The prompt, and whether it may start from (and attach to) cached prefixes.
    prompt: Vec<u32>,
    reuse: bool,
}

pub struct MockEngine {
    seqs: HashMap<SeqId, MockSeq>,
    next: u32,
    /// Sequences the "KV cache" can hold.
    pub kv_seqs: usize,
    /// Positions admission may promise over all live sequences (0 = no limit); a lone
    /// sequence is admitted whatever it asks.
    pub kv_budget: usize,
    /// Keep prefixes and start sequences from them.
    pub prefix: bool,
    /// The state after each cached prefix (a whole number of blocks).
    cache: HashMap<Vec<u32>, u64>,
    stats: KvStats,
    /// Largest batch seen (shared so tests can read it after the engine moved to its thread).
    pub max_batch: Arc<AtomicUsize>,
    /// Sequences currently allocated (shared for tests: KV freed on cancel).
    pub live: Arc<AtomicUsize>,
    /// Most sequences allocated at once (shared for tests: admission limits).
    pub peak_live: Arc<AtomicUsize>,
    /// Sleep per step, to make concurrency observable.
    pub step_delay: std::time::Duration,
    /// Sleep per row on top of `step_delay` (a step's cost grows with its rows, as the
    /// engine's does: what the speculation policy measures).
    pub row_delay: std::time::Duration,
    /// Whether EOS can win (off: sequences end only by length or stop strings).
    pub eos: bool,
    /// Truncations that dropped positions (rejected drafts; shared for tests).
    pub truncations: Arc<AtomicUsize>,
    /// When set, every batch run is appended, in order (for tests: what each step computed).
    pub batches: Option<Arc<std::sync::Mutex<Vec<Vec<BatchToken>>>>>,
    /// When set, the first step waits until something is sent (or the sender dropped): tests
    /// submit several requests before any of them runs, whatever the threads' timing.
    pub hold: Option<std::sync::mpsc::Receiver<()>>,
}

impl MockEngine {
    pub fn new(kv_seqs: usize) -> MockEngine {
        MockEngine {
            seqs: HashMap::new(),
            next: 1,
            kv_seqs,
            kv_budget: 0,
            prefix: false,
            cache: HashMap::new(),
            stats: KvStats {
                block: BLOCK,
                ..KvStats::default()
            },
            max_batch: Arc::new(AtomicUsize::new(0)),
            live: Arc::new(AtomicUsize::new(0)),
            peak_live: Arc::new(AtomicUsize::new(0)),
            step_delay: std::time::Duration::ZERO,
            row_delay: std::time::Duration::ZERO,
            eos: true,
            truncations: Arc::new(AtomicUsize::new(0)),
            batches: None,
            hold: None,
        }
    }

    /// Logits: the next byte is a lowercase letter, space or EOS chosen from the hash;
    /// a clear winner so greedy is well defined.
    fn logits(hash: u64, eos: bool) -> Vec<f32> {
        let mut l: Vec<f32> = (0..VOCAB)
            .map(|i| ((hash.rotate_left(i as u32 % 64) ^ i as u64) % 1000) as f32 / 1000.0)
            .collect();
        let r = hash % 40;
        let best = match r {
            0..=25 => b'a' as usize + r as usize,
            26..=33 => b' ' as usize,
            34 if eos => EOS as usize,
            _ => b'e' as usize,
        };
        if !eos {
            l[EOS as usize] = -10.0;
        }
        l[best] += 5.0;
        l
    }
}

fn mix(h: u64, token: u32, pos: u32) -> u64 {
    let z = h ^ ((token as u64) << 32 | pos as u64);
    nightshift_kernels::rng::mix(z.wrapping_add(0x9e37_79b9_7f4a_7c15))
}

impl StepEngine for MockEngine {
    fn add_sequence(
        &mut self,
        prompt: &[u32],
        max_len: usize,
        reuse: bool,
    ) -> Result<Admitted, AdmitError> {
        if self.seqs.len() >= self.kv_seqs {
            return Err(AdmitError::Full);
        }
        let promised: usize = self.seqs.values().map(|s| s.max_len).sum();
        if self.kv_budget > 0 && !self.seqs.is_empty() && promised + max_len > self.kv_budget {
            return Err(AdmitError::Full);
        }
        let mut seq = MockSeq {
            max_len,
            prompt: prompt.to_vec(),
            reuse: self.prefix && reuse,
            ..MockSeq::default()
        };
        if self.prefix && reuse {
            let most = prompt.len().saturating_sub(1) / BLOCK * BLOCK;
            if let Some(n) = (1..=most / BLOCK)
                .rev()
                .map(|k| k * BLOCK)
                .find(|&n| self.cache.contains_key(&prompt[..n]))
            {
                seq.hash = self.cache[&prompt[..n]];
                seq.next_pos = n as u32;
                seq.tokens = prompt[..n].to_vec();
            }
            self.stats.lookups += 1;
            self.stats.lookup_tokens += prompt.len() as u64;
            self.stats.hit_tokens += seq.tokens.len() as u64;
        }
        let cached = seq.tokens.len();
        let h = SeqId(self.next);
        self.next += 1;
        self.seqs.insert(h, seq);
        let now = self.live.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak_live.fetch_max(now, Ordering::SeqCst);
        Ok(Admitted { seq: h, cached })
    }
    fn remove_sequence(&mut self, seq: SeqId) {
        if self.seqs.remove(&seq).is_some() {
            self.live.fetch_sub(1, Ordering::SeqCst);
        }
    }
    fn attach(&mut self, seq: SeqId) -> Result<Attached, StepError> {
        let s = self.seqs.get(&seq).ok_or_else(|| StepError {
            unavailable: false,
            message: format!("unknown sequence {}", seq.0),
        })?;
        let start = s.tokens.len();
        let mut len = start;
        let mut wait = false;
        if s.reuse && len % BLOCK == 0 && s.next_pos as usize == len {
            // whole blocks, never the last prompt position
            while len + BLOCK < s.prompt.len() {
                let end = len + BLOCK;
                if self.cache.contains_key(&s.prompt[..end]) {
                    len = end;
                    continue;
                }
                // an earlier sequence sharing the block that has not computed it yet
                wait = self.seqs.iter().any(|(&id, o)| {
                    id < seq
                        && o.prompt.len() >= end
                        && o.prompt[..end] == s.prompt[..end]
                        && (o.next_pos as usize) < end
                });
                break;
            }
        }
        if len > start {
            let hash = self.cache[&self.seqs[&seq].prompt[..len]];
            let s = self.seqs.get_mut(&seq).expect("looked up above");
            s.hash = hash;
            s.tokens = s.prompt[..len].to_vec();
            s.next_pos = len as u32;
            self.stats.hit_tokens += (len - start) as u64;
            self.stats.attached_tokens += (len - start) as u64;
        }
        Ok(Attached {
            len,
            taken: len - start,
            wait,
        })
    }
    fn forward(&mut self, batch: &[BatchToken]) -> Result<Vec<Vec<f32>>, StepError> {
        if let Some(hold) = self.hold.take() {
            // a message or a dropped sender both mean: go
            let _ = hold.recv();
        }
        self.max_batch.fetch_max(batch.len(), Ordering::SeqCst);
        if let Some(log) = &self.batches {
            log.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(batch.to_vec());
        }
        let delay = self.step_delay + self.row_delay * batch.len() as u32;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut out = Vec::new();
        for t in batch {
            let s = self.seqs.get_mut(&t.seq).ok_or_else(|| StepError {
                unavailable: false,
                message: format!("unknown sequence {}", t.seq.0),
            })?;
            if t.pos != s.next_pos {
                return Err(StepError {
                    unavailable: false,
                    message: format!(
                        "sequence {}: expected position {}, found {}",
                        t.seq.0, s.next_pos, t.pos
                    ),
                });
            }
            s.next_pos += 1;
            s.hash = mix(s.hash, t.token, t.pos);
            s.tokens.push(t.token);
            if self.prefix && s.tokens.len() % BLOCK == 0 {
                self.cache.insert(s.tokens.clone(), s.hash);
            }
            if t.want_logits {
                out.push(Self::logits(s.hash, self.eos));
            }
        }
        Ok(out)
    }
    fn forward_drafts(
        &mut self,
        batch: &[BatchToken],
        _drafts: &[(SeqId, usize)],
    ) -> Result<Vec<Vec<f32>>, StepError> {
        // the toy cache stores a prefix by its tokens, so a draft prefix is a valid entry
        self.forward(batch)
    }
    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), StepError> {
        let s = self.seqs.get_mut(&seq).ok_or_else(|| StepError {
            unavailable: false,
            message: format!("unknown sequence {}", seq.0),
        })?;
        if len < s.tokens.len() {
            s.tokens.truncate(len);
            s.next_pos = len as u32;
            s.hash = s
                .tokens
                .iter()
                .enumerate()
                .fold(0, |h, (p, &t)| mix(h, t, p as u32));
            self.truncations.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
    fn kv_stats(&self) -> KvStats {
        KvStats {
            prefix_cache: self.prefix,
            sequences: self.seqs.len(),
            positions: self.seqs.values().map(|s| s.next_pos as usize).sum(),
            ..self.stats
        }
    }
}

/// Everything one request's event stream delivered (tests read a request to its end this way).
#[cfg(test)]
pub(crate) struct Drained {
    pub text: String,
    /// The logprob of each generated token that carried one.
    pub logprobs: Vec<f32>,
    pub finish: super::FinishReason,
    pub usage: super::Usage,
}

/// Reads `rx` until the request is done; panics if it failed.
#[cfg(test)]
pub(crate) fn drain(rx: &mut tokio::sync::mpsc::UnboundedReceiver<super::Event>) -> Drained {
    use super::Event;
    let (mut text, mut logprobs) = (String::new(), Vec::new());
    loop {
        match rx.blocking_recv().expect("an event") {
            Event::Token { text: t, logprob } => {
                text.push_str(&t);
                logprobs.extend(logprob.map(|l| l.logprob));
            }
            Event::Done {
                text: t,
                finish,
                usage,
                ..
            } => {
                text.push_str(&t);
                return Drained {
                    text,
                    logprobs,
                    finish,
                    usage,
                };
            }
            Event::Failed(e) => panic!("request failed: {}", e.message),
        }
    }
}
