//! Continuous batching. One engine thread owns the `StepEngine`; HTTP handlers submit
//! `GenRequest`s on a bounded channel (full = HTTP 429) and read `Event`s from their own
//! unbounded channel. Every step the thread builds ONE batch holding the next decode token of
//! every running sequence plus chunks of pending prefills (up to `prefill_chunk` prompt tokens), runs
//! `forward` once, samples per sequence and streams the text. Admission is FIFO and bounded by
//! `max_seqs` and the engine's KV blocks (a new sequence starts from its prompt's longest cached
//! prefix and prefills only the rest); a dropped receiver cancels the sequence and frees its KV.

mod backend;
mod engine_loop;
pub mod mock;
pub mod model_backend;
pub mod model_text;
pub mod spec;
#[cfg(test)]
mod spec_tests;
#[cfg(test)]
mod step_tests;
mod text;

#[allow(unused_imports)] // the model adapter uses them
pub use backend::{
    AdmitError, Admitted, ChatMessage, ChatPrompt, KvStats, StepEngine, StepError, TextModel,
    ToolCall,
};
pub use nightshift_model::sampler::SamplerParams as SamplingParams;

use std::time::Instant;
use tokio::sync::mpsc;

/// A model's end-of-generation tokens: what `ignore_eos` keeps a request from sampling.
#[derive(Clone, Debug, Default)]
pub struct EndTokens(Vec<u32>);

impl EndTokens {
    pub fn of(text: &dyn TextModel) -> EndTokens {
        EndTokens(
            (0..text.vocab_size() as u32)
                .filter(|&t| text.is_eog(t))
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `logits` with every end token at minus infinity (ids past its end are none of its).
    pub fn masked(&self, logits: &[f32]) -> Vec<f32> {
        let mut out = logits.to_vec();
        for &t in &self.0 {
            if let Some(x) = out.get_mut(t as usize) {
                *x = f32::NEG_INFINITY;
            }
        }
        out
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS/EOG token or a stop string.
    Stop,
    /// `max_tokens` or the context length reached.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Log-probabilities of one generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// Most likely alternatives: (bytes, logprob), best first.
    pub top: Vec<(Vec<u8>, f32)>,
}

/// What a request's channel receives.
#[derive(Debug)]
pub enum Event {
    /// One generated token: the text that became safe to send (may be empty) and its logprobs.
    Token {
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// Generation ended; `text` is the last text to send.
    Done {
        text: String,
        finish: FinishReason,
        usage: Usage,
        /// The stop string that ended it (`finish` is then `Stop`).
        stop: Option<String>,
    },
    /// Generation failed; nothing more will come.
    Failed(StepError),
}

/// Token counts of a finished request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Prompt tokens found in the prefix cache (not computed again).
    pub cached_tokens: u32,
    /// Draft tokens (speculative decoding) the model accepted and rejected.
    pub accepted_prediction_tokens: u32,
    pub rejected_prediction_tokens: u32,
}

/// One generation request, already tokenized and validated.
#[derive(Debug)]
pub struct GenRequest {
    pub id: String,
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// None: no logprobs; Some(n): the chosen token's and the n best alternatives.
    pub logprobs: Option<u32>,
    /// Extension (llama.cpp's `ignore_eos`): never sample an end-of-generation token.
    pub ignore_eos: bool,
    /// The grammar the output must follow (response_format, forced tool calls); its token
    /// mask is computed while the engine runs the step.
    pub constraint: Option<nightshift_model::constrain::SeqConstraint>,
    /// Extension (llama.cpp's `cache_prompt`): start from the prompt's cached prefix (default);
    /// false computes the whole prompt.
    pub cache_prompt: bool,
    /// false: this request never speculates (per-request `"speculative": false`).
    pub speculative: bool,
    /// OpenAI's `prediction`, tokenized: an extra source the drafter looks continuations up in.
    pub prediction: Vec<u32>,
    pub events: mpsc::UnboundedSender<Event>,
    pub enqueued: Instant,
}

/// Scheduler limits.
#[derive(Clone, Debug)]
pub struct SchedulerOptions {
    /// Requests waiting for a slot (not yet running) before HTTP 429.
    pub queue_capacity: usize,
    /// Sequences running at once.
    pub max_seqs: usize,
    /// Prompt tokens per engine step (over all prefilling sequences; decode tokens and drafts
    /// ride on top), so one long prompt is prefilled in chunks between running decodes.
    pub prefill_chunk: usize,
    /// Context length of a sequence (prompt + generated).
    pub n_ctx: usize,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            queue_capacity: 64,
            max_seqs: 8,
            prefill_chunk: 256,
            n_ctx: 4096,
        }
    }
}

/// Why a request was not accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    QueueFull,
    Stopped,
}

