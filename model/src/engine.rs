//! `Engine`: runs the forward pass over batches that may mix several sequences (prefill chunks and
//! decode tokens together), each attending only to its own KV cache. Owns the paged KV cache
//! (`crate::kv`: block pool, prefix cache, admission by blocks) and the thread pool; the routed
//! experts go through the `ExpertBackend` it was given. This is what the scheduler's continuous
//! batching drives; `prefill` is the one way to feed a run of tokens to one sequence.

use crate::arch::{StepCtx, Tok};
use crate::error::ModelError;
use crate::expert::ExpertBackend;
use crate::hot::hot;
use crate::kv::{Attached, DiskKey, DiskTier, KvCache, KvDiskOptions, KvLayout, KvStats, KvType};
use crate::lanes::{micro_batches, step_modes, step_shape, Lane, StepMode};
use crate::model::Model;
use crate::moe::{dense_ffn, moe_combine, moe_route, RouteObserver, Routed};
use crate::ops::{add_inplace, matmul, rms_norm};
use crate::rope::Rope;
use crate::weights::FfnWeights;
use nightshift_kernels::dequantize_row;
use rayon::ThreadPool;
use std::sync::Arc;
use std::time::Instant;

/// Identifies a sequence inside one `Engine`. Ids are never reused (until 2^32 sequences have
/// come and gone), so a stale id held by a caller is an unknown sequence, never a newer one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u32);

/// One token of a batch.
#[derive(Clone, Copy, Debug)]
pub struct BatchToken {
    pub seq: SeqId,
    pub token: u32,
    /// Position in its sequence: must continue the sequence (`len`, `len + 1`, ... in batch order).
    pub pos: u32,
    pub want_logits: bool,
}

/// Engine limits and threads.
#[derive(Clone)]
pub struct EngineOptions {
    /// Threads of the pool built when `pool` is None (0 = all cores).
    pub threads: usize,
    /// A pool to share (e.g. with `LocalExperts`).
    pub pool: Option<Arc<ThreadPool>>,
    /// Most live sequences.
    pub max_seqs: usize,
    /// Positions the KV cache holds (the budget; rounded up to whole blocks).
    pub kv_budget_tokens: usize,
    /// Most positions of one sequence (0 = the model's training context).
    pub max_seq_len: usize,
    /// Reuse the cached blocks of a prompt's longest known prefix (`Engine::admit`).
    pub prefix_cache: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: 0,
            pool: None,
            max_seqs: 64,
            kv_budget_tokens: 1 << 16,
            max_seq_len: 0,
            prefix_cache: true,
        }
    }
}

/// Builds a rayon pool with `threads` threads (0 = all cores).
pub fn build_pool(threads: usize) -> Result<Arc<ThreadPool>, ModelError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("nightshift-{i}"))
        .build()
        .map(Arc::new)
        .map_err(|e| ModelError::Pool(e.to_string()))
}

/// KV cache + scratch; several sequences at once.
pub struct Engine {
    model: Arc<Model>,
    backend: Arc<dyn ExpertBackend>,
    pool: Arc<ThreadPool>,
    opts: EngineOptions,
    rope: Rope,
    kv: KvCache,
    /// The id each cache slot was issued under (meaningful while the slot is live).
    ids: Vec<u32>,
    next_id: u32,
    observer: Option<Arc<dyn RouteObserver>>,
    profile: StepProfile,
    /// The prefix cache's disk tier, if any (kept to rebuild the cache with another type).
    kv_disk: Option<KvDiskOptions>,
    /// Whether the overlaps pay, from measured step times (`lanes::ModePolicy`).
    mode_policy: crate::lanes::ModePolicy,
}

/// Wall time of the engine's steps by phase, summed since the engine started or since
/// [`Engine::reset_profile`] (seconds). A handful of clock reads per layer, always on.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepProfile {
    /// Successful `forward` calls.
    pub steps: u64,
    /// Tokens they carried.
    pub tokens: u64,
    /// Whole steps, as `forward` saw them.
    pub total: f64,
    /// Attention blocks (norm, projections, rope, cache writes, attention, output projection).
    pub attention: f64,
    /// MoE router matmuls.
    pub router: f64,
    /// Routed-expert calls to the backend (in process, or the round trips to the nodes).
    pub experts: f64,
    /// Dense FFN layers, shared experts and the MoE weighting/sum.
    pub ffn_other: f64,
    /// Final norm and output head.
    pub output: f64,
}

