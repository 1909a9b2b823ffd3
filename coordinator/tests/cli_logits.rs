//! `nightshift logits` end to end: runs the binary on a tiny deepseek2 fixture (prompt as one
//! batch, then llama.cpp's greedy tokens one at a time) and compares every written row with the
//! logits llama.cpp computed on the same file.

use std::path::PathBuf;
use std::process::Command;

#[path = "../../model/tests/fixture_util/locate.rs"]
mod locate;
use locate::fixture_path as fixture;

fn join(ids: &[u32]) -> String {
    ids.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[test]
fn logits_subcommand_matches_llama_cpp() {
    // From tiny-deepseek2-Q4_K_M.expected.json, prompt 0 (rows 0..23 of the logits file).
    let prompt = [584u32, 407, 550, 566, 544, 543, 570];
    let decode = [
        154u32, 507, 565, 419, 78, 268, 325, 473, 102, 300, 439, 461, 98, 334, 204, 88,
    ];
    let n_vocab = 591;
    let out =
        std::env::temp_dir().join(format!("nightshift-cli-logits-{}.bin", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .args(["logits", "--model"])
        .arg(fixture("tiny-deepseek2-Q4_K_M.gguf"))
        .args([
            "--prompt-ids",
            &join(&prompt),
            "--decode-ids",
            &join(&decode),
            "--threads",
            "2",
            "--out",
        ])
        .arg(&out)
        .status()
        .expect("run nightshift");
    assert!(status.success(), "nightshift logits failed: {status}");
    let read = |p: PathBuf| -> Vec<f32> {
        std::fs::read(p)
            .expect("read")
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let ours = read(out.clone());
    let _ = std::fs::remove_file(&out);
    let rows = prompt.len() + decode.len();
    assert_eq!(
        ours.len(),
        rows * n_vocab,
        "expected {rows} rows of {n_vocab}"
    );
    let theirs = read(fixture("tiny-deepseek2-Q4_K_M.logits.bin"));
    let max = ours
        .iter()
        .zip(&theirs[..rows * n_vocab])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(max <= 5e-3, "max |delta| {max} > 5e-3");
}
