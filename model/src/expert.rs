//! The expert seam. `ExpertBackend` is what the engine calls per MoE layer; `expert_ffn` is THE one
//! function that computes an expert (in process through `LocalExperts`, and on expert nodes), so
//! placement changes where an expert runs, never what it computes. Activations arrive quantized
//! once (`ActRows`) to the type the gate/up dot products consume, as ggml's `mul_mat_id` would.

use crate::cold::{run_cached, ClaimedCold, ColdCache};
use crate::error::ExpertError;
use crate::gguf::Gguf;
use crate::model::Model;
use crate::prefetch::Prefetcher;
use crate::resident::ExpertResidency;
use nightshift_kernels::{dequantize_row, gemm, quantize_row, GgmlType, QMatrix};
use rayon::prelude::*;
use rayon::ThreadPool;
use std::sync::Arc;

/// Activation rows shipped to experts: `n_rows` rows of `n_embd` values quantized to `ty` (the
/// vec_dot_type of the layer's gate/up expert weights, or F32 if gate and up disagree).
#[derive(Clone, Debug)]
pub struct ActRows {
    pub ty: GgmlType,
    pub n_rows: usize,
    pub data: Vec<u8>,
}

impl ActRows {
    /// Quantizes `n_rows` rows of `n_embd` floats to `ty`.
    pub fn quantize(ty: GgmlType, x: &[f32], n_embd: usize) -> Result<ActRows, ExpertError> {
        if n_embd == 0 || !x.len().is_multiple_of(n_embd) {
            return Err(ExpertError::Shape(format!(
                "expected a multiple of {n_embd} floats, found {}",
                x.len()
            )));
        }
        let rb = ty.row_bytes(n_embd)?;
        let n_rows = x.len() / n_embd;
        let mut data = vec![0u8; rb * n_rows];
        for (src, dst) in x.chunks_exact(n_embd).zip(data.chunks_exact_mut(rb)) {
            quantize_row(ty, src, dst)?;
        }
        Ok(ActRows { ty, n_rows, data })
    }

    /// The rows back as `n_rows * n_embd` floats (dequantized unless they are F32).
    pub fn to_f32(&self, n_embd: usize) -> Result<Vec<f32>, ExpertError> {
        let rb = self.ty.row_bytes(n_embd)?;
        if self.data.len() != rb * self.n_rows {
            return Err(ExpertError::Shape(format!(
                "expected {} bytes of {} activation rows, found {}",
                rb * self.n_rows,
                self.n_rows,
                self.data.len()
            )));
        }
        let mut h = vec![0.0f32; self.n_rows * n_embd];
        for (src, dst) in self.data.chunks_exact(rb).zip(h.chunks_exact_mut(n_embd)) {
            if self.ty == GgmlType::F32 {
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                    *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                }
            } else {
                dequantize_row(self.ty, src, dst)?;
            }
        }
        Ok(h)
    }
}

/// One routed (expert, activation row) pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertPair {
    pub expert: u32,
    pub row: u32,
}

/// Computes routed experts. Returns one f32 row of n_embd per pair into `out`, in `pairs` order,
/// WITHOUT routing weights (the engine applies weights and sums in top-k order).
pub trait ExpertBackend: Send + Sync {
    fn run_experts(
        &self,
        layer: usize,
        acts: &ActRows,
        pairs: &[ExpertPair],
        out: &mut [f32],
    ) -> Result<(), ExpertError>;

    /// True when `run_experts` computes in this process on `pool` (or on the calling thread)
    /// without waiting on anything else. The engine then keeps `pool`'s workers polling through
    /// whole steps ([`crate::hot::hot`]); for a backend that waits on other processes (expert
    /// nodes, maybe on the same cores) or computes on another pool, whose threads the pollers
    /// would take cores from, it does so only around its own phases.
    fn computes_on(&self, pool: &ThreadPool) -> bool {
        let _ = pool;
        false
    }

    /// Whether [`ExpertBackend::post_experts`] really starts a call early, so the engine gains
    /// by computing something else (a shared expert) before [`ExpertBackend::collect_experts`].
    /// A backend that computes in this process says no: the engine then calls `run_experts`.
    fn overlaps(&self) -> bool {
        false
    }

