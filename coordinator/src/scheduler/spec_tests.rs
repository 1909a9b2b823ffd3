//! Speculative decoding through the scheduler on the toy model: whatever the drafts (an oracle
//! that is right most of the time and wrong on purpose, the n-gram lookup, a predicted output),
//! every request streams exactly the text, finish reason and token count it streams without
//! speculation, greedy and seeded, alone and batched with non-speculating requests; stop
//! strings and max_tokens land where they did; rejected drafts are cut from the cache.

use super::mock::{MockEngine, MockText, EOS};
use super::spec::Speculator;
use super::*;
use nightshift_model::constrain::Grammar;
use nightshift_model::spec::ngram::NgramRange;
use nightshift_model::spec::{DraftKind, DraftRequest, Drafter, NgramDrafter};
use nightshift_model::ModelError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One request of a test run.
#[derive(Clone)]
struct Req {
    prompt: &'static str,
    max_tokens: u32,
    stop: Vec<String>,
    sampling: SamplingParams,
    speculative: bool,
    prediction: Vec<u32>,
    logprobs: Option<u32>,
    /// The grammar the output follows (constrained decoding), if any.
    grammar: Option<Grammar>,
}

fn req(prompt: &'static str, max_tokens: u32) -> Req {
    Req {
        prompt,
        max_tokens,
        stop: Vec::new(),
        sampling: SamplingParams::greedy(),
        speculative: true,
        prediction: Vec::new(),
        logprobs: None,
        grammar: None,
    }
}

/// What a request streamed: the text, each token's logprob, the finish reason and usage.
#[derive(Debug, Clone, PartialEq)]
struct Out {
    text: String,
    logprobs: Vec<f32>,
    finish: FinishReason,
    completion_tokens: u32,
    accepted: u32,
    rejected: u32,
}

/// The outputs the oracle knows: prompt bytes -> output bytes (from a run without drafts).
type Answers = Arc<Mutex<Vec<(Vec<u32>, Vec<u32>)>>>;

/// Proposes the known continuation of a request, the draft token at every `wrong`-th output
/// position replaced by another one, so that both acceptance and rejection happen.
struct Oracle {
    answers: Answers,
    wrong: usize,
}

impl Drafter for Oracle {
    fn kind(&self) -> DraftKind {
        DraftKind::Ngram
    }
    fn draft(&mut self, r: &DraftRequest) -> Result<Vec<u32>, ModelError> {
        let answers = self.answers.lock().expect("answers");
        let Some((p, out)) = answers
            .iter()
            .find(|(p, o)| r.tokens.starts_with(p) && o.starts_with(&r.tokens[p.len()..]))
        else {
            return Ok(Vec::new());
        };
        let done = r.tokens.len() - p.len();
        let mut d: Vec<u32> = out[done..].iter().take(r.max).copied().collect();
        // wrong by output position, not by call count: how the sequences' calls interleave
        // depends on when each was admitted, and a count shared by 4 sequences that draft
        // every step can make one sequence's first draft token wrong at every step
        for (j, t) in d.iter_mut().enumerate() {
            if (done + j + 1) % self.wrong == 0 {
                *t = if *t == b'x' as u32 {
                    b'y' as u32
                } else {
                    b'x' as u32
                };
            }
        }
        Ok(d)
    }
}

/// Runs `reqs` at once through a scheduler over the toy model; returns each one's output and
/// the truncations the engine saw.
fn run(reqs: &[Req], spec: Option<Speculator>, max_seqs: usize) -> (Vec<Out>, usize) {
    let mut engine = MockEngine::new(8);
    engine.prefix = true;
    run_on(engine, reqs, spec, max_seqs)
}

