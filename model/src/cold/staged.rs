//! A layer call over resident copies and cold experts coming through the staging cache
//! ([`run_cached`]): the one code path of the in-process engine (`LocalExperts` under
//! `--memory-budget`) and of an expert node with `--cold-cache`; and the cold experts of a
//! shared call, read as the claim board hands out their groups ([`ClaimedCold`]).

use std::sync::Arc;

use rayon::ThreadPool;

use super::{ColdCache, ColdCopy, ColdWindow};
use crate::error::ExpertError;
use crate::expert::{
    check_out_len, expert_ffn, run_grouped, scatter, ActRows, ExpertPair, ExpertWeights,
};
use crate::resident::ExpertCopy;

/// Computes the layer call `pairs` of MoE layer `layer` (as [`run_grouped`] would) when the
/// experts with a resident copy (`copy`) are read from it and the others (cold: `mapped` gives
/// their views into the model's files) come through `cache`.
///
/// The cold experts' reads are asked for first (distinct, in first-use order). When they are
/// all in memory already (decode steps mostly) the call is one [`run_grouped`], as if they were
/// resident; otherwise the resident experts' pairs are computed while the reads run, then the
/// cold experts' pairs chunk by chunk as their copies arrive (`ColdWindow`: at most half the
/// cache demanded at a time). Each pair's row depends only on its expert and activation row, so
/// the split does not change any bit. An expert `mapped` does not give fails the call before any
/// read is asked for.
#[allow(clippy::too_many_arguments)]
pub fn run_cached<'m, 'c>(
    cache: &ColdCache,
    layer: usize,
    mapped: &dyn Fn(u32) -> Result<ExpertWeights<'m>, ExpertError>,
    copy: &dyn Fn(u32) -> Option<&'c ExpertCopy>,
    acts: &ActRows,
    pairs: &[ExpertPair],
    n_embd: usize,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), ExpertError> {
    check_out_len(out.len(), pairs.len(), n_embd)?;
    let mut cold: Vec<u32> = Vec::new();
    for p in pairs {
        if copy(p.expert).is_none() && !cold.contains(&p.expert) {
            mapped(p.expert)?;
            cold.push(p.expert);
        }
    }
    if cold.is_empty() {
        cache.settle(layer);
        return run_grouped(
            |e| staged_weights(layer, mapped, copy, &[], e),
            acts,
            pairs,
            n_embd,
            out,
            pool,
        );
    }
    let mut window = ColdWindow::new(cache, layer, &cold);
    window.fill()?;
    cache.settle(layer);
    let early = window.ready()?;
    if early.len() == cold.len() {
        run_grouped(
            |e| staged_weights(layer, mapped, copy, &early, e),
            acts,
            pairs,
            n_embd,
            out,
            pool,
        )?;
        drop(early);
        cache.released();
        return Ok(());
    }
    let resident: Vec<u32> = (0..pairs.len() as u32)
        .filter(|&i| !cold.contains(&pairs[i as usize].expert))
        .collect();
    if !resident.is_empty() {
        run_subset(
            |e| staged_weights(layer, mapped, copy, &[], e),
            acts,
            pairs,
            &resident,
            n_embd,
            out,
            pool,
        )?;
    }
    let mut pending = (!early.is_empty()).then_some(early);
    loop {
        let chunk = match pending.take() {
            Some(c) => c,
            None => match window.next_chunk()? {
                Some(c) => c,
                None => break,
            },
        };
        let idx: Vec<u32> = (0..pairs.len() as u32)
            .filter(|&i| chunk.iter().any(|(e, _)| *e == pairs[i as usize].expert))
            .collect();
        run_subset(
            |e| staged_weights(layer, mapped, copy, &chunk, e),
            acts,
            pairs,
            &idx,
            n_embd,
            out,
            pool,
        )?;
        let bytes: u64 = chunk.iter().map(|(_, c)| c.footprint()).sum();
        drop(chunk);
        window.release(bytes)?;
    }
    Ok(())
}

/// The weights of expert `e` of `layer`: its resident copy (`copy`), else its copy among `cold`
/// (the staging cache's).
fn staged_weights<'a, 'm: 'a, 'c: 'a>(
    layer: usize,
    mapped: &dyn Fn(u32) -> Result<ExpertWeights<'m>, ExpertError>,
    copy: &dyn Fn(u32) -> Option<&'c ExpertCopy>,
    cold: &'a [(u32, Arc<ColdCopy>)],
    e: u32,
) -> Result<ExpertWeights<'a>, ExpertError> {
    let w = mapped(e)?;
    if let Some(c) = copy(e) {
        return Ok(c.weights(w)?);
    }
    match cold.iter().find(|(x, _)| *x == e) {
        Some((_, c)) => Ok(c.weights(w)?),
        None => Err(ExpertError::UnknownExpert { layer, expert: e }),
    }
}

/// [`run_grouped`] over the pairs `idx` of `pairs`, their rows written to their places in `out`.
fn run_subset<'a>(
    weights: impl Fn(u32) -> Result<ExpertWeights<'a>, ExpertError>,
    acts: &ActRows,
    pairs: &[ExpertPair],
    idx: &[u32],
    n_embd: usize,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), ExpertError> {
    let sub: Vec<ExpertPair> = idx.iter().map(|&i| pairs[i as usize]).collect();
    let mut tmp = vec![0.0f32; sub.len() * n_embd];
    run_grouped(weights, acts, &sub, n_embd, &mut tmp, pool)?;
    scatter(&tmp, idx, n_embd, out);
    Ok(())
}

/// The cold experts of a shared call ([`crate::expert::run_claimed`]): `experts` of layer
/// `layer`, each read through `cache` when a group of it is taken (demanded, waited for,
/// computed, let go), so a node reads only the cold experts it computes.
pub struct ClaimedCold<'c> {
    pub cache: &'c ColdCache,
    pub layer: usize,
    pub experts: &'c [u32],
}

impl ClaimedCold<'_> {
    /// [`expert_ffn`] of expert `e`'s rows `rows` on this thread, `w` its mapped views: from
    /// its copy in the cache when it is one of the cold experts.
    pub(crate) fn ffn(
        &self,
        e: u32,
        w: &ExpertWeights<'_>,
        acts: &ActRows,
        rows: &[u32],
        out: &mut [f32],
    ) -> Result<(), ExpertError> {
        if !self.experts.contains(&e) {
            return expert_ffn(w, acts, rows, out, None);
        }
        self.cache.demand(self.layer, e)?;
        let Some(copy) = self.cache.take(self.layer, e, true)? else {
            return Err(ExpertError::Backend(
                "cold cache: no copy after waiting".into(),
            ));
        };
        let r = expert_ffn(&copy.weights(*w)?, acts, rows, out, None);
        drop(copy);
        self.cache.released();
        r
    }
}
