//! Test-only: opens a fixture model by name, from the project's copy (`model/tests/data`) or,
//! when that is missing, from the shared fixtures next to the checkout.
#![allow(dead_code)]

use nightshift_model::Model;
use std::path::PathBuf;
use std::sync::Arc;

/// Where fixture `name` lives.
pub fn fixture_path(name: &str) -> PathBuf {
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    if local.exists() {
        local
    } else {
        PathBuf::from("/work/shared/fixtures/models").join(name)
    }
}

/// Fixture `name`, loaded.
pub fn model(name: &str) -> Arc<Model> {
    Model::load(&fixture_path(name)).expect("model loads")
}