/// [`run`] on a given toy engine.
fn run_on(
    engine: MockEngine,
    reqs: &[Req],
    spec: Option<Speculator>,
    max_seqs: usize,
) -> (Vec<Out>, usize) {
    let truncations = engine.truncations.clone();
    let opts = SchedulerOptions {
        queue_capacity: 16,
        max_seqs,
        prefill_chunk: 64,
        n_ctx: 512,
    };
    let s = Scheduler::spawn_speculative(engine, Arc::new(MockText), opts, spec).expect("spawn");
    let mut rxs = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        s.submit(GenRequest {
            id: format!("r{i}"),
            prompt: r.prompt.bytes().map(u32::from).collect(),
            max_tokens: r.max_tokens,
            sampling: r.sampling.clone(),
            stop: r.stop.clone(),
            logprobs: r.logprobs,
            ignore_eos: false,
            constraint: r.grammar.as_ref().map(|g| {
                let vocab = MockText.constraint_vocab().expect("the toy vocabulary");
                vocab.compile(g).expect("the grammar compiles")
            }),
            cache_prompt: true,
            speculative: r.speculative,
            prediction: r.prediction.clone(),
            events: tx,
            enqueued: std::time::Instant::now(),
        })
        .expect("submit");
        rxs.push(rx);
    }
    let outs = rxs
        .into_iter()
        .map(|mut rx| {
            let d = super::mock::drain(&mut rx);
            Out {
                text: d.text,
                logprobs: d.logprobs,
                finish: d.finish,
                completion_tokens: d.usage.completion_tokens,
                accepted: d.usage.accepted_prediction_tokens,
                rejected: d.usage.rejected_prediction_tokens,
            }
        })
        .collect();
    (outs, truncations.load(Ordering::SeqCst))
}

/// Outputs with the speculation counters cleared (they are the only difference allowed).
fn plain(outs: &[Out]) -> Vec<Out> {
    outs.iter()
        .map(|o| Out {
            accepted: 0,
            rejected: 0,
            ..o.clone()
        })
        .collect()
}

fn oracle_for(reqs: &[Req], base: &[Out], wrong: usize) -> Speculator {
    // not gated: the toy model's steps take no time, every draft rides
    Speculator::new(oracle(reqs, base, wrong), 6, false)
}

/// An [`Oracle`] knowing the answers `base` to `reqs`, wrong at every `wrong`-th position.
fn oracle(reqs: &[Req], base: &[Out], wrong: usize) -> Box<dyn Drafter> {
    let answers: Vec<(Vec<u32>, Vec<u32>)> = reqs
        .iter()
        .zip(base)
        .map(|(r, o)| {
            (
                r.prompt.bytes().map(u32::from).collect(),
                o.text.bytes().map(u32::from).chain([EOS]).collect(),
            )
        })
        .collect();
    Box::new(Oracle {
        answers: Arc::new(Mutex::new(answers)),
        wrong,
    })
}

fn requests() -> Vec<Req> {
    let mut stop = req("<user>tell me a story about stops", 60);
    stop.stop = vec!["e ".into(), "zz".into()];
    let mut sampled = req("<user>a sampled one", 50);
    sampled.sampling = SamplingParams {
        temperature: 0.9,
        seed: 42,
        ..SamplingParams::default()
    };
    let mut opted_out = req("<user>no drafts for me", 40);
    opted_out.speculative = false;
    let mut with_logprobs = req("<user>logprobs please", 30);
    with_logprobs.logprobs = Some(2);
    vec![
        req("<user>hello there", 80),
        req("<user>short", 3),
        stop,
        sampled,
        opted_out,
        with_logprobs,
    ]
}

