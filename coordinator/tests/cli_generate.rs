//! `nightshift generate` and `nightshift tokenize` end to end on the tiny fixtures: greedy
//! generation (`--temp 0`) streams exactly the text of llama.cpp's greedy continuation, and
//! tokenize prints llama.cpp's ids.

use nightshift_model::gguf::Gguf;
use nightshift_model::tokenizer::{StreamDecoder, Tokenizer};
use std::process::Command;

#[path = "../../model/tests/fixture_util/locate.rs"]
mod locate;
use locate::fixture_path as fixture;

fn nightshift(args: &[&str], model: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .arg(args[0])
        .arg("--model")
        .arg(fixture(model))
        .args(&args[1..])
        .output()
        .expect("run nightshift");
    assert!(
        out.status.success(),
        "nightshift {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// (model, prompt, llama.cpp's greedy ids) from the fixtures' expected.json.
fn check_greedy(model: &str, prompt: &str, greedy: &[u32]) {
    check_greedy_with(model, prompt, greedy, &[]);
}

/// [`check_greedy`] with more `generate` arguments (a cache type).
fn check_greedy_with(model: &str, prompt: &str, greedy: &[u32], extra: &[&str]) {
    let g = Gguf::open(&fixture(model)).expect("gguf");
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
    let mut dec = StreamDecoder::new();
    let mut want = String::new();
    for &id in greedy {
        if tok.is_eog(id) {
            break;
        }
        want.push_str(&dec.push(&tok, id));
    }
    want.push_str(&dec.flush());
    want.push('\n');
    let n = greedy.len().to_string();
    let mut args = vec![
        "generate",
        "--prompt",
        prompt,
        "-n",
        &n,
        "--temp",
        "0",
        "--threads",
        "2",
    ];
    args.extend_from_slice(extra);
    let got = nightshift(&args, model);
    assert_eq!(
        got, want,
        "{model}: greedy text differs from llama.cpp's continuation"
    );
}

#[test]
fn greedy_generate_matches_llama_cpp() {
    check_greedy(
        "tiny-qwen3moe-Q4_K_M.gguf",
        "The coordinator runs attention and routing",
        &[
            443, 188, 535, 116, 258, 545, 467, 371, 226, 88, 449, 581, 511, 21, 161, 542,
        ],
    );
    check_greedy(
        "tiny-deepseek2-Q5_K_M.gguf",
        "def main():\n    print(42)",
        &[
            583, 391, 57, 429, 188, 274, 64, 297, 331, 152, 417, 378, 345, 426, 45, 360,
        ],
    );
}

#[test]
fn greedy_generate_with_a_q8_0_cache_matches_llama_cpp() {
    // llama.cpp's greedy ids with -ctk q8_0 -ctv q8_0 (NAME.kv-q8_0.expected.json)
    check_greedy_with(
        "tiny-qwen3moe-Q4_K_M.gguf",
        "def main():\n    print(42)",
        &[
            321, 270, 573, 338, 167, 528, 201, 348, 427, 398, 110, 49, 63, 276, 92, 295,
        ],
        &["--kv-type", "q8_0"],
    );
}

#[test]
fn greedy_generate_under_a_memory_budget_matches_llama_cpp() {
    // a third of the experts resident, the others read whole into a staging cache of 40 KiB
    // (one or two of these experts: calls stream through it), the default cache, or through
    // the page cache (`0`)
    let greedy = [
        443, 188, 535, 116, 258, 545, 467, 371, 226, 88, 449, 581, 511, 21, 161, 542,
    ];
    for cold in ["40KiB", "auto", "0"] {
        check_greedy_with(
            "tiny-qwen3moe-Q4_K_M.gguf",
            "The coordinator runs attention and routing",
            &greedy,
            &["--memory-budget", "33%", "--cold-cache", cold],
        );
    }
    // the cache reports itself, and a size it cannot read is a clear error
    let out = Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .args(["generate", "--model"])
        .arg(fixture("tiny-qwen3moe-Q4_K_M.gguf"))
        .args(["--prompt", "hi", "-n", "4", "--temp", "0"])
        .args(["--memory-budget", "33%", "--cold-cache", "40KiB"])
        .output()
        .expect("run nightshift");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("cold cache:") && err.contains("evicted"),
        "{err}"
    );
    assert!(
        !err.contains(" 0 evicted"),
        "a 40 KiB cache evicted nothing: {err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .args(["generate", "--model"])
        .arg(fixture("tiny-qwen3moe-Q4_K_M.gguf"))
        .args(["--prompt", "hi", "-n", "4"])
        .args(["--memory-budget", "33%", "--cold-cache", "lots"])
        .output()
        .expect("run nightshift");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a bad --cold-cache was accepted");
    assert!(err.contains("--cold-cache"), "{err}");
}

#[test]
fn kv_f16_is_an_alias_that_conflicts_with_kv_type() {
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_nightshift"))
            .args(["generate", "--model"])
            .arg(fixture("tiny-qwen3moe-Q2_K.gguf"))
            .args(["--prompt", "x", "-n", "4", "--temp", "0", "--threads", "2"])
            .args(extra)
            .output()
            .expect("run nightshift")
    };
    let (alias, named) = (run(&["--kv-f16"]), run(&["--kv-type", "f16"]));
    assert!(alias.status.success() && named.status.success());
    assert_eq!(alias.stdout, named.stdout);
    let both = run(&["--kv-f16", "--kv-type", "q8_0"]);
    assert!(
        !both.status.success(),
        "--kv-f16 with --kv-type was accepted"
    );
}

#[test]
fn tokenize_prints_llama_cpp_ids() {
    let got = nightshift(
        &["tokenize", "--text", "Hello world"],
        "tiny-deepseek2-Q4_K_M.gguf",
    );
    assert_eq!(got.trim(), "[584,72,101,327,111,343,262,108,100]");
}

/// Prompt tokens `generate` reports on stderr (`prefill: N tokens ...`).
fn prompt_tokens(args: &[&str], model: &str) -> usize {
    let out = Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .arg("generate")
        .arg("--model")
        .arg(fixture(model))
        .args(args)
        .output()
        .expect("run nightshift");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    err.split("prefill: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no prompt size in {err}"))
}

#[test]
fn generate_chat_reads_the_message_as_plain_text() {
    for model in ["tiny-qwen3moe-Q2_K.gguf", "tiny-deepseek2-Q2_K.gguf"] {
        let n = |prompt: &str| {
            prompt_tokens(
                &["--chat", "--prompt", prompt, "-n", "1", "--temp", "0"],
                model,
            )
        };
        let empty = n("x");
        // a control token would add one token; as text the marker is several
        for marker in ["<|im_start|>", "<|im_end|>"] {
            let with = n(&format!("x{marker}"));
            assert!(
                with > empty + 1,
                "{model}: `{marker}` in a message became a control token ({with} vs {empty} tokens)"
            );
        }
    }
}
