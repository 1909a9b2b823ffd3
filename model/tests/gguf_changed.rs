//! The GGUF reader checks what it maps: a directory is refused as such, and a file truncated
//! under the map is reported by `check_unchanged` (naming the file and the sizes), which the
//! servers poll; a file replaced by rename keeps the old mapping valid and unreported.

use std::path::Path;

use nightshift_model::gguf::{Gguf, GgufError};

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-qwen3moe-Q2_K.gguf")
}

#[test]
fn a_directory_is_not_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let e = Gguf::open(dir.path()).unwrap_err();
    assert!(matches!(e, GgufError::NotAFile { .. }), "{e:?}");
    assert!(
        e.to_string()
            .ends_with("expected a GGUF file, found a directory"),
        "{e}"
    );
}

#[test]
fn truncation_under_the_map_is_reported_and_a_rename_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::copy(fixture(), &path).unwrap();
    let g = Gguf::open(&path).unwrap();
    g.check_unchanged().unwrap();

    // Atomic replacement: a new file renamed over the path; the mapped inode is untouched.
    let next = dir.path().join("m.gguf.new");
    std::fs::copy(fixture(), &next).unwrap();
    std::fs::rename(&next, &path).unwrap();
    g.check_unchanged().unwrap();
    drop(g);

    let g = Gguf::open(&path).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let e = g.check_unchanged().unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("m.gguf") && msg.contains(&format!("from {len} to {} bytes", len / 2)),
        "{msg}"
    );
    assert!(msg.contains("renaming it over the old one"), "{msg}");
}