impl StepProfile {
    /// What is not in a named phase: embeddings, residual adds, batch planning, logits copies.
    pub fn other(&self) -> f64 {
        self.total - self.attention - self.router - self.experts - self.ffn_other - self.output
    }
}

impl Engine {
    pub fn new(
        model: Arc<Model>,
        backend: Arc<dyn ExpertBackend>,
        opts: EngineOptions,
    ) -> Result<Engine, ModelError> {
        let pool = match &opts.pool {
            Some(p) => p.clone(),
            None => build_pool(opts.threads)?,
        };
        let mut opts = opts;
        if opts.max_seq_len == 0 {
            opts.max_seq_len = model.config().n_ctx_train;
        }
        let rope = Rope::new(&model.config().rope);
        let kv = new_cache(&model, &opts, KvType::F32, None)?;
        Ok(Engine {
            model,
            backend,
            pool,
            opts,
            rope,
            kv,
            ids: Vec::new(),
            next_id: 0,
            observer: None,
            profile: StepProfile::default(),
            kv_disk: None,
            mode_policy: Default::default(),
        })
    }

    /// Installs (or removes) the observer told every MoE layer's routing decisions (ExpertAtlas).
    pub fn set_route_observer(&mut self, observer: Option<Arc<dyn RouteObserver>>) {
        self.observer = observer;
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Where the time of the steps so far went (see [`StepProfile`]).
    pub fn profile(&self) -> StepProfile {
        self.profile
    }

    /// Starts the [`StepProfile`] over.
    pub fn reset_profile(&mut self) {
        self.profile = StepProfile::default();
    }

    /// The engine's thread pool.
    pub fn pool(&self) -> &Arc<ThreadPool> {
        &self.pool
    }

    /// Chooses the KV cache element type (default F32, the llama.cpp parity reference; F16 halves
    /// the cache, Q8_0 takes 34/128 of it). Only before the first sequence is added; the cached
    /// prefixes are dropped. `KvType` error when the model's heads do not fit the type.
    pub fn set_kv_type(&mut self, ty: KvType) -> Result<(), ModelError> {
        if self.kv.live() > 0 {
            return Err(ModelError::Batch(
                "expected no live sequences when changing the kv type, found some".into(),
            ));
        }
        let c = self.model.config();
        ty.check(&KvLayout::for_model(c), c.head_k, c.head_v)?;
        self.kv = new_cache(&self.model, &self.opts, ty, self.kv_disk.as_ref())?;
        Ok(())
    }

    /// Gives the prefix cache a disk tier in `o.dir` (see `kv::disk`): full blocks are also
    /// written there and read back on a hit, across restarts. Only before the first sequence
    /// is added; the prefixes cached in memory are dropped.
    pub fn set_kv_disk(&mut self, o: Option<KvDiskOptions>) -> Result<(), ModelError> {
        if self.kv.live() > 0 {
            return Err(ModelError::Batch(
                "expected no live sequences when changing the kv disk tier, found some".into(),
            ));
        }
        let kv = new_cache(&self.model, &self.opts, self.kv.kv_type(), o.as_ref())?;
        self.kv = kv;
        self.kv_disk = o;
        Ok(())
    }

    /// The KV cache's element type.
    pub fn kv_type(&self) -> KvType {
        self.kv.kv_type()
    }

    /// The block geometry of this model's KV cache.
    pub fn kv_layout(&self) -> KvLayout {
        self.kv.layout()
    }

    fn check_room(&self) -> Result<(), ModelError> {
        let live = self.kv.live();
        if live >= self.opts.max_seqs {
            return Err(ModelError::KvFull(format!(
                "expected at most {} live sequences, found {live}",
                self.opts.max_seqs
            )));
        }
        Ok(())
    }

    /// Names the sequence in cache slot `slot` with a fresh id.
    fn issue(&mut self, slot: usize) -> SeqId {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        if self.ids.len() <= slot {
            self.ids.resize(slot + 1, 0);
        }
        self.ids[slot] = id;
        SeqId(id)
    }

    /// Starts an empty sequence; its blocks are taken step by step while the pool has some
    /// nobody was promised (see [`Engine::admit`] for a sequence that cannot run out).
    pub fn add_sequence(&mut self) -> Result<SeqId, ModelError> {
        self.check_room()?;
        let slot = self.kv.add();
        Ok(self.issue(slot))
    }

    /// Starts a sequence for `prompt` that may grow to `max_len` positions: it begins with the
    /// longest cached prefix of the prompt (never its last token, whose logits must be computed),
    /// and every further block it may need is reserved, so its steps never run out of cache.
    /// Returns the sequence and the cached positions: feed it `prompt[cached..]`. Without `reuse`
    /// nothing is looked up (the prompt is computed whole; its blocks are still cached for
    /// later requests). `KvFull` when the cache cannot promise the blocks now (nothing changes).
    pub fn admit(
        &mut self,
        prompt: &[u32],
        max_len: usize,
        reuse: bool,
    ) -> Result<(SeqId, usize), ModelError> {
        self.check_room()?;
        let max_len = max_len.min(self.opts.max_seq_len);
        if prompt.len() > max_len {
            return Err(ModelError::KvFull(format!(
                "expected a prompt of at most {max_len} positions, found {}",
                prompt.len()
            )));
        }
        let (slot, cached) = self.kv.admit(prompt, max_len, reuse)?;
        Ok((self.issue(slot), cached))
    }

    /// Before feeding `s` the next chunk of its prompt: it takes the blocks of its prompt that
    /// other sequences computed since it was admitted, and learns whether its next block is
    /// still being computed by another sequence (then it should wait, computing nothing). See
    /// `kv::share`. Feed it `prompt[len..]` afterwards.
    pub fn attach(&mut self, s: SeqId) -> Result<Attached, ModelError> {
        let slot = self
            .slot_of(s)
            .ok_or_else(|| ModelError::Batch(format!("unknown sequence {}", s.0)))?;
        Ok(self.kv.attach(slot))
    }

    /// A new sequence continuing from everything `s` holds, sharing its blocks (the partly
    /// filled last block is copied by whichever writes into it first).
    pub fn fork_sequence(&mut self, s: SeqId) -> Result<SeqId, ModelError> {
        self.check_room()?;
        let from = self
            .slot_of(s)
            .ok_or_else(|| ModelError::Batch(format!("unknown sequence {}", s.0)))?;
        let slot = self
            .kv
            .fork(from)
            .ok_or_else(|| ModelError::Batch(format!("unknown sequence {}", s.0)))?;
        Ok(self.issue(slot))
    }

    /// The cache slot of a live sequence.
    fn slot_of(&self, s: SeqId) -> Option<usize> {
        self.ids
            .iter()
            .enumerate()
            .position(|(slot, &id)| id == s.0 && self.kv.seq(slot).is_some())
    }

    /// Drops a sequence; its blocks go back to the pool (full ones stay cached for their
    /// prefix).
    pub fn remove_sequence(&mut self, s: SeqId) {
        if let Some(slot) = self.slot_of(s) {
            self.kv.remove(slot);
        }
    }

    /// Positions cached for `s` (None if unknown).
    pub fn seq_len(&self, s: SeqId) -> Option<usize> {
        let slot = self.slot_of(s)?;
        self.kv.seq(slot).map(|k| k.len)
    }

    /// Positions held by the live sequences, and the positions the cache can hold.
    pub fn kv_usage(&self) -> (usize, usize) {
        let l = self.kv.layout();
        (self.kv.positions(), self.kv.pool().capacity() * l.block)
    }

    /// The pool: blocks used, cached and free, prefix-cache hits, evictions.
    pub fn kv_stats(&self) -> KvStats {
        self.kv.stats()
    }

    /// Feeds `tokens` to `s` from its current length in one step and returns the logits of the
    /// last one (a decode step is a prefill of one token).
    pub fn prefill(&mut self, s: SeqId, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let mut rows = self.run_tokens(s, tokens, false)?;
        rows.pop()
            .ok_or_else(|| ModelError::Batch("expected at least one token, found none".into()))
    }

    /// [`Engine::prefill`] returning the logits of every token.
    pub fn prefill_all(&mut self, s: SeqId, tokens: &[u32]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.run_tokens(s, tokens, true)
    }

    fn run_tokens(
        &mut self,
        s: SeqId,
        tokens: &[u32],
        all: bool,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let start = self
            .seq_len(s)
            .ok_or_else(|| ModelError::Batch(format!("unknown sequence {}", s.0)))?;
        let n = tokens.len();
        let batch: Vec<BatchToken> = tokens
            .iter()
            .enumerate()
            .map(|(i, &token)| BatchToken {
                seq: s,
                token,
                pos: (start + i) as u32,
                want_logits: all || i + 1 == n,
            })
            .collect();
        self.forward(&batch)
    }

    /// Cuts `s` back to its first `len` positions (the draft tokens a verification step
    /// rejected): blocks wholly past `len` go back to the pool, the positions kept are settled
    /// and may enter the prefix index. `len` at or past the current length only settles.
    pub fn truncate(&mut self, s: SeqId, len: usize) -> Result<(), ModelError> {
        let slot = self
            .slot_of(s)
            .ok_or_else(|| ModelError::Batch(format!("unknown sequence {}", s.0)))?;
        self.kv.truncate(slot, len);
        Ok(())
    }

    /// One step over a batch that may mix sequences. Returns the logits (n_vocab f32) of every
    /// token with `want_logits`, in batch order. On error no sequence advances.
    pub fn forward(&mut self, batch: &[BatchToken]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.forward_drafts(batch, &[])
    }

    /// [`Engine::forward`] for a verification step: the last `n` tokens of each `(seq, n)` in
    /// `drafts` are draft tokens; their rows are written like any other, but the blocks holding
    /// them stay out of the prefix index until [`Engine::truncate`] keeps or drops them.
    pub fn forward_drafts(
        &mut self,
        batch: &[BatchToken],
        drafts: &[(SeqId, usize)],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let toks = self.plan(batch)?;
        let mut grow: Vec<(usize, usize)> = Vec::new();
        for t in &toks {
            match grow.iter_mut().find(|g| g.0 == t.slot) {
                Some(g) => g.1 = g.1.max(t.pos + 1),
                None => grow.push((t.slot, t.pos + 1)),
            }
        }
        let prepared = self.kv.prepare(&grow)?;
        // The whole step runs on a pool worker: every parallel op inside (matmuls, attention,
        // experts) then forks from within the pool instead of handing work over from this
        // thread and sleeping until it is done, twice per op (hundreds of handoffs per step).
        let pool = self.pool.clone();
        // Experts elsewhere: the way this step overlaps its calls, of those that change
        // something for it, the one measured steps of its shape say is fastest (`ModePolicy`).
        let has_shared = self.model.config().n_expert_shared > 0;
        let shape = step_shape(&toks);
        let modes = step_modes(&*self.backend, has_shared, shape.1);
        let mode = self.mode_policy.choose(shape, &modes);
        let started = Instant::now();
        // A backend computing on this pool keeps it busy all step: its workers poll instead of
        // parking between ops. A remote one (or one on another pool) leaves them idle while the
        // experts run elsewhere, so only the engine's own phases run hot (see `crate::hot`).
        let res = if self.backend.computes_on(&pool) {
            pool.install(|| hot(|| self.run(batch, &toks, mode, false)))
        } else {
            pool.install(|| self.run(batch, &toks, mode, true))
        };
        if res.is_ok() {
            let secs = started.elapsed().as_secs_f64();
            if modes.len() > 1 {
                self.mode_policy.record(shape, mode, secs);
            }
            self.profile.steps += 1;
            self.profile.tokens += batch.len() as u64;
            self.profile.total += secs;
            let committed: Vec<(usize, u32)> = toks
                .iter()
                .zip(batch)
                .map(|(t, b)| (t.slot, b.token))
                .collect();
            let unverified: Vec<(usize, usize)> = drafts
                .iter()
                .filter_map(|&(seq, n)| self.slot_of(seq).map(|slot| (slot, n)))
                .collect();
            self.kv.commit_drafts(prepared, &committed, &unverified);
        } else {
            self.kv.rollback(prepared);
        }
        res
    }

    /// Checks the batch and maps it to cache slots and positions.
    fn plan(&self, batch: &[BatchToken]) -> Result<Vec<Tok>, ModelError> {
        let c = self.model.config();
        let mut next: Vec<(usize, usize)> = Vec::new();
        let mut toks = Vec::with_capacity(batch.len());
        for (i, b) in batch.iter().enumerate() {
            let unknown = || ModelError::Batch(format!("token {i}: unknown sequence {}", b.seq.0));
            let slot = self.slot_of(b.seq).ok_or_else(unknown)?;
            let seq = self.kv.seq(slot).ok_or_else(unknown)?;
            if b.token as usize >= c.n_vocab {
                return Err(ModelError::Batch(format!(
                    "token {i}: expected an id below {}, found {}",
                    c.n_vocab, b.token
                )));
            }
            let want = match next.iter_mut().find(|n| n.0 == slot) {
                Some(n) => {
                    n.1 += 1;
                    n.1 - 1
                }
                None => {
                    next.push((slot, seq.len + 1));
                    seq.len
                }
            };
            if b.pos as usize != want {
                return Err(ModelError::Batch(format!(
                    "token {i}: expected position {want} for sequence {}, found {}",
                    b.seq.0, b.pos
                )));
            }
            if want >= self.opts.max_seq_len {
                return Err(ModelError::KvFull(format!(
                    "sequence {} would exceed {} positions",
                    b.seq.0, self.opts.max_seq_len
                )));
            }
            toks.push(Tok { slot, pos: want });
        }
        Ok(toks)
    }

    /// One step in `mode`; with `hot_phases` everything between two expert calls (a MoE layer's sum and
    /// shared expert, the next attention block and router; at the end the output head) runs
    /// inside one [`hot`] (the step as a whole is not: the experts run elsewhere meanwhile).
    fn run(
        &mut self,
        batch: &[BatchToken],
        toks: &[Tok],
        mode: StepMode,
        hot_phases: bool,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let phase = |f: &mut (dyn FnMut() -> Result<(), ModelError> + Send)| {
            if hot_phases {
                hot(f)
            } else {
                f()
            }
        };
        let model = self.model.clone();
        let c = model.config();
        let w = model.weights();
        let n = batch.len();
        let e = c.n_embd;
        if n == 0 {
            return Ok(Vec::new());
        }
        let pool = self.pool.clone();
        let p = Some(&*pool);
        let mut x = vec![0.0f32; n * e];
        let rb = w.token_embd.row_bytes();
        for (b, row) in batch.iter().zip(x.chunks_exact_mut(e)) {
            let t = b.token as usize;
            dequantize_row(
                w.token_embd.ty,
                &w.token_embd.data()[t * rb..(t + 1) * rb],
                row,
            )?;
        }
        let ropes: Vec<Vec<f32>> = toks.iter().map(|t| self.rope.cache(t.pos as u32)).collect();
        // Phase times of this step, added to the profile only if the step succeeds.
        let mut prof = StepProfile::default();
        let observer = self.observer.as_deref();
        // Experts elsewhere: each layer's call is posted and the engine computes meanwhile (the
        // shared expert; with two micro-batches, the other half's layer too).
        let overlap = mode != StepMode::Plain;
        let halves = (mode == StepMode::Split)
            .then(|| micro_batches(toks))
            .flatten();
        let mut lanes: Vec<Lane> = match halves {
            Some(halves) => halves
                .into_iter()
                .map(|rows| Lane::gather(rows, &x, toks, &ropes, e))
                .collect(),
            None => vec![Lane::whole(std::mem::take(&mut x), toks, ropes)],
        };
        let two = lanes.len() > 1;
        let kv = &mut self.kv;
        for (il, lw) in w.layers.iter().enumerate() {
            for lane in lanes.iter_mut() {
                lane.land(&*self.backend, e, &mut prof)?;
                let Lane {
                    toks: ltoks,
                    ropes: lropes,
                    x,
                    h,
                    y,
                    pending,
                    inflight,
                    ..
                } = lane;
                let ln = ltoks.len();
                let ctx = StepCtx {
                    model: &model,
                    pool: &pool,
                    toks: ltoks,
                    ropes: lropes,
                    rope: &self.rope,
                };
                let mut routed = None;
                // Everything between two expert calls (the sum, the shared expert, the next
                // attention block, its router) is one phase, so with `hot_phases` the pool's
                // workers wake once per layer.
                phase(&mut || {
                    if let Some((r, eo, hm, jl)) = pending.take() {
                        finish_moe(c, w, jl, &r, &eo, &hm, ln, y, x, p, &mut prof)?;
                    }
                    let t_attn = Instant::now();
                    rms_norm(x, &lw.attn_norm, c.rms_eps, h);
                    c.arch.spec().attention(&ctx, kv, il, h, y)?;
                    add_inplace(x, y);
                    prof.attention += t_attn.elapsed().as_secs_f64();
                    let t_ffn = Instant::now();
                    rms_norm(x, &lw.ffn_norm, c.rms_eps, h);
                    match &lw.ffn {
                        FfnWeights::Dense(d) => {
                            dense_ffn(d, h, ln, y, p)?;
                            add_inplace(x, y);
                            prof.ffn_other += t_ffn.elapsed().as_secs_f64();
                        }
                        FfnWeights::Moe(m) => {
                            let r = moe_route(c, il, m, h, ln, observer, p)?;
                            prof.router += r.router.as_secs_f64();
                            prof.ffn_other += (t_ffn.elapsed() - r.router).as_secs_f64();
                            routed = Some(r);
                        }
                    }
                    Ok(())
                })?;
                let Some(r) = routed else { continue };
                let shared = match &lw.ffn {
                    FfnWeights::Moe(m) => m.shared.as_ref(),
                    FfnWeights::Dense(_) => None,
                };
                let t_experts = Instant::now();
                if overlap && (two || shared.is_some()) {
                    let posted = self.backend.post_experts(il, &r.acts, &r.pairs)?;
                    prof.experts += t_experts.elapsed().as_secs_f64();
                    let sh_rows = match shared {
                        Some(sh) => {
                            let t_shared = Instant::now();
                            let mut s = vec![0.0f32; ln * e];
                            phase(&mut || dense_ffn(sh, h, ln, &mut s, p))?;
                            prof.ffn_other += t_shared.elapsed().as_secs_f64();
                            SharedRows::Done(s)
                        }
                        None => SharedRows::Input(Vec::new()),
                    };
                    *inflight = Some((r, posted, sh_rows, il));
                } else {
                    let mut eo = vec![0.0f32; r.pairs.len() * e];
                    self.backend.run_experts(il, &r.acts, &r.pairs, &mut eo)?;
                    prof.experts += t_experts.elapsed().as_secs_f64();
                    // the normalised rows are needed again only by a shared expert
                    let sh_rows = match shared {
                        Some(_) => SharedRows::Input(h.clone()),
                        None => SharedRows::Input(Vec::new()),
                    };
                    *pending = Some((r, eo, sh_rows, il));
                }
            }
        }
        for lane in lanes.iter_mut() {
            lane.land(&*self.backend, e, &mut prof)?;
        }
        let rows: Vec<usize> = batch
            .iter()
            .enumerate()
            .filter(|(_, b)| b.want_logits)
            .map(|(i, _)| i)
            .collect();
        let nv = c.n_vocab;
        let mut logits = vec![0.0f32; rows.len() * nv];
        let mut t_out = Instant::now();
        // The last MoE layer's sum and the output head: one phase.
        phase(&mut || {
            for lane in lanes.iter_mut() {
                let ln = lane.toks.len();
                if let Some((r, eo, hm, jl)) = lane.pending.take() {
                    finish_moe(
                        c,
                        w,
                        jl,
                        &r,
                        &eo,
                        &hm,
                        ln,
                        &mut lane.y,
                        &mut lane.x,
                        p,
                        &mut prof,
                    )?;
                }
            }
            let x = Lane::scatter(&mut lanes, n, e);
            t_out = Instant::now();
            if rows.is_empty() {
                return Ok(());
            }
            let mut sel = Vec::with_capacity(rows.len() * e);
            for &r in &rows {
                sel.extend_from_slice(&x[r * e..(r + 1) * e]);
            }
            let mut hn = vec![0.0f32; sel.len()];
            rms_norm(&sel, &w.output_norm, c.rms_eps, &mut hn);
            matmul(&w.output, 0, &hn, rows.len(), &mut logits, p)
        })?;
        let out = logits.chunks_exact(nv).map(|r| r.to_vec()).collect();
        prof.output = t_out.elapsed().as_secs_f64();
        self.add_phases(&prof);
        Ok(out)
    }

    /// Adds one successful step's phase times (`forward` adds the step count and total).
    fn add_phases(&mut self, s: &StepProfile) {
        let p = &mut self.profile;
        p.attention += s.attention;
        p.router += s.router;
        p.experts += s.experts;
        p.ffn_other += s.ffn_other;
        p.output += s.output;
    }
}

/// The cache an engine with `opts` starts with: the budget in whole blocks (at least one), and
/// the disk tier `disk` (with the prefix cache on).
fn new_cache(
    model: &Model,
    opts: &EngineOptions,
    ty: KvType,
    disk: Option<&KvDiskOptions>,
) -> Result<KvCache, ModelError> {
    let layout = KvLayout::for_model(model.config());
    let blocks = layout.blocks_for(opts.kv_budget_tokens).max(1);
    let mut kv = KvCache::new(
        layout,
        ty,
        blocks,
        model.gguf().fingerprint(),
        opts.prefix_cache,
    );
    if let Some(o) = disk.filter(|_| opts.prefix_cache) {
        let key = DiskKey {
            model: model.gguf().weights_fingerprint(),
            ty,
            layout,
        };
        let tier = DiskTier::open(o, key).map_err(|e| ModelError::KvDisk {
            dir: o.dir.clone(),
            source: e,
        })?;
        kv.set_disk(tier)?;
    }
    Ok(kv)
}

/// A MoE layer's shared expert: its input rows (run at the sum), or its output, computed while
/// the routed experts were out (`ExpertBackend::overlaps`). Either way the same bits.
pub(crate) enum SharedRows {
    Input(Vec<f32>),
    Done(Vec<f32>),
}

/// Sums a MoE layer's expert outputs `eo` with their routing weights, adds its shared expert
/// (run on its normalised rows, or already computed: `hm`) and adds the result to the residual
/// `x` (`y` is scratch): llama.cpp's order: weighted sum in top-k order, plus the shared expert,
/// into the residual.
#[allow(clippy::too_many_arguments)]
fn finish_moe(
    c: &crate::config::ModelConfig,
    w: &crate::weights::Weights,
    il: usize,
    r: &Routed,
    eo: &[f32],
    hm: &SharedRows,
    n: usize,
    y: &mut [f32],
    x: &mut [f32],
    p: Option<&rayon::ThreadPool>,
    prof: &mut StepProfile,
) -> Result<(), ModelError> {
    let t = Instant::now();
    moe_combine(c, r, eo, n, y);
    if let FfnWeights::Moe(m) = &w.layers[il].ffn {
        if let Some(sh) = &m.shared {
            match hm {
                SharedRows::Done(s) => add_inplace(y, s),
                SharedRows::Input(h) => {
                    let mut s = vec![0.0f32; n * c.n_embd];
                    dense_ffn(sh, h, n, &mut s, p)?;
                    add_inplace(y, &s);
                }
            }
        }
    }
    add_inplace(x, y);
    prof.ffn_other += t.elapsed().as_secs_f64();
    Ok(())
}
