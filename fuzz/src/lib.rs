//! Fuzzing that runs in the test suite, on stable Rust: a small mutational driver over the
//! targets in [`targets`] (each a function of arbitrary bytes that must never panic).
//!
//! [`run`] replays the target's committed corpus (`fuzz/corpus/<target>/`, every finding ever
//! made stays there as a regression input), then mutates corpus entries (bit flips, byte and
//! integer overwrites, inserts, deletes, duplications, splices) for a time budget
//! (`NIGHTSHIFT_FUZZ_SECS`, default 8 s per target) from a seed (`NIGHTSHIFT_FUZZ_SEED`, default
//! random, always printed). An input that panics is written into the corpus directory, so the
//! finding is kept once the fix is committed, and the run fails naming the file. The same targets
//! are libFuzzer targets under `model/fuzz` (nightly, cargo-fuzz) for long coverage-guided runs.

pub mod targets;

use nightshift_kernels::rng::SplitMix64;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What one run did.
#[derive(Debug)]
pub struct Outcome {
    pub target: &'static str,
    pub executions: u64,
    pub corpus: usize,
    pub elapsed: Duration,
    pub seed: u64,
}

/// The corpus directory of `target`.
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

fn budget() -> Duration {
    let secs = std::env::var("NIGHTSHIFT_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(8.0);
    Duration::from_secs_f64(secs)
}

fn seed() -> u64 {
    std::env::var("NIGHTSHIFT_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            t ^ u64::from(std::process::id()).rotate_left(32)
        })
}

/// The workspace's one generator (`kernels::rng::SplitMix64`), reproducible from the printed seed,
/// with an index draw that takes an empty range.
struct Rng(SplitMix64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            self.0.below(n as u64) as usize
        }
    }
}

/// Integers that sit on boundaries parsers get wrong.
const INTERESTING: &[u64] = &[
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    0x1_0000_0000,
    u64::MAX / 2,
    u64::MAX,
];

fn mutate(rng: &mut Rng, input: &[u8], corpus: &[Vec<u8>], max_len: usize) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..=rng.below(4) {
        let len = v.len();
        match rng.below(9) {
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = rng.next() as u8;
            }
            2 if len > 0 => {
                let w = [1usize, 2, 4, 8][rng.below(4)];
                let at = rng.below(len);
                let x = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                for k in 0..w.min(len - at) {
                    v[at + k] = x[k];
                }
            }
            3 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                v.splice(at..at, bytes);
            }
            4 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(64));
                v.drain(at..at + n);
            }
            5 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(64));
                let chunk = v[at..at + n].to_vec();
                let to = rng.below(v.len() + 1);
                v.splice(to..to, chunk);
            }
            6 if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                if !other.is_empty() {
                    let a = rng.below(other.len());
                    let b = a + rng.below(other.len() - a) + 1;
                    let at = rng.below(len + 1);
                    v.splice(at..at, other[a..b].iter().copied());
                }
            }
            7 if len > 0 => v.truncate(rng.below(len)),
            _ => {
                // A printable or markup byte: text targets live on these.
                const TEXT: &[u8] = b" \n\t<|>{}[]\"'\\%#=_-0123456789abcXYZ";
                let at = rng.below(len + 1);
                v.insert(at, TEXT[rng.below(TEXT.len())]);
            }
        }
    }
    v.truncate(max_len);
    v
}

fn fnv(input: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in input {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Writes `input` into the corpus of `target` as `<kind>-<hash>` (unless there) and returns its
/// path: seeds the first time they are used, findings when they panic.
fn keep(target: &str, kind: &str, input: &[u8]) -> PathBuf {
    let dir = corpus_dir(target);
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{kind}-{:016x}", fnv(input)));
    if !path.exists() {
        let _ = std::fs::write(&path, input);
    }
    path
}

fn run_one(f: fn(&[u8]), input: &[u8]) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| f(input))).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".into())
    })
}

/// Replays the corpus of `target` plus `seeds`, then fuzzes for the time budget. Inputs are at
/// most `max_len` bytes. Panics (failing the test) on the first input that panics the target.
pub fn run(target: &'static str, seeds: Vec<Vec<u8>>, max_len: usize, f: fn(&[u8])) -> Outcome {
    // Seeds join the committed corpus (once: named by their hash), which is then replayed whole.
    for s in &seeds {
        keep(target, "seed", s);
    }
    let mut corpus = Vec::new();
    if let Ok(dir) = std::fs::read_dir(corpus_dir(target)) {
        let mut files: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
        files.sort();
        for p in files {
            if let Ok(b) = std::fs::read(&p) {
                corpus.push(b);
            }
        }
    }
    if corpus.is_empty() {
        corpus.push(Vec::new());
    }
    let seed = seed();
    let start = Instant::now();
    let mut executions = 0u64;
    // The default hook would print every caught panic; report them once, below.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut failure = None;
    for input in &corpus {
        executions += 1;
        if let Err(msg) = run_one(f, input) {
            failure = Some((input.clone(), msg));
            break;
        }
    }
    let mut rng = Rng(SplitMix64::new(seed));
    let deadline = budget();
    while failure.is_none() && start.elapsed() < deadline {
        let base = &corpus[rng.below(corpus.len())];
        let input = mutate(&mut rng, base, &corpus, max_len);
        executions += 1;
        if let Err(msg) = run_one(f, &input) {
            failure = Some((input, msg));
        }
    }
    std::panic::set_hook(hook);
    let outcome = Outcome {
        target,
        executions,
        corpus: corpus.len(),
        elapsed: start.elapsed(),
        seed,
    };
    eprintln!(
        "fuzz {target}: {} executions in {:.1} s, corpus {}, seed {seed}",
        outcome.executions,
        outcome.elapsed.as_secs_f64(),
        outcome.corpus
    );
    if let Some((input, msg)) = failure {
        let path = keep(target, "finding", &input);
        panic!(
            "fuzz {target}: panicked ({msg}) on the input saved as {} (seed {seed}); fix it and commit the file",
            path.display()
        );
    }
    outcome
}
