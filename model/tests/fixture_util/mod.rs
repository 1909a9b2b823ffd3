//! Test-only: opens a fixture model by name, from wherever `locate.rs` finds it.
#![allow(dead_code, unused_imports)]

pub mod kv;
mod locate;

pub use locate::{fixture_dirs, fixture_path};

use nightshift_model::Model;
use std::sync::Arc;

/// Fixture `name`, loaded.
pub fn model(name: &str) -> Arc<Model> {
    Model::load(&fixture_path(name)).expect("model loads")
}