    /// Whether a step of several sequences should run as two micro-batches whose layer calls
    /// alternate (`crate::lanes`; asked only of a backend that [`ExpertBackend::overlaps`]).
    fn micro_batches(&self) -> bool {
        false
    }

    /// Whether every step of a backend that [`ExpertBackend::overlaps`] uses the overlap. By
    /// default the engine also runs steps without it and keeps, per step shape, the mode its
    /// measured steps say is fastest (`crate::lanes::ModePolicy`).
    fn overlap_always(&self) -> bool {
        false
    }

    /// Starts a layer call and returns without waiting for its outputs. By default nothing
    /// starts: the call's inputs are kept and it runs whole in `collect_experts`.
    fn post_experts(
        &self,
        layer: usize,
        acts: &ActRows,
        pairs: &[ExpertPair],
    ) -> Result<PostedExperts, ExpertError> {
        Ok(PostedExperts {
            layer,
            state: Box::new((acts.clone(), pairs.to_vec())),
        })
    }

    /// Waits for a posted call's outputs (as `run_experts` would write them) into `out`.
    fn collect_experts(&self, posted: PostedExperts, out: &mut [f32]) -> Result<(), ExpertError> {
        match posted.state.downcast::<(ActRows, Vec<ExpertPair>)>() {
            Ok(call) => self.run_experts(posted.layer, &call.0, &call.1, out),
            Err(_) => Err(ExpertError::Backend(
                "expected a layer call posted by this backend, found another backend's".into(),
            )),
        }
    }
}

/// A layer call started by [`ExpertBackend::post_experts`]: its layer and whatever the backend
/// keeps about the work in flight (the default keeps the inputs and runs the call at collect).
pub struct PostedExperts {
    pub layer: usize,
    pub state: Box<dyn std::any::Any + Send>,
}

/// One expert's three matrices (the expert's slices of the `*_exps` tensors): gate and up are
/// `n_ff` rows of `n_embd`, down `n_embd` rows of `n_ff` (checked by [`ExpertWeights::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertWeights<'a> {
    pub gate: QMatrix<'a>,
    pub up: QMatrix<'a>,
    pub down: QMatrix<'a>,
}

impl<'a> ExpertWeights<'a> {
    /// The three matrices of one expert; an error unless their shapes fit together.
    pub fn new(
        gate: QMatrix<'a>,
        up: QMatrix<'a>,
        down: QMatrix<'a>,
    ) -> Result<ExpertWeights<'a>, ExpertError> {
        let (e, f) = (gate.cols(), gate.rows());
        if (up.cols(), up.rows()) != (e, f) || (down.cols(), down.rows()) != (f, e) {
            return Err(ExpertError::Shape(format!(
                "expected gate/up of {f} rows of {e} and down of {e} rows of {f}, found \
                 gate {}x{}, up {}x{}, down {}x{}",
                gate.rows(),
                gate.cols(),
                up.rows(),
                up.cols(),
                down.rows(),
                down.cols()
            )));
        }
        Ok(ExpertWeights { gate, up, down })
    }

    /// The model width (gate/up row length, down rows).
    pub fn n_embd(&self) -> usize {
        self.gate.cols()
    }

    /// The expert's hidden width (gate/up rows, down row length).
    pub fn n_ff(&self) -> usize {
        self.gate.rows()
    }

    /// Bytes of the three matrices.
    pub fn bytes(&self) -> usize {
        self.gate.bytes().len() + self.up.bytes().len() + self.down.bytes().len()
    }

    /// The expert `expert` of MoE layer `layer` straight from a GGUF (for expert nodes that do
    /// not load a whole `Model`).
    pub fn from_gguf(
        g: &'a Gguf,
        layer: usize,
        expert: usize,
    ) -> Result<ExpertWeights<'a>, ExpertError> {
        let unknown = || ExpertError::UnknownExpert {
            layer,
            expert: expert as u32,
        };
        let get = |s: &str| -> Result<QMatrix<'a>, ExpertError> {
            let t = g
                .tensor(&format!("blk.{layer}.ffn_{s}_exps.weight"))
                .ok_or_else(unknown)?;
            if t.dims.len() != 3 {
                return Err(ExpertError::Shape(format!(
                    "expected 3 dims for {}, found {:?}",
                    t.name, t.dims
                )));
            }
            let ne = [t.dims[0] as usize, t.dims[1] as usize, t.dims[2] as usize];
            if expert >= ne[2] {
                return Err(unknown());
            }
            let per = t.ty.row_bytes(ne[0])? * ne[1];
            let data = g.tensor_data(t);
            if data.len() != per * ne[2] {
                return Err(ExpertError::Shape(format!(
                    "expected {} bytes in {}, found {}",
                    per * ne[2],
                    t.name,
                    data.len()
                )));
            }
            let bytes = &data[expert * per..(expert + 1) * per];
            Ok(QMatrix::new(t.ty, ne[1], ne[0], bytes)?)
        };
        ExpertWeights::new(get("gate")?, get("up")?, get("down")?)
    }

    /// The activation type `ActRows` must have for this expert's gate/up.
    pub fn act_type(&self) -> GgmlType {
        act_type_for(self.gate.ty(), self.up.ty())
    }
}

