//! `nightshift-atlas record` end to end on the tiny qwen3moe fixture: a two-line JSONL (a raw
//! prompt and a chat) gives an atlas whose counts add up (every MoE layer sees tokens × top_k
//! activations); malformed lines fail with the line number and write nothing.

use std::path::PathBuf;
use std::process::Command;

use nightshift_atlas::trace::Atlas;

const BIN: &str = env!("CARGO_BIN_EXE_nightshift-atlas");

#[path = "../../model/tests/fixture_util/locate.rs"]
mod locate;

fn fixture() -> PathBuf {
    locate::fixture_path("tiny-qwen3moe-Q2_K.gguf")
}

fn run(dir: &tempfile::TempDir, jsonl: &str) -> (bool, String, PathBuf) {
    let prompts = dir.path().join("p.jsonl");
    std::fs::write(&prompts, jsonl).expect("write prompts");
    let out = dir.path().join("out.atlas");
    let o = Command::new(BIN)
        .arg("record")
        .arg("--model")
        .arg(fixture())
        .arg("--prompts")
        .arg(&prompts)
        .args(["--max-tokens", "4", "-o"])
        .arg(&out)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run nightshift-atlas");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), text, out)
}

#[test]
fn record_counts_add_up() {
    let dir = tempfile::tempdir().expect("tmp");
    let (ok, text, out) = run(
        &dir,
        "{\"prompt\": \"Hello world\"}\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"hi there\"}]}\n",
    );
    assert!(ok, "{text}");
    assert!(text.contains("recorded 2 prompts"), "{text}");
    let a = Atlas::load(&out).expect("atlas written");
    assert!(a.all_time.tokens > 0);
    assert!(!a.shape.moe_layers.is_empty());
    for (slot, row) in a.all_time.activations.iter().enumerate() {
        let sum: u64 = row.iter().sum();
        assert_eq!(sum, a.all_time.tokens * a.top_k as u64, "slot {slot}");
    }
}

#[test]
fn malformed_lines_name_the_line() {
    for (jsonl, needle) in [
        (
            "{\"prompt\": \"x\"}\n{\"prompt\": 3}\n",
            "line 2: \"prompt\" must be a string",
        ),
        ("{\"prompt\": \"x\"}\n\nnot json\n", "line 3: not JSON"),
        ("{\"text\": \"x\"}\n", "line 1: expected {\"prompt\""),
        (
            "{\"messages\": [{\"role\": \"user\"}]}\n",
            "line 1: message 0 needs",
        ),
        ("\n\n", "expected at least one prompt line"),
    ] {
        let dir = tempfile::tempdir().expect("tmp");
        let (ok, text, out) = run(&dir, jsonl);
        assert!(!ok, "{jsonl:?} should fail");
        assert!(text.contains(needle), "{jsonl:?}: {text}");
        assert!(!out.exists(), "{jsonl:?}: no atlas on failure");
    }
}
