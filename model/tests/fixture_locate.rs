//! The fixture locator every crate's tests share: finds the project's copies, and names both
//! places it looked when a fixture is missing.

mod fixture_util;
use fixture_util::{fixture_dirs, fixture_path};

#[test]
fn finds_the_projects_copy_first() {
    let p = fixture_path("tiny-qwen3moe-Q2_K.gguf");
    assert!(p.starts_with(&fixture_dirs()[0]), "{}", p.display());
    assert!(p.is_file());
}

#[test]
#[should_panic(expected = "test fixture no-such-model.gguf not found: looked in")]
fn a_missing_fixture_names_where_it_looked() {
    fixture_path("no-such-model.gguf");
}
