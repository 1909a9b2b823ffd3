//! Test-only: opens a fixture model by name, from wherever `locate.rs` finds it.
#![allow(dead_code, unused_imports)]

pub mod kv;
mod locate;

pub use locate::{fixture_dirs, fixture_path};

use nightshift_model::{ExpertMemory, LoadOptions, Model};
use std::sync::Arc;

/// Fixture `name`, loaded.
pub fn model(name: &str) -> Arc<Model> {
    Model::load(&fixture_path(name)).expect("model loads")
}

/// Fixture `name`, loaded with its routed experts read from the file map.
pub fn mapped(name: &str) -> Arc<Model> {
    Model::load_with(
        &fixture_path(name),
        LoadOptions {
            experts: ExpertMemory::Mapped,
            ..LoadOptions::default()
        },
    )
    .expect("model loads")
}

/// Every expert of every MoE layer, as (layer, expert).
pub fn all_experts(model: &Model) -> Vec<(u32, u32)> {
    let c = model.config();
    (0..c.n_layer)
        .filter(|&l| c.is_moe_layer(l))
        .flat_map(|l| (0..c.n_expert as u32).map(move |e| (l as u32, e)))
        .collect()
}

/// Bytes of the experts `set` (their three matrices as stored), what a residency budget counts.
pub fn expert_bytes(model: &Model, set: &[(u32, u32)]) -> u64 {
    set.iter()
        .map(|&(l, e)| {
            let w = model.expert_weights(l as usize, e).expect("expert");
            (w.gate.bytes().len() + w.up.bytes().len() + w.down.bytes().len()) as u64
        })
        .sum()
}