/// ActRows type for gate/up weights of these types.
pub fn act_type_for(gate: GgmlType, up: GgmlType) -> GgmlType {
    let (g, u) = (gate.vec_dot_type(), up.vec_dot_type());
    if g == u {
        g
    } else {
        GgmlType::F32
    }
}

/// Converts `n` activation rows of `from` to `to` (only needed when `from` is F32).
fn convert_rows(
    from: GgmlType,
    to: GgmlType,
    x: &[u8],
    k: usize,
    n: usize,
) -> Result<Vec<u8>, ExpertError> {
    if from != GgmlType::F32 {
        return Err(ExpertError::Shape(format!(
            "expected activations of {} or F32, found {}",
            to.name(),
            from.name()
        )));
    }
    let mut f = vec![0.0f32; k];
    let rb = to.row_bytes(k)?;
    let mut out = vec![0u8; rb * n];
    for (src, dst) in x.chunks_exact(4 * k).zip(out.chunks_exact_mut(rb)) {
        for (v, b) in f.iter_mut().zip(src.chunks_exact(4)) {
            *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        quantize_row(to, &f, dst)?;
    }
    Ok(out)
}

/// THE expert FFN: `down(silu(gate.x) * up.x)` for the activation rows `rows` of `acts`, all
/// through one gemm per matrix; `out` receives `rows.len()` rows of `n_embd` floats.
pub fn expert_ffn(
    w: &ExpertWeights<'_>,
    acts: &ActRows,
    rows: &[u32],
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), ExpertError> {
    let (e, f, n) = (w.n_embd(), w.n_ff(), rows.len());
    if out.len() != n * e {
        return Err(ExpertError::Shape(format!(
            "expected an output of {} floats, found {}",
            n * e,
            out.len()
        )));
    }
    if n == 0 {
        return Ok(());
    }
    let rb = acts.ty.row_bytes(e)?;
    if acts.data.len() != rb * acts.n_rows {
        return Err(ExpertError::Shape(format!(
            "expected {} activation bytes, found {}",
            rb * acts.n_rows,
            acts.data.len()
        )));
    }
    let mut x = Vec::with_capacity(rb * n);
    for &r in rows {
        let r = r as usize;
        if r >= acts.n_rows {
            return Err(ExpertError::Shape(format!(
                "expected a row below {}, found {r}",
                acts.n_rows
            )));
        }
        x.extend_from_slice(&acts.data[r * rb..(r + 1) * rb]);
    }
    let for_type = |ty: GgmlType| -> Result<Option<Vec<u8>>, ExpertError> {
        let want = ty.vec_dot_type();
        if want == acts.ty {
            Ok(None)
        } else {
            convert_rows(acts.ty, want, &x, e, n).map(Some)
        }
    };
    let xg = for_type(w.gate.ty())?;
    let xu = for_type(w.up.ty())?;
    let mut g = vec![0.0f32; n * f];
    let mut u = vec![0.0f32; n * f];
    gemm(w.gate, xg.as_deref().unwrap_or(&x), n, &mut g, pool)?;
    gemm(w.up, xu.as_deref().unwrap_or(&x), n, &mut u, pool)?;
    for (a, &b) in g.iter_mut().zip(&u) {
        *a = crate::ops::silu(*a) * b;
    }
    let dt = w.down.ty().vec_dot_type();
    let drb = dt.row_bytes(f)?;
    let mut h = vec![0u8; drb * n];
    for (src, dst) in g.chunks_exact(f).zip(h.chunks_exact_mut(drb)) {
        quantize_row(dt, src, dst)?;
    }
    gemm(w.down, &h, n, out, pool)?;
    Ok(())
}

/// In-process backend over the model's expert tensors (mapped or resident), and under a memory
/// budget the resident copies of [`ExpertResidency`] in front of the mapped file.
pub struct LocalExperts {
    model: Arc<Model>,
    pool: Option<Arc<ThreadPool>>,
    residency: Option<Arc<ExpertResidency>>,
    prefetch: Option<Arc<Prefetcher>>,
    cold: Option<Arc<ColdCache>>,
}

impl LocalExperts {
    /// Runs experts on `pool` (None: the calling thread).
    pub fn new(model: Arc<Model>, pool: Option<Arc<ThreadPool>>) -> LocalExperts {
        LocalExperts {
            model,
            pool,
            residency: None,
            prefetch: None,
            cold: None,
        }
    }

    /// Reads experts outside the resident set whole into `cold` (the staging cache) instead of
    /// through the mapped file (only with a residency: without one every expert is mapped).
    pub fn with_cold_cache(mut self, cold: Arc<ColdCache>) -> LocalExperts {
        self.cold = Some(cold);
        self
    }

    pub fn cold_cache(&self) -> Option<&Arc<ColdCache>> {
        self.cold.as_ref()
    }

    /// Predicts each next MoE layer's experts and reads the cold ones ahead (`prefetch`).
    pub fn with_prefetch(mut self, prefetch: Arc<Prefetcher>) -> LocalExperts {
        self.prefetch = Some(prefetch);
        self
    }

    /// Reads the experts `residency` holds from its copies, the others from the model.
    pub fn with_residency(mut self, residency: Arc<ExpertResidency>) -> LocalExperts {
        self.residency = Some(residency);
        self
    }

    pub fn residency(&self) -> Option<&Arc<ExpertResidency>> {
        self.residency.as_ref()
    }
}

/// Groups per pool thread from which [`run_grouped`] runs whole experts side by side (below it,
/// each expert's GEMMs are split over the pool).
pub const SIDE_BY_SIDE_GROUPS_PER_THREAD: usize = 4;

/// Groups pairs by expert, runs `expert_ffn` once per expert, scatters rows back in pair order.
/// Shared by every backend that computes experts from `ExpertWeights`.
///
/// With many groups (decode: a few rows each, spread over many experts) the pool runs whole
/// experts in parallel, one single-threaded `expert_ffn` per task, so a step costs one fork/join
/// per layer instead of three per expert; with few groups each gemm is split over the pool.
/// Every output row is the same dot products either way, so the bits do not depend on it.
pub fn run_grouped<'a>(
    weights: impl Fn(u32) -> Result<ExpertWeights<'a>, ExpertError>,
    acts: &ActRows,
    pairs: &[ExpertPair],
    n_embd: usize,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), ExpertError> {
    check_out_len(out.len(), pairs.len(), n_embd)?;
    let mut order: Vec<usize> = (0..pairs.len()).collect();
    order.sort_by_key(|&i| (pairs[i].expert, i));
    // (weights, the pair indices routed to that expert), resolved on this thread: `weights`
    // need not be shareable across threads
    let mut groups: Vec<(ExpertWeights<'a>, &[usize])> = Vec::new();
    let mut start = 0;
    while start < order.len() {
        let ex = pairs[order[start]].expert;
        let mut end = start;
        while end < order.len() && pairs[order[end]].expert == ex {
            end += 1;
        }
        let w = weights_of(&weights, ex, n_embd)?;
        groups.push((w, &order[start..end]));
        start = end;
    }
    let run_one = |(w, idx): &(ExpertWeights<'a>, &[usize]),
                   inner: Option<&ThreadPool>|
     -> Result<Vec<f32>, ExpertError> {
        let rows: Vec<u32> = idx.iter().map(|&i| pairs[i].row).collect();
        let mut tmp = vec![0.0f32; rows.len() * n_embd];
        expert_ffn(w, acts, &rows, &mut tmp, inner)?;
        Ok(tmp)
    };
    let results: Vec<Vec<f32>> = match pool {
        Some(p) if groups.len() >= SIDE_BY_SIDE_GROUPS_PER_THREAD * p.current_num_threads() => p
            .install(|| {
                groups
                    .par_iter()
                    .map(|g| run_one(g, None))
                    .collect::<Result<_, _>>()
            })?,
        _ => groups
            .iter()
            .map(|g| run_one(g, pool))
            .collect::<Result<_, _>>()?,
    };
    for ((_, idx), tmp) in groups.iter().zip(&results) {
        for (j, &i) in idx.iter().enumerate() {
            out[i * n_embd..(i + 1) * n_embd].copy_from_slice(&tmp[j * n_embd..(j + 1) * n_embd]);
        }
    }
    Ok(())
}

/// `out` must hold one `n_embd` row per pair.
pub(crate) fn check_out_len(out: usize, pairs: usize, n_embd: usize) -> Result<(), ExpertError> {
    if out != pairs * n_embd {
        return Err(ExpertError::Shape(format!(
            "expected an output of {} floats, found {out}",
            pairs * n_embd
        )));
    }
    Ok(())
}

/// The weights of expert `e`, which must be `n_embd` wide.
fn weights_of<'a>(
    weights: &impl Fn(u32) -> Result<ExpertWeights<'a>, ExpertError>,
    e: u32,
    n_embd: usize,
) -> Result<ExpertWeights<'a>, ExpertError> {
    let w = weights(e)?;
    if w.n_embd() != n_embd {
        return Err(ExpertError::Shape(format!(
            "expected experts of width {n_embd}, found {}",
            w.n_embd()
        )));
    }
    Ok(w)
}

