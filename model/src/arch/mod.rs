//! The per-architecture attention blocks (`qwen3moe`, `deepseek2`) and what they share: the step
//! context (batch tokens, their rope caches, thread pool) and the causal attention of every batch
//! token over its own sequence's cache, run in parallel over tokens.

pub mod deepseek2;
pub mod qwen3moe;

use crate::attention::{attend, Heads, KvView};
use crate::kv::SeqKv;
use crate::model::Model;
use crate::rope::Rope;
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

/// Causal attention of all batch tokens of layer `il`. `q`: n rows of `n_head*dk`; `out`: n rows
/// of `n_head*dv`. With `mla`, V is the first `dv` floats of each K row.
pub fn attend_all(
    ctx: &StepCtx<'_>,
    caches: &[Option<SeqKv>],
    il: usize,
    q: &[f32],
    hd: Heads,
    mla: bool,
    out: &mut [f32],
) {
    let qw = hd.n_head * hd.dk;
    let ow = hd.n_head * hd.dv;
    ctx.pool.install(|| {
        out.par_chunks_mut(ow)
            .zip(q.par_chunks(qw))
            .zip(ctx.toks.par_iter())
            .for_each_init(Vec::new, |scores, ((o, qt), t)| {
                let Some(seq) = caches[t.slot].as_ref() else {
                    return;
                };
                let l = &seq.layers[il];
                let view = if mla {
                    KvView {
                        k: &l.k,
                        k_stride: hd.dk,
                        v: &l.k,
                        v_stride: hd.dk,
                        n_kv: t.pos + 1,
                    }
                } else {
                    KvView {
                        k: &l.k,
                        k_stride: hd.n_head_kv * hd.dk,
                        v: &l.v,
                        v_stride: hd.n_head_kv * hd.dv,
                        n_kv: t.pos + 1,
                    }
                };
                attend(qt, &view, hd, scores, o);
            })
    });
}
