//! What every architecture's attention block shares: the step context (batch tokens, their rope
//! caches, thread pool) and the causal attention of every batch token over its own sequence's
//! cache, run in parallel over tokens.

use crate::attention::{attend_heads_q8, attend_tile, tile_rows, Heads, KvView, Q8Scratch};
use crate::kv::{KvCache, KvType};
use crate::model::Model;
use crate::rope::Rope;
use nightshift_kernels::formats::{f16_to_f32, f32_to_f16};
use rayon::prelude::*;
use rayon::ThreadPool;

/// One batch token as the layers see it: which cache slot, which position.
#[derive(Clone, Copy, Debug)]
pub struct Tok {
    pub slot: usize,
    pub pos: usize,
}

/// What every layer of one `forward` step needs.
pub struct StepCtx<'a> {
    pub model: &'a Model,
    pub pool: &'a ThreadPool,
    pub toks: &'a [Tok],
    /// Rope cos/sin cache of each batch token's position.
    pub ropes: &'a [Vec<f32>],
    pub rope: &'a Rope,
}

/// Rows each sequence of the step needs: `(slot, positions up to its last batch token)`.
fn slots_needed(toks: &[Tok]) -> Vec<(usize, usize)> {
    let mut slots: Vec<(usize, usize)> = Vec::new();
    for t in toks {
        match slots.iter_mut().find(|s| s.0 == t.slot) {
            Some(s) => s.1 = s.1.max(t.pos + 1),
            None => slots.push((t.slot, t.pos + 1)),
        }
    }
    slots
}

/// Query heads per attention task: one task per (token, group of query heads sharing a kv
/// head), so each K/V row is read once per group. Groups are as large as the GQA ratio allows
/// (at most 8 heads) while leaving at least 4 tasks per thread, so decode steps with few tokens
/// still spread over the pool.
fn group_size(ctx: &StepCtx<'_>, hd: Heads) -> usize {
    let per_kv = hd.n_head / hd.n_head_kv;
    let tasks_wanted = 4 * ctx.pool.current_num_threads();
    let mut g = 1;
    while g < 8 && per_kv % (2 * g) == 0 && ctx.toks.len() * hd.n_head / (2 * g) >= tasks_wanted {
        g *= 2;
    }
    g
}

/// Causal attention of all batch tokens of layer `il`. `q`: n rows of `n_head*dk`; `out`: n rows
/// of `n_head*dv`. With `mla`, V is the first `dv` floats of each K row. An F32 cache is read in
/// place, block by block, by tiles of a sequence's consecutive tokens (a prefill chunk reads
/// each K/V row once per tile, not once per token: [`attend_tile`], same bits); an F16 cache is converted once per sequence and layer, and q and the
/// probabilities are rounded to f16 before their dot products, as ggml's f16 mul_mat does. A
/// Q8_0 cache is read in place by ggml's flash-attention arithmetic ([`attend_all_q8`]).
pub fn attend_all(
    ctx: &StepCtx<'_>,
    kv: &KvCache,
    il: usize,
    q: &[f32],
    hd: Heads,
    mla: bool,
    out: &mut [f32],
) {
    if kv.kv_type() == KvType::Q8_0 {
        attend_all_q8(ctx, kv, il, q, hd, mla, out);
        return;
    }
    let qw = hd.n_head * hd.dk;
    let (k_stride, v_stride) = if mla {
        (hd.dk, hd.dk)
    } else {
        (hd.n_head_kv * hd.dk, hd.n_head_kv * hd.dv)
    };
    let slots = slots_needed(ctx.toks);
    let f16 = kv.kv_type() == KvType::F16;
    let mut scratch: Vec<(Vec<f32>, Vec<f32>)> =
        slots.iter().map(|_| (Vec::new(), Vec::new())).collect();
    if f16 {
        for (&(slot, n), (sk, sv)) in slots.iter().zip(scratch.iter_mut()) {
            kv.gather(slot, il, n, false, sk);
            if !mla {
                kv.gather(slot, il, n, true, sv);
            }
        }
    }
    // (slot, K segments, V segments, positions per segment)
    type Segs<'s> = (usize, Vec<&'s [f32]>, Vec<&'s [f32]>, usize);
    let views: Vec<Segs<'_>> = slots
        .iter()
        .zip(&scratch)
        .map(|(&(slot, n), (sk, sv))| {
            if f16 {
                let v = if mla { &sk[..] } else { &sv[..] };
                (slot, vec![&sk[..]], vec![v], n.max(1))
            } else {
                let k = kv.segments(slot, il, n, false);
                let v = if mla {
                    k.clone()
                } else {
                    kv.segments(slot, il, n, true)
                };
                (slot, k, v, kv.layout().block)
            }
        })
        .collect();
    let views = &views;
    let g = group_size(ctx, hd);
    let groups = hd.n_head / g;
    let tiles = tiles(ctx, hd, g);
    let tiles = &tiles;
    // each task one (head group, tile): the output chunks of the tile's tokens for that group,
    // group-major, so a thread's consecutive tasks read one kv head's K/V rows (at depth 16k a
    // layer's four kv heads are 64 MiB, more than the L3; one is 16 MiB)
    let nt = tiles.len();
    let mut tasks: Vec<Vec<&mut [f32]>> = (0..nt * groups).map(|_| Vec::new()).collect();
    let mut tile_of = vec![0; ctx.toks.len()];
    for (k, r) in tiles.iter().enumerate() {
        tile_of[r.clone()].fill(k);
    }
    for (i, og) in out.chunks_mut(g * hd.dv).enumerate() {
        tasks[(i % groups) * nt + tile_of[i / groups]].push(og);
    }
    ctx.pool.install(|| {
        tasks.into_par_iter().enumerate().for_each_init(
            TileScratch::default,
            |w, (task, mut outs)| {
                let (tile, h0) = (tiles[task % nt].clone(), (task / nt) * g);
                let slot = ctx.toks[tile.start].slot;
                let Some((_, k, v, block)) = views.iter().find(|v| v.0 == slot && !v.1.is_empty())
                else {
                    return;
                };
                w.q.clear();
                w.n_kv.clear();
                for (ti, t) in tile.clone().zip(&ctx.toks[tile.clone()]) {
                    let qg = &q[ti * qw + h0 * hd.dk..ti * qw + (h0 + g) * hd.dk];
                    if f16 {
                        w.q.extend(qg.iter().map(|&x| f16_to_f32(f32_to_f16(x))));
                    } else {
                        w.q.extend_from_slice(qg);
                    }
                    w.n_kv.push(t.pos + 1);
                }
                let view = KvView {
                    k,
                    k_stride,
                    v,
                    v_stride,
                    block: *block,
                    n_kv: w.n_kv.iter().copied().max().unwrap_or(0),
                };
                w.out.resize(outs.len() * g * hd.dv, 0.0);
                attend_tile(
                    &w.q,
                    &w.n_kv,
                    h0,
                    g,
                    &view,
                    hd,
                    f16,
                    &mut w.scores,
                    &mut w.out,
                );
                for (o, r) in outs.iter_mut().zip(w.out.chunks_exact(g * hd.dv)) {
                    o.copy_from_slice(r);
                }
            },
        )
    });
}