/// The expert groups of `pairs` (all pairs routed to one expert), in the order their experts
/// first appear, each as (expert, indices into `pairs` ascending).
pub fn expert_groups(pairs: &[ExpertPair]) -> Vec<(u32, Vec<u32>)> {
    let mut at: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    let mut groups: Vec<(u32, Vec<u32>)> = Vec::new();
    for (i, p) in pairs.iter().enumerate() {
        let g = *at.entry(p.expert).or_insert_with(|| {
            groups.push((p.expert, Vec::new()));
            groups.len() - 1
        });
        groups[g].1.push(i as u32);
    }
    groups
}

/// Computes the expert groups of `pairs` ([`expert_groups`]) that `claim` hands out (given the
/// number of groups, it returns the next group index, or `None` when there are no more for
/// this caller), each group as one
/// GEMM, on `pool`'s threads taking groups side by side (or on this thread), into `out` (one
/// `n_embd` row per pair; rows of groups not taken are left as they were). Returns the pairs
/// computed (indices into `pairs`, group after group). Every row is what [`run_grouped`] gives
/// for that pair: a pair's row depends only on its expert and activation row. The experts of
/// `cold` (their `weights` the mapped views) are read through its staging cache as their groups
/// are taken, so a caller reads only the cold experts it computes.
#[allow(clippy::too_many_arguments)]
pub fn run_claimed<'a>(
    weights: impl Fn(u32) -> Result<ExpertWeights<'a>, ExpertError>,
    acts: &ActRows,
    pairs: &[ExpertPair],
    n_embd: usize,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
    claim: &(dyn Fn(usize) -> Option<usize> + Sync),
    cold: Option<&ClaimedCold<'_>>,
) -> Result<Vec<u32>, ExpertError> {
    check_out_len(out.len(), pairs.len(), n_embd)?;
    let groups = expert_groups(pairs);
    // Resolved on this thread (`weights` need not be shareable), before any group is taken:
    // a missing expert fails the call without taking work from other takers.
    let mut resolved = Vec::with_capacity(groups.len());
    for (e, idx) in &groups {
        let w = weights_of(&weights, *e, n_embd)?;
        resolved.push((*e, w, idx));
    }
    let rows_of =
        |idx: &[u32]| -> Vec<u32> { idx.iter().map(|&i| pairs[i as usize].row).collect() };
    let ffn = |e: u32, w: &ExpertWeights<'a>, rows: &[u32], dst: &mut [f32]| match cold {
        Some(c) => c.ffn(e, w, acts, rows, dst),
        None => expert_ffn(w, acts, rows, dst, None),
    };
    let mut done = Vec::new();
    match pool {
        Some(p) if p.current_num_threads() > 1 => {
            // Each worker computes the groups it takes into its own buffers; the rows are
            // placed here afterwards.
            let parts = p.broadcast(|_| -> Result<Vec<(usize, Vec<f32>)>, ExpertError> {
                let mut mine = Vec::new();
                while let Some(g) = claim(resolved.len()) {
                    let Some((e, w, idx)) = resolved.get(g) else {
                        break;
                    };
                    let mut tmp = vec![0.0f32; idx.len() * n_embd];
                    ffn(*e, w, &rows_of(idx), &mut tmp)?;
                    mine.push((g, tmp));
                }
                Ok(mine)
            });
            for part in parts {
                for (g, tmp) in part? {
                    let idx = resolved[g].2;
                    scatter(&tmp, idx, n_embd, out);
                    done.extend_from_slice(idx);
                }
            }
        }
        _ => {
            while let Some(g) = claim(resolved.len()) {
                let Some((e, w, idx)) = resolved.get(g) else {
                    break;
                };
                let rows = rows_of(idx);
                let (first, last) = (idx[0] as usize, idx[idx.len() - 1] as usize);
                if last + 1 - first == idx.len() {
                    // consecutive pairs (a request built group by group): straight into place
                    ffn(*e, w, &rows, &mut out[first * n_embd..(last + 1) * n_embd])?;
                } else {
                    let mut tmp = vec![0.0f32; idx.len() * n_embd];
                    ffn(*e, w, &rows, &mut tmp)?;
                    scatter(&tmp, idx, n_embd, out);
                }
                done.extend_from_slice(idx);
            }
        }
    }
    Ok(done)
}

