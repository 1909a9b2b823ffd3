//! What each engine step computes, on the toy model (its batches are logged): requests
//! arriving together with a shared prompt prefix compute the shared blocks once (the others
//! wait for them, then take them from the cache) and stream what they stream alone; a long
//! prompt is prefilled in `prefill_chunk` pieces while a running sequence keeps decoding a token
//! every step, with the same output as unchunked.

use super::mock::{MockEngine, MockText};
use super::*;
use std::sync::{Arc, Mutex};

/// What one request streamed.
#[derive(Debug, Clone, PartialEq)]
struct Out {
    text: String,
    finish: FinishReason,
    completion_tokens: u32,
    cached_tokens: u32,
}

type Batches = Arc<Mutex<Vec<Vec<BatchTokenLog>>>>;
type BatchTokenLog = nightshift_model::BatchToken;

/// Runs `prompts` (submitted together, in order: the engine's first step waits until all are
/// submitted, so a loaded machine cannot let the first finish before the next arrives) through a
/// scheduler over the toy model; returns each output and every batch the engine ran.
fn run(
    prompts: &[(Vec<u32>, u32)],
    prefix: bool,
    prefill_chunk: usize,
) -> (Vec<Out>, Vec<Vec<BatchTokenLog>>) {
    let mut engine = MockEngine::new(8);
    engine.prefix = prefix;
    engine.eos = false;
    let log: Batches = Arc::default();
    engine.batches = Some(log.clone());
    let (go, hold) = std::sync::mpsc::channel();
    engine.hold = Some(hold);
    let opts = SchedulerOptions {
        queue_capacity: 16,
        max_seqs: 8,
        prefill_chunk,
        n_ctx: 1024,
    };
    let s = Scheduler::spawn(engine, Arc::new(MockText), opts).expect("spawn");
    let mut rxs = Vec::new();
    for (i, (prompt, max_tokens)) in prompts.iter().enumerate() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        s.submit(GenRequest {
            id: format!("r{i}"),
            prompt: prompt.clone(),
            max_tokens: *max_tokens,
            sampling: SamplingParams::greedy(),
            stop: Vec::new(),
            logprobs: None,
            ignore_eos: false,
            constraint: None,
            cache_prompt: true,
            speculative: false,
            prediction: Vec::new(),
            events: tx,
            enqueued: std::time::Instant::now(),
        })
        .expect("submit");
        rxs.push(rx);
    }
    go.send(()).expect("the engine waits for the go");
    let outs = rxs
        .into_iter()
        .map(|mut rx| {
            let d = super::mock::drain(&mut rx);
            Out {
                text: d.text,
                finish: d.finish,
                completion_tokens: d.usage.completion_tokens,
                cached_tokens: d.usage.cached_tokens,
            }
        })
        .collect();
    drop(s);
    let batches = log.lock().expect("log").clone();
    (outs, batches)
}

fn bytes(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

/// Prompt positions below `below` computed by any step (a prompt position is one whose token
/// did not come from the sequence's own sampling: logged before its first logits row).
fn computed_below(batches: &[Vec<BatchTokenLog>], below: u32) -> usize {
    batches
        .iter()
        .flatten()
        .filter(|t| t.pos < below && !t.want_logits)
        .count()
}

#[test]
fn a_prefix_being_computed_is_computed_once_and_shared() {
    // 64 shared bytes (4 blocks of 16) and a diff of its own per review
    let shared = "You review pull requests. Repository context: fn main() {} // ok";
    assert_eq!(shared.len(), 64);
    let reviews: Vec<(Vec<u32>, u32)> = (0..4)
        .map(|i| (bytes(&format!("{shared}diff number {i}: +x -y")), 6))
        .collect();
    let (alone, _) = run(&reviews, false, 16);
    let (cold, cold_batches) = run(&reviews, false, 16);
    assert_eq!(alone, cold, "the toy model is deterministic");
    assert_eq!(
        computed_below(&cold_batches, 64),
        4 * 64,
        "without the cache every review computes the shared part"
    );
    for chunk in [16, 40, 1024] {
        let (shared_outs, batches) = run(&reviews, true, chunk);
        assert_eq!(
            computed_below(&batches, 64),
            64,
            "chunk {chunk}: the shared part is computed by one review only"
        );
        for (i, (a, b)) in shared_outs.iter().zip(&cold).enumerate() {
            assert_eq!(a.text, b.text, "chunk {chunk} review {i}: same text");
            assert_eq!(a.finish, b.finish);
            assert_eq!(a.completion_tokens, b.completion_tokens);
        }
        assert_eq!(shared_outs[0].cached_tokens, 0, "the first computes");
        for o in &shared_outs[1..] {
            assert_eq!(
                o.cached_tokens, 64,
                "chunk {chunk}: the others take the blocks"
            );
        }
    }
}

#[test]
fn a_long_prompt_is_prefilled_in_chunks_while_a_decode_keeps_going() {
    let short = bytes("tell me a story");
    let long: Vec<u32> = (0..300u32).map(|i| u32::from(b'a') + i % 26).collect();
    let reqs = vec![(short, 40), (long.clone(), 4)];
    let (whole, whole_batches) = run(&reqs, false, 4096);
    // the other sequence never reaches position 299 (15 + 40 positions)
    let ls = whole_batches
        .iter()
        .flatten()
        .find(|t| t.pos as usize == long.len() - 1)
        .map(|t| t.seq)
        .expect("the long prompt's last position");
    assert!(
        whole_batches
            .iter()
            .any(|b| b.iter().filter(|t| t.seq == ls).count() == long.len()),
        "unchunked: the long prompt in one step"
    );
    let chunk = 16;
    let (chunked, batches) = run(&reqs, false, chunk);
    assert_eq!(chunked, whole, "chunking changes no output");
    // the first sequence's handle is the one of the first batch's first token
    let first = batches[0][0].seq;
    let mut prefill_steps = 0;
    for (n, b) in batches.iter().enumerate() {
        let prompt_rows = b
            .iter()
            .filter(|t| t.seq != first && (t.pos as usize) < long.len())
            .count();
        assert!(
            prompt_rows <= chunk,
            "step {n}: {prompt_rows} prompt tokens"
        );
        if n > 0 && prompt_rows > 0 {
            prefill_steps += 1;
            assert!(
                b.iter().any(|t| t.seq == first),
                "step {n}: the running sequence decodes while the long prompt prefills"
            );
        }
    }
    assert!(
        prefill_steps >= long.len() / chunk - 1,
        "the long prompt took {prefill_steps} steps after the first"
    );
}