/// What one attention task keeps between the tiles it computes.
#[derive(Default)]
struct TileScratch {
    q: Vec<f32>,
    n_kv: Vec<usize>,
    scores: Vec<f32>,
    out: Vec<f32>,
}

/// The step's tokens as tiles for [`attend_tile`]: runs of consecutive batch tokens of one
/// sequence at consecutive positions (a prefill chunk), at most `tile_rows(depth) / g` tokens
/// each (fewer the deeper the cache) and small enough to leave 4 tasks per pool thread; a
/// decode token is a tile of its own.
fn tiles(ctx: &StepCtx<'_>, hd: Heads, g: usize) -> Vec<std::ops::Range<usize>> {
    let tasks_wanted = 4 * ctx.pool.current_num_threads();
    let groups = hd.n_head / g;
    let by_tasks = (ctx.toks.len() * groups / tasks_wanted).max(1);
    let most = |t: &Tok| (tile_rows(t.pos + 1) / g).clamp(1, by_tasks);
    let mut tiles: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, t) in ctx.toks.iter().enumerate() {
        match tiles.last_mut() {
            Some(r)
                if r.len() < most(t)
                    && ctx.toks[r.end - 1].slot == t.slot
                    && ctx.toks[r.end - 1].pos + 1 == t.pos =>
            {
                r.end = i + 1
            }
            _ => tiles.push(i..i + 1),
        }
    }
    tiles
}

/// [`attend_all`] over a Q8_0 cache: every sequence's blocks read in place (strides in blocks
/// of 32), each group of query heads through `attend_heads_q8` (q quantized to Q8_0, online
/// softmax, as ggml's flash attention with `-ctk q8_0 -ctv q8_0`).
fn attend_all_q8(
    ctx: &StepCtx<'_>,
    kv: &KvCache,
    il: usize,
    q: &[f32],
    hd: Heads,
    mla: bool,
    out: &mut [f32],
) {
    let qk = nightshift_kernels::formats::QK;
    let qw = hd.n_head * hd.dk;
    let (k_stride, v_stride) = if mla {
        (hd.dk / qk, hd.dk / qk)
    } else {
        (hd.n_head_kv * hd.dk / qk, hd.n_head_kv * hd.dv / qk)
    };
    let slots = slots_needed(ctx.toks);
    let views: Vec<_> = slots
        .iter()
        .map(|&(slot, n)| {
            let k = kv.segments_q8(slot, il, n, false);
            let v = if mla {
                k.clone()
            } else {
                kv.segments_q8(slot, il, n, true)
            };
            (slot, k, v)
        })
        .collect();
    let views = &views;
    let block = kv.layout().block;
    let g = group_size(ctx, hd);
    let groups = hd.n_head / g;
    ctx.pool.install(|| {
        out.par_chunks_mut(g * hd.dv).enumerate().for_each_init(
            Q8Scratch::default,
            |scratch, (i, og)| {
                let (ti, h0) = (i / groups, (i % groups) * g);
                let t = ctx.toks[ti];
                let Some((_, k, v)) = views.iter().find(|v| v.0 == t.slot && !v.1.is_empty())
                else {
                    return;
                };
                let view = KvView {
                    k,
                    k_stride,
                    v,
                    v_stride,
                    block,
                    n_kv: t.pos + 1,
                };
                let qg = &q[ti * qw + h0 * hd.dk..ti * qw + (h0 + g) * hd.dk];
                attend_heads_q8(qg, h0, g, &view, hd, scratch, og);
            },
        )
    });
}