#[test]
fn drafts_never_change_the_output_alone_or_batched() {
    let reqs = requests();
    for max_seqs in [1, 4] {
        let (base, cut0) = run(&reqs, None, max_seqs);
        assert_eq!(cut0, 0);
        assert!(base.iter().all(|o| o.accepted == 0 && o.rejected == 0));
        for wrong in [3, 5, 1000] {
            let (got, cuts) = run(&reqs, Some(oracle_for(&reqs, &base, wrong)), max_seqs);
            assert_eq!(
                plain(&got),
                base,
                "max_seqs {max_seqs}, every {wrong}th draft wrong"
            );
            let accepted: u32 = got.iter().map(|o| o.accepted).sum();
            assert!(accepted > 20, "drafts were accepted ({accepted})");
            assert_eq!(
                got[4].accepted + got[4].rejected,
                0,
                "an opted-out request drafts nothing"
            );
            if wrong < 1000 {
                assert!(got.iter().any(|o| o.rejected > 0));
                assert!(cuts > 0, "rejected drafts are cut from the cache");
            }
        }
    }
}

#[test]
fn the_ngram_drafter_and_a_prediction_keep_the_output() {
    let mut reqs = requests();
    let (base, _) = run(&reqs, None, 4);
    // a prediction of each answer (a code editor's guess): the lookup finds it
    for (r, o) in reqs.iter_mut().zip(&base) {
        r.prediction = o.text.bytes().map(u32::from).collect();
    }
    let ngram = || {
        Speculator::new(
            Box::new(NgramDrafter::new(NgramRange { min: 1, max: 4 })),
            5,
            false,
        )
    };
    let (got, _) = run(&reqs, Some(ngram()), 4);
    assert_eq!(plain(&got), base);
    // every emitted token but each step's first comes from an accepted draft
    let accepted: u32 = got.iter().map(|o| o.accepted).sum();
    let emitted: u32 = got.iter().map(|o| o.completion_tokens).sum();
    assert!(
        accepted * 2 > emitted,
        "the prediction's tokens are accepted: {got:?}"
    );
    // without a prediction the toy model's text rarely repeats, but the output is the same
    for r in &mut reqs {
        r.prediction.clear();
    }
    let (got, _) = run(&reqs, Some(ngram()), 4);
    assert_eq!(plain(&got), base);
}

#[test]
fn the_policy_gates_drafts_by_measured_step_times() {
    // steps of the toy model take ~nothing and a draft row costs as little: drafting pays once
    // measured, and the output is unchanged
    let mut reqs = requests();
    let (base, _) = run(&reqs, None, 2);
    for (r, o) in reqs.iter_mut().zip(&base) {
        r.prediction = o.text.bytes().map(u32::from).collect();
    }
    let gated = Speculator::new(
        Box::new(NgramDrafter::new(NgramRange { min: 1, max: 4 })),
        4,
        true,
    );
    let (got, _) = run(&reqs, Some(gated), 2);
    assert_eq!(plain(&got), base);
}

#[test]
fn the_policy_drafts_only_while_the_measured_rows_pay() {
    // one request, drafted by an oracle wrong at every 5th position (about 80% accepted),
    // the policy on, on a toy engine whose steps cost time by rows. The costs are tens of
    // milliseconds so that a loaded machine's scheduling delays (added to every step alike,
    // which makes rows look cheaper) stay well short of tipping the decision.
    let reqs = vec![req("<user>hello there", 24)];
    let engine = |step_ms: u64, row_ms: u64| {
        let mut e = MockEngine::new(8);
        // only max_tokens ends the answer
        e.eos = false;
        e.step_delay = std::time::Duration::from_millis(step_ms);
        e.row_delay = std::time::Duration::from_millis(row_ms);
        e
    };
    let (base, _) = run_on(engine(0, 0), &reqs, None, 1);
    assert_eq!(base[0].completion_tokens, 24);
    let gated = |base: &[Out]| Speculator::new(oracle(&reqs, base, 5), 6, true);
    let drafted = |o: &Out| o.accepted + o.rejected;
    // a row costs as much as a whole step: a first draft token is worth 0.5 tokens (the prior)
    // and costs a step, so nothing is drafted (the step without drafts is measured first;
    // it would take 60 ms of delay on every step to make a 2-row step look cheap enough)
    let (got, _) = run_on(engine(0, 60), &reqs, Some(gated(&base)), 1);
    assert_eq!(plain(&got), base);
    assert_eq!(drafted(&got[0]), 0, "{:?}", got[0]);
    // a row costs a twentieth of a step: drafting pays, most of the output comes from drafts
    let (got, _) = run_on(engine(60, 3), &reqs, Some(gated(&base)), 1);
    assert_eq!(plain(&got), base);
    assert!(got[0].accepted >= 10, "{:?}", got[0]);
}

