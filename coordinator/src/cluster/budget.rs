//! `--memory-budget` for experts computed in process: which routed experts are kept resident
//! (copied to huge pages by `nightshift_model::resident::ExpertResidency`) and which are read
//! from the mapped file through the page cache. The set comes from a placement file
//! (`nightshift-atlas plan --memory-budget`: the resident experts of its node, the hottest by
//! expected bytes read per token) or, without one, is a seeded random draw filling the budget
//! evenly over the MoE layers (the baseline a plan is measured against). `POST
//! /v1/admin/placement` (`nightshift-atlas apply`) replaces it live through [`resident_keys`].

use std::path::Path;
use std::sync::Arc;

use nightshift_atlas_core::placement::{ModelShape, Placement};
use nightshift_atlas_core::size::{parse_size, parse_size_or_auto};
use nightshift_kernels::rng::SplitMix64;
use nightshift_model::cold::ColdCache;
use nightshift_model::resident::{ExpertResidency, ResidencyError};
use nightshift_model::Model;
use rayon::ThreadPool;

use super::{model_shape, ClusterError};

/// Errors of setting up the resident set.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error("--memory-budget: {0}")]
    Size(#[from] nightshift_atlas_core::size::SizeError),
    #[error("--cold-cache: {0}")]
    ColdSize(nightshift_atlas_core::size::SizeError),
    #[error("--resident-set {path}: {source}")]
    Placement {
        path: String,
        source: nightshift_atlas_core::placement::PlacementError,
    },
    #[error("resident set: {0}")]
    Resolve(nightshift_atlas_core::placement::PlacementError),
    #[error("a resident-set placement must name one node (the in-process engine), found {found}")]
    Nodes { found: usize },
    #[error("{0}")]
    Residency(#[from] ResidencyError),
    #[error("cannot start the prefetch thread: {0}")]
    Thread(std::io::Error),
    #[error("--cold-io-depth: {0}")]
    IoDepth(std::io::Error),
}

/// Seed of the default (random) resident set.
const RANDOM_SET_SEED: u64 = 0x5eed;

/// The experts `placement`'s single node keeps resident, as (layer, expert).
pub fn resident_keys(placement: &Placement) -> Result<Vec<(u32, u32)>, BudgetError> {
    if placement.nodes.len() != 1 {
        return Err(BudgetError::Nodes {
            found: placement.nodes.len(),
        });
    }
    let slots = placement
        .experts_on(&placement.nodes[0].name)
        .map_err(BudgetError::Resolve)?;
    Ok(slots
        .iter()
        .filter(|s| s.resident)
        .map(|s| (s.layer as u32, s.expert as u32))
        .collect())
}

/// A seeded random set of whole experts taking at most `budget` bytes (each counted as
/// `per_expert`), split as evenly as possible over the MoE layers.
pub fn random_set(shape: &ModelShape, budget: u64, per_expert: u64, seed: u64) -> Vec<(u32, u32)> {
    let layers = shape.moe_layers.len();
    if layers == 0 || per_expert == 0 {
        return Vec::new();
    }
    let total = ((budget / per_expert) as usize).min(layers * shape.n_experts);
    let mut rng = SplitMix64::new(seed);
    let mut keys = Vec::with_capacity(total);
    for (i, &layer) in shape.moe_layers.iter().enumerate() {
        let n = total / layers + usize::from(i < total % layers);
        let mut ids: Vec<u32> = (0..shape.n_experts as u32).collect();
        // partial Fisher-Yates: the first n are a uniform draw
        for j in 0..n {
            let k = j + rng.below((ids.len() - j) as u64) as usize;
            ids.swap(j, k);
        }
        keys.extend(ids[..n].iter().map(|&e| (layer as u32, e)));
    }
    keys
}

/// The staging cache `--cold-cache` asks for (`auto`: [`ColdCache::default_capacity`] beside
/// `residency`'s loan, [`ExpertResidency::spare`]; `0`: none, cold experts through the page
/// cache), its I/O thread started, and `residency` lending it the budget its set leaves.
pub fn build_cold_cache(
    model: &Arc<Model>,
    size: &str,
    io_depth: usize,
    residency: &ExpertResidency,
) -> Result<Option<Arc<ColdCache>>, ClusterError> {
    let shape = model_shape(model)?;
    let all = shape.expert_bytes * (shape.moe_layers.len() * shape.n_experts) as u64;
    let capacity = parse_size_or_auto(size, all).map_err(BudgetError::ColdSize)?;
    nightshift_model::cold::check_io_depth(io_depth).map_err(BudgetError::IoDepth)?;
    let Some(cache) = ColdCache::start(model.clone(), capacity, io_depth, residency.spare())
        .map_err(BudgetError::Thread)?
    else {
        return Ok(None);
    };
    let cache = Arc::new(cache);
    // the budget the resident set leaves (a plan's `--resident-share`) is the cache's
    residency.lend_spare_to(cache.clone());
    tracing::info!(
        cold_cache_mib = cache.capacity() >> 20,
        lent_mib = cache.lent() >> 20,
        io_depth = cache.io_depth(),
        "cold experts are read whole into a staging cache"
    );
    Ok(Some(cache))
}

/// The residency `--memory-budget` (and `--resident-set`) ask for, filled.
pub fn build_residency(
    model: &Model,
    budget: &str,
    resident_set: Option<&Path>,
    pool: Option<&ThreadPool>,
) -> Result<Arc<ExpertResidency>, ClusterError> {
    let shape = model_shape(model)?;
    let all = shape.expert_bytes * (shape.moe_layers.len() * shape.n_experts) as u64;
    let bytes = parse_size(budget, all).map_err(BudgetError::from)?;
    let keys = match resident_set {
        Some(p) => {
            let err = |source| BudgetError::Placement {
                path: p.display().to_string(),
                source,
            };
            let placement = Placement::load(p)
                .map_err(err)?
                .resolve(&shape)
                .map_err(err)?;
            resident_keys(&placement)?
        }
        None => random_set(&shape, bytes, shape.expert_bytes, RANDOM_SET_SEED),
    };
    let residency = Arc::new(ExpertResidency::new(bytes));
    let moved = residency
        .set(model.gguf(), &keys, pool)
        .map_err(BudgetError::from)?;
    tracing::info!(
        budget_mib = bytes >> 20,
        resident_mib = moved.resident_bytes >> 20,
        experts = moved.loaded,
        of = shape.moe_layers.len() * shape.n_experts,
        from = if resident_set.is_some() {
            "resident set"
        } else {
            "random draw"
        },
        "resident experts under the memory budget"
    );
    Ok(residency)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_set_fills_the_budget_evenly_and_is_seeded() {
        let shape = ModelShape {
            moe_layers: vec![1, 2, 3],
            n_experts: 10,
            expert_bytes: 100,
        };
        let s = random_set(&shape, 1_000, 100, 1);
        assert_eq!(s.len(), 10);
        for (layer, n) in [(1, 4), (2, 3), (3, 3)] {
            assert_eq!(s.iter().filter(|k| k.0 == layer).count(), n);
        }
        let mut d = s.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), 10, "no expert twice");
        assert_eq!(s, random_set(&shape, 1_000, 100, 1));
        assert_ne!(s, random_set(&shape, 1_000, 100, 2));
        // more budget than experts: all of them
        assert_eq!(random_set(&shape, 1 << 40, 100, 1).len(), 30);
    }
}
