//! Test-only: finds a fixture file by name — the project's copy in `model/tests/data`, else the
//! shared fixtures beside the checkout (`../shared/fixtures/models`, relative to the workspace) —
//! and fails with both places named when neither has it. Plain `std`, so the tests of every crate
//! include this one file (`#[path = ".../locate.rs"]`) instead of each guessing paths.

use std::path::{Path, PathBuf};

/// The workspace root: every crate that includes this file sits one directory below it.
fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("a crate directory has a parent")
}

/// The places searched for fixtures, in order.
pub fn fixture_dirs() -> [PathBuf; 2] {
    let root = workspace_root();
    [
        root.join("model/tests/data"),
        root.join("../shared/fixtures/models"),
    ]
}

/// Where fixture file `name` (e.g. `tiny-qwen3moe-Q2_K.gguf`) lives; panics naming the places
/// searched when it is in none of them.
pub fn fixture_path(name: &str) -> PathBuf {
    let dirs = fixture_dirs();
    for dir in &dirs {
        let p = dir.join(name);
        if p.exists() {
            return p;
        }
    }
    panic!(
        "test fixture {name} not found: looked in {} and {}",
        dirs[0].display(),
        dirs[1].display()
    );
}
