//! `Engine`: runs the forward pass over batches that may mix several sequences (prefill chunks and
//! decode tokens together), each attending only to its own KV cache. Owns the caches, the KV
//! budget and the thread pool; the routed experts go through the `ExpertBackend` it was given.
//! This is what the scheduler's continuous batching drives.

use crate::arch::{self, StepCtx, Tok};
use crate::config::Arch;
use crate::error::ModelError;
use crate::expert::ExpertBackend;
use crate::hot::hot;
use crate::kv::{KvType, SeqKv};
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
    /// Most cached positions summed over all sequences (the KV budget).
    pub kv_budget_tokens: usize,
    /// Most positions of one sequence (0 = the model's training context).
    pub max_seq_len: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: 0,
            pool: None,
            max_seqs: 64,
            kv_budget_tokens: 1 << 16,
            max_seq_len: 0,
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
    seqs: Vec<Option<SeqKv>>,
    /// The id each slot of `seqs` was issued under (meaningful while the slot is live).
    ids: Vec<u32>,
    next_id: u32,
    kv_used: usize,
    kv_type: KvType,
    observer: Option<Arc<dyn RouteObserver>>,
    profile: StepProfile,
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
        Ok(Engine {
            model,
            backend,
            pool,
            opts,
            rope,
            seqs: Vec::new(),
            ids: Vec::new(),
            next_id: 0,
            kv_used: 0,
            kv_type: KvType::F32,
            observer: None,
            profile: StepProfile::default(),
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
    /// the cache). Only before the first sequence is added.
    pub fn set_kv_type(&mut self, ty: KvType) -> Result<(), ModelError> {
        if self.seqs.iter().any(|s| s.is_some()) {
            return Err(ModelError::Batch(
                "expected no live sequences when changing the kv type, found some".into(),
            ));
        }
        self.kv_type = ty;
        Ok(())
    }

    /// Starts an empty sequence.
    pub fn add_sequence(&mut self) -> Result<SeqId, ModelError> {
        let live = self.seqs.iter().filter(|s| s.is_some()).count();
        if live >= self.opts.max_seqs {
            return Err(ModelError::KvFull(format!(
                "expected at most {} live sequences, found {live}",
                self.opts.max_seqs
            )));
        }
        let kv = SeqKv::new(self.model.config().n_layer, self.kv_type);
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        match self.seqs.iter().position(|s| s.is_none()) {
            Some(i) => {
                self.seqs[i] = Some(kv);
                self.ids[i] = id;
            }
            None => {
                self.seqs.push(Some(kv));
                self.ids.push(id);
            }
        }
        Ok(SeqId(id))
    }

    /// The cache slot of a live sequence.
    fn slot_of(&self, s: SeqId) -> Option<usize> {
        self.ids
            .iter()
            .zip(&self.seqs)
            .position(|(&id, kv)| id == s.0 && kv.is_some())
    }

    /// Drops a sequence and frees its KV.
    pub fn remove_sequence(&mut self, s: SeqId) {
        if let Some(kv) = self.slot_of(s).and_then(|i| self.seqs[i].take()) {
            self.kv_used -= kv.len;
        }
    }

    /// Positions cached for `s` (None if unknown).
    pub fn seq_len(&self, s: SeqId) -> Option<usize> {
        let slot = self.slot_of(s)?;
        self.seqs[slot].as_ref().map(|k| k.len)
    }

    /// Cached positions over all sequences, and the budget.
    pub fn kv_usage(&self) -> (usize, usize) {
        (self.kv_used, self.opts.kv_budget_tokens)
    }

    /// One step over a batch that may mix sequences. Returns the logits (n_vocab f32) of every
    /// token with `want_logits`, in batch order. On error no sequence advances.
    pub fn forward(&mut self, batch: &[BatchToken]) -> Result<Vec<Vec<f32>>, ModelError> {
        let toks = self.plan(batch)?;
        let (kw, vw) = self.model.config().kv_floats_per_token();
        let mut grow: Vec<(usize, usize)> = Vec::new();
        for t in &toks {
            match grow.iter_mut().find(|g| g.0 == t.slot) {
                Some(g) => g.1 = g.1.max(t.pos + 1),
                None => grow.push((t.slot, t.pos + 1)),
            }
        }
        for &(slot, end) in &grow {
            if let Some(s) = self.seqs[slot].as_mut() {
                s.reserve_to(end, kw, vw);
            }
        }
        // The whole step runs on a pool worker: every parallel op inside (matmuls, attention,
        // experts) then forks from within the pool instead of handing work over from this
        // thread and sleeping until it is done, twice per op (hundreds of handoffs per step).
        let pool = self.pool.clone();
        let started = Instant::now();
        // A backend computing on this pool keeps it busy all step: its workers poll instead of
        // parking between ops. A remote one (or one on another pool) leaves them idle while the
        // experts run elsewhere, so only the engine's own phases run hot (see `crate::hot`).
        let res = if self.backend.computes_on(&pool) {
            pool.install(|| hot(|| self.run(batch, &toks, false)))
        } else {
            pool.install(|| self.run(batch, &toks, true))
        };
        if res.is_ok() {
            self.profile.steps += 1;
            self.profile.tokens += batch.len() as u64;
            self.profile.total += started.elapsed().as_secs_f64();
        }
        for &(slot, end) in &grow {
            if let Some(s) = self.seqs[slot].as_mut() {
                if res.is_ok() {
                    self.kv_used += end - s.len;
                    s.len = end;
                } else {
                    s.truncate(kw, vw);
                }
            }
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
            let seq = self.seqs[slot].as_ref().ok_or_else(unknown)?;
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
        if self.kv_used + batch.len() > self.opts.kv_budget_tokens {
            return Err(ModelError::KvFull(format!(
                "expected at most {} cached positions, found {} + {} new",
                self.opts.kv_budget_tokens,
                self.kv_used,
                batch.len()
            )));
        }
        Ok(toks)
    }

    /// One step; with `hot_phases` everything between two expert calls (a MoE layer's sum and
    /// shared expert, the next attention block and router; at the end the output head) runs
    /// inside one [`hot`] (the step as a whole is not: the experts run elsewhere meanwhile).
    fn run(
        &mut self,
        batch: &[BatchToken],
        toks: &[Tok],
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
        let ctx = StepCtx {
            model: &model,
            pool: &pool,
            toks,
            ropes: &ropes,
            rope: &self.rope,
        };
        let mut h = vec![0.0f32; n * e];
        let mut y = vec![0.0f32; n * e];
        // Phase times of this step, added to the profile only if the step succeeds.
        let mut prof = StepProfile::default();
        // A MoE layer whose experts ran: (routing, expert outputs, its normalised rows for the
        // shared expert, layer), summed into `x` at the start of the next phase. Everything
        // between two expert calls (the sum, the shared expert, the next attention block, its
        // router) is one phase, so with `hot_phases` the pool's workers wake once per layer.
        let mut pending: Option<(Routed, Vec<f32>, Vec<f32>, usize)> = None;
        let seqs = &mut self.seqs;
        let observer = self.observer.as_deref();
        for (il, lw) in w.layers.iter().enumerate() {
            let mut routed = None;
            phase(&mut || {
                if let Some((r, eo, hm, jl)) = pending.take() {
                    finish_moe(c, w, jl, &r, &eo, &hm, n, &mut y, &mut x, p, &mut prof)?;
                }
                let t_attn = Instant::now();
                rms_norm(&x, &lw.attn_norm, c.rms_eps, &mut h);
                match c.arch {
                    Arch::Qwen3Moe => arch::qwen3moe::attention(&ctx, seqs, il, &h, &mut y)?,
                    Arch::Deepseek2 => arch::deepseek2::attention(&ctx, seqs, il, &h, &mut y)?,
                }
                add_inplace(&mut x, &y);
                prof.attention += t_attn.elapsed().as_secs_f64();
                let t_ffn = Instant::now();
                rms_norm(&x, &lw.ffn_norm, c.rms_eps, &mut h);
                match &lw.ffn {
                    FfnWeights::Dense(d) => {
                        dense_ffn(d, &h, n, &mut y, p)?;
                        add_inplace(&mut x, &y);
                        prof.ffn_other += t_ffn.elapsed().as_secs_f64();
                    }
                    FfnWeights::Moe(m) => {
                        let r = moe_route(c, il, m, &h, n, observer, p)?;
                        prof.router += r.router.as_secs_f64();
                        prof.ffn_other += (t_ffn.elapsed() - r.router).as_secs_f64();
                        routed = Some(r);
                    }
                }
                Ok(())
            })?;
            if let Some(r) = routed {
                let mut eo = vec![0.0f32; r.pairs.len() * e];
                let t_experts = Instant::now();
                self.backend.run_experts(il, &r.acts, &r.pairs, &mut eo)?;
                prof.experts += t_experts.elapsed().as_secs_f64();
                // the normalised rows are needed again only by a shared expert
                let has_shared = matches!(&lw.ffn, FfnWeights::Moe(m) if m.shared.is_some());
                let hm = if has_shared { h.clone() } else { Vec::new() };
                pending = Some((r, eo, hm, il));
            }
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
            if let Some((r, eo, hm, jl)) = pending.take() {
                finish_moe(c, w, jl, &r, &eo, &hm, n, &mut y, &mut x, p, &mut prof)?;
            }
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

/// Sums a MoE layer's expert outputs `eo` with their routing weights, adds its shared expert
/// (run on its normalised rows `hm`) and adds the result to the residual `x` (`y` is scratch):
/// llama.cpp's order: weighted sum in top-k order, plus the shared expert, into the residual.
#[allow(clippy::too_many_arguments)]
fn finish_moe(
    c: &crate::config::ModelConfig,
    w: &crate::weights::Weights,
    il: usize,
    r: &Routed,
    eo: &[f32],
    hm: &[f32],
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
            let mut s = vec![0.0f32; n * c.n_embd];
            dense_ffn(sh, hm, n, &mut s, p)?;
            add_inplace(y, &s);
        }
    }
    add_inplace(x, y);
    prof.ffn_other += t.elapsed().as_secs_f64();
    Ok(())
}