/// Copies row `j` of `rows` to row `idx[j]` of `out`.
pub(crate) fn scatter(rows: &[f32], idx: &[u32], n_embd: usize, out: &mut [f32]) {
    for (j, &i) in idx.iter().enumerate() {
        let i = i as usize;
        out[i * n_embd..(i + 1) * n_embd].copy_from_slice(&rows[j * n_embd..(j + 1) * n_embd]);
    }
}

impl ExpertBackend for LocalExperts {
    fn run_experts(
        &self,
        layer: usize,
        acts: &ActRows,
        pairs: &[ExpertPair],
        out: &mut [f32],
    ) -> Result<(), ExpertError> {
        let n_embd = self.model.config().n_embd;
        let pool = self.pool.as_deref();
        if let Some(p) = &self.prefetch {
            let r = self.residency.as_deref();
            p.on_layer(layer, acts, pairs, &|l, e| {
                r.is_some_and(|r| r.is_resident(l, e))
            })?;
        }
        let Some(r) = &self.residency else {
            return run_grouped(
                |e| self.model.expert_weights(layer, e),
                acts,
                pairs,
                n_embd,
                out,
                pool,
            );
        };
        r.with_layer(layer, |copy| {
            if let Some(cache) = &self.cold {
                let mapped = |e: u32| self.model.expert_weights(layer, e);
                return run_cached(cache, layer, &mapped, copy, acts, pairs, n_embd, out, pool);
            }
            let weights = |e: u32| {
                let w = self.model.expert_weights(layer, e)?;
                Ok::<_, ExpertError>(match copy(e) {
                    Some(c) => c.weights(w)?,
                    None => {
                        // cold: read whole, not fault by fault (`prefetch::ColdReads`)
                        if let Some(p) = &self.prefetch {
                            p.before_compute(layer, e, acts.n_rows);
                        }
                        w
                    }
                })
            };
            run_grouped(weights, acts, pairs, n_embd, out, pool)
        })
    }

    fn computes_on(&self, pool: &ThreadPool) -> bool {
        self.pool
            .as_deref()
            .is_none_or(|own| std::ptr::eq(own, pool))
    }
}