/// Counts the drafter's calls (a drafter that never drafts).
struct Silent(Arc<AtomicUsize>);

impl Drafter for Silent {
    fn kind(&self) -> DraftKind {
        DraftKind::Suffix
    }
    fn draft(&mut self, _r: &DraftRequest) -> Result<Vec<u32>, ModelError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Vec::new())
    }
}

#[test]
fn no_drafts_no_verification() {
    let reqs = requests();
    let (base, _) = run(&reqs, None, 4);
    let calls = Arc::new(AtomicUsize::new(0));
    let s = Speculator::new(Box::new(Silent(calls.clone())), 4, false);
    let (got, cuts) = run(&reqs, Some(s), 4);
    assert_eq!(got, base);
    assert_eq!(cuts, 0);
    assert!(calls.load(Ordering::SeqCst) > 0, "the drafter was asked");
}

/// Constrained requests (a JSON Schema, a Lark grammar) next to unconstrained ones.
fn constrained_requests() -> Vec<Req> {
    let schema = serde_json::json!({"type": "object", "properties": {
        "n": {"type": "integer"}, "name": {"type": "string", "maxLength": 12}},
        "required": ["n", "name"], "additionalProperties": false});
    let mut json = req("<user>give me json", 60);
    json.grammar = Some(Grammar::JsonSchema(schema));
    let mut lark = req("<user>letters then digits", 40);
    lark.grammar = Some(Grammar::Lark("start: /[a-w]{3,12}/ /[0-9]{2,6}/".into()));
    let mut sampled = req("<user>a sampled constrained one", 40);
    sampled.grammar = Some(Grammar::Lark("start: /[a-z ]{4,30}/".into()));
    sampled.sampling = SamplingParams {
        temperature: 0.9,
        seed: 7,
        ..SamplingParams::default()
    };
    vec![json, req("<user>hello there", 50), lark, sampled]
}

#[test]
fn constrained_sequences_speculate_and_keep_the_output() {
    let reqs = constrained_requests();
    for max_seqs in [1, 4] {
        let (base, _) = run(&reqs, None, max_seqs);
        assert!(
            base[0].text.starts_with("{\"n\": ") && base[0].finish == FinishReason::Stop,
            "the schema holds: {:?}",
            base[0]
        );
        // every 3rd draft token wrong: 'x'/'y' are refused inside the number and by the
        // lark grammar's letters, allowed in the string (then rejected by sampling)
        for wrong in [3, 4, 1000] {
            let (got, cuts) = run(&reqs, Some(oracle_for(&reqs, &base, wrong)), max_seqs);
            assert_eq!(
                plain(&got),
                base,
                "max_seqs {max_seqs}, every {wrong}th draft wrong"
            );
            for i in [0, 2, 3] {
                assert!(
                    got[i].accepted > 3,
                    "constrained request {i} speculated: {:?}",
                    got[i]
                );
            }
            if wrong < 1000 {
                assert!(got.iter().any(|o| o.rejected > 0));
                assert!(cuts > 0, "rejected drafts are cut from the cache");
                // the lark grammar refuses every wrong token ('x'/'y' are neither [a-w] nor
                // digits): its drafts end before them, so none is computed and rejected
                assert_eq!(
                    got[2].rejected, 0,
                    "a draft token the grammar refuses never becomes a row: {:?}",
                    got[2]
                );
            }
        }
    }
}
