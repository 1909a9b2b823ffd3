//! The engine thread: admission, batch building, one `forward` per step, sampling, stop
//! handling and streaming. Only this thread touches the `StepEngine`. The token masks of
//! constrained sequences are computed on a helper thread while `forward` runs (`masks.rs`; a
//! draft row's mask as if the drafts before it were accepted, so constrained sequences
//! speculate too). With a [`Speculator`], a decoding sequence's draft tokens ride as extra rows of its
//! step; its rows are sampled in order with its one sampler until a sampled token differs from
//! the draft (that token is emitted too), and the KV cache is cut back to what was kept. The
//! tokens emitted are the ones decoding without drafts emits (see `nightshift_model::spec`).

use super::backend::{
    AdmitError, Admitted, BatchToken, KvStats, SeqId, StepEngine, StepError, TextModel,
};
use super::spec::{Ask, SeqSpec, Speculator, StepShape, Tally};
use super::text::{Pushed, TextStream};
use super::{EndTokens, Event, FinishReason, GenRequest, SchedulerOptions, TokenLogprob, Usage};
use nightshift_model::constrain::SeqConstraint;

mod masks;
use nightshift_model::sampler::{logprobs, Sampler, TokenMask};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc;

/// Counters shared with the `Scheduler` handle.
#[derive(Default, Debug)]
pub struct Stats {
    /// Submitted and not yet admitted.
    pub queued: AtomicUsize,
    /// Admitted and not yet finished.
    pub running: AtomicUsize,
    /// The KV cache as of the last step (for `/v1/admin/kv`).
    pub kv: Mutex<KvStats>,
    /// Steps, rows, drafts and where a step's time went (for `bench spec`).
    pub tally: Tally,
    /// When the engine call under way began (None between calls): `/ready` reports an engine
    /// stuck in one step.
    pub in_step: Mutex<Option<Instant>>,
}

/// One admitted sequence.
struct Seq {
    req: GenRequest,
    handle: SeqId,
    /// Prompt then generated tokens.
    tokens: Vec<u32>,
    n_prompt: usize,
    /// Tokens already in the KV cache.
    n_past: usize,
    /// Prompt tokens found in the prefix cache (at admission, or computed by another sequence
    /// while this one waited: `StepEngine::attach`).
    cached: usize,
    /// Its next prompt block is being computed by another sequence: no prefill this step.
    waits: bool,
    sampler: Sampler,
    /// The grammar the output follows, if any (taken out of the request).
    constraint: Option<SeqConstraint>,
    text: TextStream,
    generated: u32,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
    /// Speculation state; None when this sequence does not speculate.
    spec: Option<SeqSpec>,
}

/// The state of the engine thread.
pub struct Loop<E: StepEngine> {
    engine: E,
    text: Arc<dyn TextModel>,
    opts: SchedulerOptions,
    rx: mpsc::Receiver<GenRequest>,
    stats: Arc<Stats>,
    waiting: VecDeque<GenRequest>,
    running: Vec<Seq>,
    closed: bool,
    /// End-of-generation token ids (masked for `ignore_eos`).
    eog: EndTokens,
    spec: Option<Speculator>,
}

impl<E: StepEngine> Loop<E> {
    pub fn new(
        engine: E,
        text: Arc<dyn TextModel>,
        opts: SchedulerOptions,
        rx: mpsc::Receiver<GenRequest>,
        stats: Arc<Stats>,
        spec: Option<Speculator>,
    ) -> Self {
        let eog = EndTokens::of(text.as_ref());
        // Every series exists from the start (at 0), so a scrape never misses one.
        for reason in [CANCEL_QUEUED, CANCEL_RUNNING] {
            metrics::counter!("nightshift_cancelled_total", "reason" => reason).increment(0);
        }
        Loop {
            engine,
            text,
            opts,
            rx,
            stats,
            waiting: VecDeque::new(),
            running: Vec::new(),
            closed: false,
            eog,
            spec,
        }
    }

    pub fn run(mut self) {
        loop {
            self.receive();
            if self.closed && self.waiting.is_empty() && self.running.is_empty() {
                tracing::debug!("engine thread: all senders gone, stopping");
                return;
            }
            self.drop_cancelled();
            self.admit();
            self.publish_gauges();
            if !self.running.is_empty() {
                self.step();
                // After the step too: the loop may block next, and sequences may have ended.
                self.publish_gauges();
            }
        }
    }