/// The handle HTTP handlers hold; cheap to clone.
#[derive(Clone)]
pub struct Scheduler {
    tx: mpsc::Sender<GenRequest>,
    opts: SchedulerOptions,
    stats: std::sync::Arc<engine_loop::Stats>,
}

impl Scheduler {
    /// Starts the engine thread. The thread ends when every `Scheduler` clone is dropped and
    /// the running sequences are finished.
    pub fn spawn<E: StepEngine>(
        engine: E,
        text: std::sync::Arc<dyn TextModel>,
        opts: SchedulerOptions,
    ) -> std::io::Result<Scheduler> {
        Self::spawn_speculative(engine, text, opts, None)
    }

    /// [`Scheduler::spawn`] with speculative decoding by `spec` (None: off).
    pub fn spawn_speculative<E: StepEngine>(
        engine: E,
        text: std::sync::Arc<dyn TextModel>,
        opts: SchedulerOptions,
        spec: Option<spec::Speculator>,
    ) -> std::io::Result<Scheduler> {
        let (tx, rx) = mpsc::channel(opts.queue_capacity.max(1));
        let stats = std::sync::Arc::new(engine_loop::Stats::default());
        let lp = engine_loop::Loop::new(engine, text, opts.clone(), rx, stats.clone(), spec);
        std::thread::Builder::new()
            .name("nightshift-engine".into())
            .spawn(move || lp.run())?;
        Ok(Scheduler { tx, opts, stats })
    }

    /// Queues a request without waiting. At most `queue_capacity` requests wait (in the channel
    /// or in the engine thread's FIFO) for a slot; beyond that the caller gets `QueueFull`.
    pub fn submit(&self, req: GenRequest) -> Result<(), SubmitError> {
        use std::sync::atomic::Ordering::Relaxed;
        // Count before sending, so the engine thread's decrement at admission never comes
        // first (the counter would wrap).
        let before = self.stats.queued.fetch_add(1, Relaxed);
        if before >= self.opts.queue_capacity.max(1) {
            self.stats.queued.fetch_sub(1, Relaxed);
            return Err(SubmitError::QueueFull);
        }
        match self.tx.try_send(req) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.stats.queued.fetch_sub(1, Relaxed);
                match e {
                    mpsc::error::TrySendError::Full(_) => Err(SubmitError::QueueFull),
                    mpsc::error::TrySendError::Closed(_) => Err(SubmitError::Stopped),
                }
            }
        }
    }

    pub fn options(&self) -> &SchedulerOptions {
        &self.opts
    }

    /// Whether the engine thread is alive.
    pub fn is_running(&self) -> bool {
        !self.tx.is_closed()
    }

    /// How long the engine call under way has been running (None between calls).
    pub fn step_running_for(&self) -> Option<std::time::Duration> {
        self.stats
            .in_step
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| t.elapsed())
    }

    /// The KV cache as of the engine's last step.
    pub fn kv_stats(&self) -> KvStats {
        *self.stats.kv.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The engine thread's step counts so far (steps, rows, drafts, forward and drafting time).
    pub fn step_counts(&self) -> spec::Counts {
        self.stats.tally.counts()
    }

    /// Requests queued or running right now.
    pub fn in_flight(&self) -> usize {
        use std::sync::atomic::Ordering::Relaxed;
        self.stats.queued.load(Relaxed) + self.stats.running.load(Relaxed)
    }
}
