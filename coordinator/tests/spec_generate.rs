//! Speculative decoding end to end through `nightshift generate` on the qwen3moe and deepseek2
//! fixtures: greedy text is byte-identical with speculation off and with every drafter (n-gram,
//! suffix, the target as its own draft model), in process and with `--nodes 2`, drafts forced
//! into every step; seeded sampling gives the same text too. The draft model at 100% acceptance
//! shows the acceptance line generate prints; a draft model of another vocabulary is refused.

mod support;

use std::path::Path;
use std::process::Command;
use support::fixture as data;

/// A prompt that quotes itself, so the lookups find drafts.
const PROMPT: &str = "fn main() { let x = 1; let y = 2; println!(\"{}\", x + y); } \
                      fn main() { let x = 1; let y = 2;";

/// (stdout, stderr) of `nightshift generate` with `extra` flags.
fn generate(model: &Path, extra: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .arg("generate")
        .arg("--model")
        .arg(model)
        .args(["--prompt", PROMPT, "-n", "24", "--threads", "2"])
        .args(extra)
        .output()
        .expect("nightshift runs");
    assert!(
        out.status.success(),
        "generate {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The accepted and drafted counts of generate's acceptance line.
fn acceptance(stderr: &str) -> (u32, u32) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("speculative"))
        .expect("an acceptance line");
    let after = line.split("): ").nth(1).expect("counts");
    let words: Vec<&str> = after.split_whitespace().collect();
    (
        words[0].parse().expect("accepted"),
        words[2].parse().expect("drafted"),
    )
}

fn check(fixture: &str, nodes: &[&str]) {
    let model = data(fixture);
    let m = model.to_str().expect("utf-8 path");
    let greedy = ["--temp", "0"];
    let (want, _) = generate(
        &model,
        &[&greedy[..], &["--speculative", "off"], nodes].concat(),
    );
    assert!(want.len() > 1, "{fixture}: some text");
    for kind in [
        &["--speculative", "ngram"][..],
        &["--speculative", "suffix"],
        &["--speculative", "draft", "--draft-model", m],
    ] {
        let (got, err) = generate(
            &model,
            &[&greedy[..], kind, &["--speculative-always"], nodes].concat(),
        );
        assert_eq!(
            got, want,
            "{fixture} {kind:?} {nodes:?}: greedy text changed"
        );
        if kind[1] == "draft" {
            let (accepted, drafted) = acceptance(&err);
            assert!(drafted > 0, "{fixture}: the draft model drafted");
            assert_eq!(
                accepted, drafted,
                "{fixture}: the target drafts for itself exactly"
            );
        }
    }
    // policy-gated (the default) and seeded sampling
    let (got, _) = generate(&model, &[&greedy[..], nodes].concat());
    assert_eq!(got, want, "{fixture}: gated speculation changed the text");
    let seeded = ["--temp", "0.9", "--seed", "11"];
    let (want, _) = generate(
        &model,
        &[&seeded[..], &["--speculative", "off"], nodes].concat(),
    );
    let (got, _) = generate(
        &model,
        &[
            &seeded[..],
            &["--speculative", "ngram", "--speculative-always"],
            nodes,
        ]
        .concat(),
    );
    assert_eq!(
        got, want,
        "{fixture}: seeded sampling changed with speculation"
    );
}

#[test]
fn speculation_keeps_the_text_in_process() {
    check("tiny-qwen3moe-Q4_K_M.gguf", &[]);
    check("tiny-deepseek2-Q4_K_M.gguf", &[]);
}

#[test]
fn speculation_keeps_the_text_with_two_nodes() {
    support::workspace_bin("nightshift-expert-node", "nightshift-expert-node");
    check(
        "tiny-qwen3moe-Q2_K.gguf",
        &["--nodes", "2", "--node-threads", "1"],
    );
    check(
        "tiny-deepseek2-Q2_K.gguf",
        &["--nodes", "2", "--node-threads", "1"],
    );
}

#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .arg("generate")
        .arg("--model")
        .arg(data("tiny-qwen3moe-Q4_K_M.gguf"))
        .args([
            "--prompt",
            "hi",
            "-n",
            "2",
            "--speculative",
            "draft",
            "--draft-model",
        ])
        .arg(data("tiny-deepseek2-Q4_K_M.gguf"))
        .output()
        .expect("nightshift runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("draft model: expected the target's vocabulary"),
        "{err}"
    );
}