    /// Moves submitted requests into `waiting`; blocks when there is nothing else to do.
    fn receive(&mut self) {
        if self.running.is_empty() && self.waiting.is_empty() && !self.closed {
            match self.rx.blocking_recv() {
                Some(r) => self.waiting.push_back(r),
                None => self.closed = true,
            }
        }
        loop {
            match self.rx.try_recv() {
                Ok(r) => self.waiting.push_back(r),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.closed = true;
                    break;
                }
            }
        }
    }

    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|r| !r.events.is_closed());
        let gone = before - self.waiting.len();
        if gone > 0 {
            self.stats.queued.fetch_sub(gone, Relaxed);
            metrics::counter!("nightshift_cancelled_total", "reason" => CANCEL_QUEUED)
                .increment(gone as u64);
        }
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].req.events.is_closed() {
                let s = self.running.swap_remove(i);
                cancelled(&s);
                self.finish_seq(s);
            } else {
                i += 1;
            }
        }
    }

    /// FIFO admission while there is room; the head waits while the engine cannot promise the
    /// KV blocks its prompt + max_tokens may need (after the blocks of its cached prefix).
    fn admit(&mut self) {
        while self.running.len() < self.opts.max_seqs {
            let Some(req) = self.waiting.pop_front() else {
                break;
            };
            let need = (req.prompt.len() + req.max_tokens as usize).min(self.opts.n_ctx);
            match self
                .engine
                .add_sequence(&req.prompt, need, req.cache_prompt)
            {
                Ok(Admitted { seq, cached }) => {
                    self.stats.queued.fetch_sub(1, Relaxed);
                    self.stats.running.fetch_add(1, Relaxed);
                    metrics::histogram!("nightshift_queue_wait_seconds")
                        .record(req.enqueued.elapsed().as_secs_f64());
                    let sampler = Sampler::new(req.sampling.clone(), &req.prompt);
                    let mut req = req;
                    let constraint = req.constraint.take();
                    let text = TextStream::new(req.stop.clone());
                    let n_prompt = req.prompt.len();
                    let tokens = req.prompt.clone();
                    let spec = match self.spec.as_mut() {
                        Some(sp) if req.speculative => {
                            Some(sp.begin(&req.prompt, std::mem::take(&mut req.prediction)))
                        }
                        _ => None,
                    };
                    tracing::debug!(request_id = %req.id, prompt = n_prompt, cached, "sequence admitted");
                    self.running.push(Seq {
                        req,
                        handle: seq,
                        tokens,
                        n_prompt,
                        n_past: cached,
                        cached,
                        waits: false,
                        sampler,
                        constraint,
                        text,
                        generated: 0,
                        first_token_at: None,
                        last_token_at: None,
                        spec,
                    });
                }
                Err(AdmitError::Full) if !self.running.is_empty() => {
                    self.waiting.push_front(req);
                    break;
                }
                Err(e) => {
                    self.stats.queued.fetch_sub(1, Relaxed);
                    let message = match e {
                        AdmitError::Full => format!(
                            "the kv cache cannot hold a sequence of {} positions (prompt + \
                             max_tokens) even when empty: raise --kv-memory or lower max_tokens",
                            need
                        ),
                        AdmitError::Failed(m) => m,
                    };
                    tracing::error!(request_id = %req.id, %message, "could not add a sequence");
                    let _ = req.events.send(Event::Failed(StepError {
                        unavailable: false,
                        message,
                    }));
                }
            }
        }
    }

    fn publish_gauges(&self) {
        metrics::gauge!("nightshift_queue_depth").set(self.stats.queued.load(Relaxed) as f64);
        metrics::gauge!("nightshift_running_sequences").set(self.running.len() as f64);
        let kv = self.engine.kv_stats();
        metrics::gauge!("nightshift_kv_blocks_used").set(kv.used_blocks as f64);
        metrics::gauge!("nightshift_kv_blocks_cached").set(kv.cached_blocks as f64);
        metrics::gauge!("nightshift_kv_blocks_free").set(kv.free_blocks as f64);
        metrics::gauge!("nightshift_kv_blocks_capacity").set(kv.capacity_blocks as f64);
        metrics::counter!("nightshift_prefix_cache_lookups_total").absolute(kv.lookups);
        metrics::counter!("nightshift_prefix_cache_lookup_tokens_total").absolute(kv.lookup_tokens);
        metrics::counter!("nightshift_prefix_cache_hit_tokens_total").absolute(kv.hit_tokens);
        metrics::counter!("nightshift_kv_evictions_total").absolute(kv.evictions);
        metrics::counter!("nightshift_prefix_cache_attached_tokens_total")
            .absolute(kv.attached_tokens);
        metrics::counter!("nightshift_kv_disk_loaded_blocks_total").absolute(kv.disk.loaded);
        metrics::counter!("nightshift_kv_disk_written_blocks_total").absolute(kv.disk.written);
        metrics::counter!("nightshift_kv_disk_rejected_files_total").absolute(kv.disk.rejected);
        metrics::gauge!("nightshift_kv_disk_bytes").set(kv.disk.bytes as f64);
        *self.stats.kv.lock().unwrap_or_else(|p| p.into_inner()) = kv;
    }

    /// Builds one batch: a decode token per generating sequence, then prefill chunks (FIFO,
    /// skipping sequences that wait for a shared block) within the `prefill_chunk` budget.
    /// Returns the batch and, per row of logits, the sequence index.
    /// `drafts[i]` are the draft tokens of running sequence `i`, rows right after its decode
    /// token, each with logits.
    fn build_batch(&self, drafts: &[Vec<u32>]) -> (Vec<BatchToken>, Vec<usize>, usize) {
        let mut batch = Vec::new();
        let mut owners = Vec::new();
        let mut n_decode = 0;
        for (i, s) in self.running.iter().enumerate() {
            if s.n_past >= s.n_prompt {
                let pos = s.n_past;
                let draft = drafts.get(i).map_or(&[][..], |d| &d[..]);
                let row = std::iter::once(s.tokens[pos]).chain(draft.iter().copied());
                for (j, token) in row.enumerate() {
                    batch.push(BatchToken {
                        seq: s.handle,
                        token,
                        pos: (pos + j) as u32,
                        want_logits: true,
                    });
                    owners.push(i);
                }
                n_decode += 1;
            }
        }
        let mut budget = self.opts.prefill_chunk.max(1);
        // Prefill in admission order (running is in admission order except after swap_remove;
        // ordering by enqueue time keeps FIFO).
        let mut pre: Vec<usize> = (0..self.running.len())
            .filter(|&i| {
                self.running[i].n_past < self.running[i].n_prompt && !self.running[i].waits
            })
            .collect();
        pre.sort_by_key(|&i| self.running[i].req.enqueued);
        for i in pre {
            if budget == 0 {
                break;
            }
            let s = &self.running[i];
            let take = (s.n_prompt - s.n_past).min(budget);
            for pos in s.n_past..s.n_past + take {
                let last = pos + 1 == s.n_prompt;
                batch.push(BatchToken {
                    seq: s.handle,
                    token: s.tokens[pos],
                    pos: pos as u32,
                    want_logits: last,
                });
                if last {
                    owners.push(i);
                }
            }
            budget -= take;
        }
        (batch, owners, n_decode)
    }

    /// The draft tokens of every running sequence for this step (empty = none), from the
    /// speculator's drafter and policy.
    fn plan_drafts(&mut self) -> Vec<Vec<u32>> {
        let n = self.running.len();
        let Some(sp) = self.spec.as_mut() else {
            return vec![Vec::new(); n];
        };
        let n_ctx = self.opts.n_ctx;
        let decoding = self
            .running
            .iter()
            .filter(|s| s.n_past >= s.n_prompt)
            .count();
        let pending: usize = self
            .running
            .iter()
            .map(|s| s.n_prompt.saturating_sub(s.n_past))
            .sum();
        let base = decoding + pending.min(self.opts.prefill_chunk);
        let mut asks: Vec<Ask> = Vec::new();
        for (index, s) in self.running.iter_mut().enumerate() {
            if s.n_past < s.n_prompt {
                continue;
            }
            let Some(spec) = s.spec.as_mut() else {
                continue;
            };
            // what admission promised the cache: prompt + max_tokens (within the context);
            // positions n_past..=n_past+k are written, and the step emits up to k+1 tokens
            let max_len = (s.n_prompt + s.req.max_tokens as usize).min(n_ctx);
            let left = (s.req.max_tokens.saturating_sub(s.generated) as usize).saturating_sub(1);
            let room = max_len.saturating_sub(s.n_past + 1).min(left);
            asks.push(Ask {
                index,
                spec,
                tokens: &s.tokens,
                room,
            });
        }
        let got = sp.drafts(base, &mut asks);
        let mut out = vec![Vec::new(); n];
        for (a, d) in asks.iter().zip(got) {
            out[a.index] = d;
        }
        drop(asks);
        // a constrained sequence's draft ends before the first token its grammar refuses:
        // verification could never accept past it, so those rows would be computed for nothing
        for (s, d) in self.running.iter_mut().zip(out.iter_mut()) {
            if let (Some(c), false) = (s.constraint.as_mut(), d.is_empty()) {
                let allowed = c.allowed_prefix(d);
                d.truncate(allowed);
            }
        }
        out
    }

    /// Before building a batch: every sequence still prefilling takes the prompt blocks other
    /// sequences computed since (never computing a shared block twice), and waits while its
    /// next block is being computed by another one.
    fn attach_shared(&mut self) {
        for s in self.running.iter_mut() {
            s.waits = false;
            if s.n_past >= s.n_prompt || !s.req.cache_prompt {
                continue;
            }
            match self.engine.attach(s.handle) {
                Ok(a) => {
                    if a.taken > 0 {
                        tracing::debug!(request_id = %s.req.id, taken = a.taken, at = a.len, "took prompt blocks computed by another sequence");
                    }
                    // the engine never takes the last prompt position
                    if a.len < s.n_prompt && a.len >= s.n_past {
                        s.cached += a.len - s.n_past;
                        s.n_past = a.len;
                    }
                    s.waits = a.wait;
                }
                Err(e) => {
                    tracing::warn!(request_id = %s.req.id, message = %e.message, "could not look for shared prompt blocks");
                }
            }
        }
        // a wait always ends (the sequence computing the block runs), but never let a step
        // go empty on it: with nothing else to run, the oldest waiter computes
        let idle = self
            .running
            .iter()
            .all(|s| s.n_past < s.n_prompt && s.waits);
        if idle {
            if let Some(s) = self.running.iter_mut().min_by_key(|s| s.req.enqueued) {
                s.waits = false;
            }
        }
    }

    fn step(&mut self) {
        self.attach_shared();
        let began = Instant::now();
        let drafts = self.plan_drafts();
        let drafting = began.elapsed();
        let (batch, owners, n_decode) = self.build_batch(&drafts);
        if batch.is_empty() {
            return;
        }
        let spec_rows: Vec<(SeqId, usize)> = self
            .running
            .iter()
            .zip(&drafts)
            .filter(|(_, d)| !d.is_empty())
            .map(|(s, d)| (s.handle, d.len()))
            .collect();
        let t0 = Instant::now();
        *self.stats.in_step.lock().unwrap_or_else(|p| p.into_inner()) = Some(t0);
        let (result, masks) = self.forward_with_masks(&batch, &owners, &drafts, &spec_rows);
        *self.stats.in_step.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let elapsed = t0.elapsed();
        let dt = elapsed.as_secs_f64();
        let n_drafted: usize = spec_rows.iter().map(|d| d.1).sum();
        if result.is_ok() {
            if let Some(sp) = self.spec.as_mut() {
                sp.record_step(batch.len(), dt);
            }
            self.stats.tally.step(&StepShape {
                rows: batch.len(),
                decode_rows: n_decode,
                draft_rows: n_drafted,
                forward: elapsed,
                drafting,
            });
        }
        metrics::histogram!("nightshift_step_seconds").record(dt);
        metrics::counter!("nightshift_prefill_tokens_total")
            .increment((batch.len() - n_decode - n_drafted) as u64);
        let logits = match result {
            Ok(l) if l.len() == owners.len() => l,
            Ok(l) => {
                let message = format!(
                    "engine returned {} rows of logits, expected {}",
                    l.len(),
                    owners.len()
                );
                self.fail_all(StepError {
                    unavailable: false,
                    message,
                });
                return;
            }
            Err(e) => {
                self.fail_all(e);
                return;
            }
        };
        // Advance the KV position of every sequence in the batch (a speculating one is cut
        // back to what it kept below).
        for t in &batch {
            if let Some(s) = self.running.iter_mut().find(|s| s.handle == t.seq) {
                s.n_past = s.n_past.max(t.pos as usize + 1);
            }
        }
        let mut masks = masks;
        let mut done = Vec::new();
        let mut emitted = 0usize;
        let mut r = 0;
        while r < owners.len() {
            let i = owners[r];
            let draft = &drafts[i];
            let k = if self.running[i].n_past >= self.running[i].n_prompt {
                draft.len()
            } else {
                0
            };
            // rows r..=r+k: the decode token's logits, then each draft token's
            let mut accepted = 0;
            let mut finished = false;
            for j in 0..=k {
                let (token, end) = self.sample_one(i, &logits[r + j], masks[r + j].take());
                if end {
                    finished = true;
                    break;
                }
                emitted += 1;
                // counted as they are decided, so the usage a finishing row sends is current
                let spec = self.running[i].spec.as_mut();
                if j < k && token == draft[j] {
                    accepted += 1;
                    self.stats.tally.accepted(1);
                    if let Some(ss) = spec {
                        ss.accepted += 1;
                    }
                } else {
                    if let Some(ss) = spec {
                        ss.rejected += (k - j) as u32;
                    }
                    break;
                }
            }
            r += k + 1;
            if k > 0 {
                if let (Some(sp), Some(ss)) = (self.spec.as_mut(), self.running[i].spec.as_mut()) {
                    sp.verified(ss, k, accepted);
                }
                if !finished && !self.settle(i, k, accepted) {
                    finished = true;
                }
            }
            if finished {
                done.push(i);
            }
        }
        metrics::counter!("nightshift_decode_tokens_total").increment(emitted as u64);
        if dt > 0.0 && emitted > 0 {
            metrics::gauge!("nightshift_decode_tokens_per_second").set(emitted as f64 / dt);
        }
        // before the finished sequences leave `running` (a caller that saw them leave sees
        // the whole step counted)
        self.stats.tally.step_ended(began.elapsed());
        done.sort_unstable_by(|a, b| b.cmp(a));
        for i in done {
            let s = self.running.swap_remove(i);
            self.finish_seq(s);
        }
    }

    /// After verifying sequence `i`'s `k` draft tokens of which `accepted` were kept: its cache
    /// keeps the decode token and the accepted drafts (the last emitted token is fed next
    /// step). False when the engine could not cut it back (the sequence is failed).
    fn settle(&mut self, i: usize, k: usize, accepted: usize) -> bool {
        let s = &mut self.running[i];
        let keep = s.n_past - k + accepted;
        match self.engine.truncate(s.handle, keep) {
            Ok(()) => {
                s.n_past = keep;
                true
            }
            Err(e) => {
                tracing::error!(request_id = %s.req.id, message = %e.message, "could not roll back rejected drafts");
                let _ = s.req.events.send(Event::Failed(e));
                false
            }
        }
    }

    /// Samples the next token of sequence `i`, streams it; returns it and whether the
    /// sequence is done.
    fn sample_one(
        &mut self,
        i: usize,
        logits: &[f32],
        mask: Option<Result<Vec<u32>, String>>,
    ) -> (u32, bool) {
        let mut token = u32::MAX;
        let done = self.sample_inner(i, logits, mask, &mut token);
        (token, done)
    }

    fn sample_inner(
        &mut self,
        i: usize,
        logits: &[f32],
        mask: Option<Result<Vec<u32>, String>>,
        out: &mut u32,
    ) -> bool {
        let n_ctx = self.opts.n_ctx;
        let text = self.text.clone();
        let s = &mut self.running[i];
        let mask = match mask.transpose() {
            Ok(m) => m,
            Err(message) => {
                tracing::error!(request_id = %s.req.id, %message, "constrained decoding failed");
                let _ = s.req.events.send(Event::Failed(StepError {
                    unavailable: false,
                    message,
                }));
                return true;
            }
        };
        let allowed = mask.as_deref().map(TokenMask);
        let token = if s.req.ignore_eos && !self.eog.is_empty() {
            s.sampler.sample_masked(&self.eog.masked(logits), allowed)
        } else {
            s.sampler.sample_masked(logits, allowed)
        };
        *out = token;
        // an end token ends the sequence; a completed grammar takes nothing more
        let ends = text.is_eog(token);
        if let Some(c) = s.constraint.as_mut().filter(|_| !ends) {
            if let Err(e) = c.accept(token) {
                let message = e.to_string();
                tracing::error!(request_id = %s.req.id, %message, "constrained decoding failed");
                let _ = s.req.events.send(Event::Failed(StepError {
                    unavailable: false,
                    message,
                }));
                return true;
            }
        }
        let now = Instant::now();
        match s.last_token_at {
            None => {
                s.first_token_at = Some(now);
                metrics::histogram!("nightshift_time_to_first_token_seconds")
                    .record(now.duration_since(s.req.enqueued).as_secs_f64());
            }
            Some(prev) => {
                metrics::histogram!("nightshift_inter_token_seconds")
                    .record(now.duration_since(prev).as_secs_f64());
            }
        }
        s.last_token_at = Some(now);
        let usage = |s: &Seq| Usage {
            prompt_tokens: s.n_prompt as u32,
            completion_tokens: s.generated,
            cached_tokens: s.cached as u32,
            accepted_prediction_tokens: s.spec.as_ref().map_or(0, |p| p.accepted),
            rejected_prediction_tokens: s.spec.as_ref().map_or(0, |p| p.rejected),
        };
        if text.is_eog(token) {
            let tail = s.text.finish();
            send_done(s, tail, FinishReason::Stop, usage(s));
            return true;
        }
        s.sampler.accept(token);
        s.generated += 1;
        s.tokens.push(token);
        let bytes = text.token_bytes(token);
        let logprob = s.req.logprobs.map(|top| {
            let (lp, best) = logprobs(logits, token, top as usize);
            TokenLogprob {
                bytes: bytes.clone(),
                logprob: lp,
                top: best
                    .into_iter()
                    .map(|(t, l)| (text.token_bytes(t), l))
                    .collect(),
            }
        });
        match s.text.push(&bytes) {
            Pushed::Stop(before) => {
                if s.req
                    .events
                    .send(Event::Token {
                        text: before,
                        logprob,
                    })
                    .is_ok()
                {
                    send_done(s, String::new(), FinishReason::Stop, usage(s));
                } else {
                    cancelled(s);
                }
                true
            }
            Pushed::Text(t) => {
                if s.req
                    .events
                    .send(Event::Token { text: t, logprob })
                    .is_err()
                {
                    cancelled(s);
                    return true;
                }
                let full = s.generated >= s.req.max_tokens || s.tokens.len() >= n_ctx;
                if full {
                    let tail = s.text.finish();
                    send_done(s, tail, FinishReason::Length, usage(s));
                }
                full
            }
        }
    }

    fn fail_all(&mut self, e: StepError) {
        tracing::error!(message = %e.message, unavailable = e.unavailable, "engine step failed; failing all running sequences");
        for s in std::mem::take(&mut self.running) {
            let _ = s.req.events.send(Event::Failed(StepError {
                unavailable: e.unavailable,
                message: e.message.clone(),
            }));
            self.finish_seq(s);
        }
    }

    fn finish_seq(&mut self, s: Seq) {
        self.engine.remove_sequence(s.handle);
        if let (Some(sp), Some(ss)) = (self.spec.as_mut(), s.spec.as_ref()) {
            sp.end(ss, &s.tokens);
        }
        self.stats.running.fetch_sub(1, Relaxed);
        if let (Some(first), Some(last)) = (s.first_token_at, s.last_token_at) {
            let secs = last.duration_since(first).as_secs_f64();
            if s.generated > 1 && secs > 0.0 {
                metrics::histogram!("nightshift_sequence_tokens_per_second")
                    .record((s.generated - 1) as f64 / secs);
            }
        }
        tracing::debug!(request_id = %s.req.id, prompt = s.n_prompt, generated = s.generated, "sequence finished");
    }
}

/// `nightshift_cancelled_total` reasons: the client went away while its request waited for a
/// slot, or while its sequence was generating.
const CANCEL_QUEUED: &str = "client_gone_queued";
const CANCEL_RUNNING: &str = "client_gone_running";

/// Logs and counts a running sequence whose client went away.
fn cancelled(s: &Seq) {
    tracing::info!(request_id = %s.req.id, generated = s.generated, "client went away, sequence cancelled");
    metrics::counter!("nightshift_cancelled_total", "reason" => CANCEL_RUNNING).increment(1);
}

/// Sends the final event; false if the client is gone.
fn send_done(s: &Seq, text: String, finish: FinishReason, usage: Usage) -> bool {
    // a stop string completed by the last bytes ends the text there, whatever ended the loop
    let stop = s.text.matched().map(str::to_string);
    let finish = if stop.is_some() {
        FinishReason::Stop
    } else {
        finish
    };
    s.req
        .events
        .send(Event::Done {
            text,
            finish,
            usage,
            stop,
        })
        .is_ok()
}
