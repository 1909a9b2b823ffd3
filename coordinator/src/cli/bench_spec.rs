//! `nightshift bench spec`: speculative decoding against decoding without it, on one model in
//! process, in one run so the ratios are side by side (the VM drifts): each workload runs with
//! speculation off and on, alternating which goes first, for several rounds, and the table gives
//! the range of decode tok/s ratios. Workloads, built honestly from the model's own output:
//! `quoting` (a greedy continuation C of a prompt P is generated first, as the requests decode:
//! never an end token; the prompt then quotes it: P C P; four such prompts, one request at a
//! time, since how far a random model follows its quote differs from prompt to prompt),
//! `predicted` (prompt P with OpenAI's `prediction` = C, what code editors send), `noisy N%`
//! (the same prediction with N% of its tokens replaced, for each `--noise` level: the acceptance
//! they give brackets the 70%-acceptance workload), `no-overlap` (a prompt of tokens
//! that never repeat), and `4 sessions` (four quoting prompts at once). Each mode runs
//! on one scheduler for the whole run, as a server does (the policy's measured step times and
//! the drafter's record carry over between requests). Then where each workload's time went,
//! from the scheduler's step tally (steps with drafts, draft rows and accepted drafts per such
//! step, drafting time, plain decode steps' and whole steps' time on both sides), and the
//! engine's step time by rows of one sequence (the cost a draft token adds).

use crate::scheduler::model_backend::{engine_with, EngineLimits};
use crate::scheduler::model_text::ModelText;
use crate::scheduler::spec::Counts;
use crate::scheduler::{
    EndTokens, Event, GenRequest, Scheduler, SchedulerOptions, TextModel, Usage,
};
use anyhow::Context;
use nightshift_kernels::rng::SplitMix64;
use nightshift_model::{BatchToken, Engine, EngineOptions, Model, SamplerParams};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Arguments of `nightshift bench spec`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF model file.
    #[arg(long)]
    pub model: PathBuf,
    /// Compute threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 64)]
    pub tokens: u32,
    /// Prompt tokens (before quoting).
    #[arg(long, default_value_t = 48)]
    pub prompt_tokens: usize,
    /// A/B rounds per workload (each mode runs first in half of them when even).
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
    /// Most rows of the step-time curve.
    #[arg(long, default_value_t = 12)]
    pub max_rows: usize,
    /// Shares of a prediction's tokens replaced (percent), one `noisy N%` workload each.
    #[arg(long, value_delimiter = ',', default_value = "10,20,30")]
    pub noise: Vec<u32>,
    /// Run only the workloads whose names start with one of these (e.g. `no-overlap,noisy`).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// The drafter and its flags (as `serve`).
    #[command(flatten)]
    pub spec: super::spec_args::SpecArgs,
}

/// A request of a workload.
struct Job {
    prompt: Vec<u32>,
    prediction: Vec<u32>,
}

/// What one run of a workload measured (summed over its requests).
#[derive(Default, Clone, Copy)]
struct Measured {
    /// Tokens decoded inside the run's decode window ([`decode_window`]) and its seconds.
    decoded: u64,
    secs: f64,
    /// Tokens decoded after each request's first (which its prefill gives), window or not.
    after_first: u64,
    accepted: u64,
    drafted: u64,
    /// The scheduler's step counts over the run.
    steps: Counts,
}

impl Measured {
    fn tok_s(&self) -> f64 {
        self.decoded as f64 / self.secs.max(1e-9)
    }

    fn add(&mut self, m: &Measured) {
        self.decoded += m.decoded;
        self.secs += m.secs;
        self.after_first += m.after_first;
        self.accepted += m.accepted;
        self.drafted += m.drafted;
        self.steps.add(&m.steps);
    }
}

/// How a workload's requests are sent.
#[derive(Clone, Copy, PartialEq)]
enum Send {
    /// All at once (concurrent sessions).
    Together,
    /// One after another, each alone (a single stream).
    OneAtATime,
}

struct Bench {
    model: Arc<Model>,
    pool: Arc<rayon::ThreadPool>,
    text: Arc<dyn TextModel>,
    args: Args,
}

impl Bench {
    /// A scheduler as `serve` runs one, speculating or not, for up to `seqs` sequences of
    /// `n_ctx` positions. Each mode keeps one for the whole run, as a server does: the policy's
    /// step times and the drafter's record carry over from request to request.
    fn scheduler(&self, speculate: bool, n_ctx: usize, seqs: usize) -> anyhow::Result<Scheduler> {
        let limits = EngineLimits {
            threads: self.args.threads,
            max_seqs: seqs.max(1),
            kv_budget_tokens: nightshift_model::KvLayout::budget_for(seqs.max(1), n_ctx),
            max_seq_len: 0,
            kv_type: nightshift_model::KvType::F32,
            prefix_cache: false,
            kv_disk: None,
        };
        let backend = Arc::new(nightshift_model::LocalExperts::new(
            self.model.clone(),
            Some(self.pool.clone()),
        ));
        let engine = engine_with(self.model.clone(), backend, self.pool.clone(), &limits)?;
        let spec = if speculate {
            self.args
                .spec
                .build(Some(&self.model), Some(self.pool.clone()))?
        } else {
            None
        };
        let opts = SchedulerOptions {
            queue_capacity: seqs.max(1),
            max_seqs: seqs.max(1),
            prefill_chunk: 512,
            n_ctx,
        };
        Ok(Scheduler::spawn_speculative(
            engine,
            self.text.clone(),
            opts,
            spec,
        )?)
    }

    /// A workload's requests, sent as `send` says; what they measured, summed.
    fn run_workload(&self, jobs: &[Job], send: Send, s: &Scheduler) -> anyhow::Result<Measured> {
        if send == Send::Together {
            return self.run(jobs, s);
        }
        let mut sum = Measured::default();
        for j in jobs {
            sum.add(&self.run(std::slice::from_ref(j), s)?);
        }
        Ok(sum)
    }

    /// Sends `jobs` at once and times their tokens.
    fn run(&self, jobs: &[Job], s: &Scheduler) -> anyhow::Result<Measured> {
        let before = s.step_counts();
        let mut rxs = Vec::new();
        for (i, j) in jobs.iter().enumerate() {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let ok = s.submit(GenRequest {
                id: format!("bench-{i}"),
                prompt: j.prompt.clone(),
                max_tokens: self.args.tokens,
                sampling: SamplerParams::greedy(),
                stop: Vec::new(),
                logprobs: None,
                ignore_eos: true,
                constraint: None,
                cache_prompt: false,
                speculative: true,
                prediction: j.prediction.clone(),
                events: tx,
                enqueued: Instant::now(),
            });
            anyhow::ensure!(ok.is_ok(), "the engine thread is not running");
            rxs.push(rx);
        }
        // each request's events on its own thread, so every token is timed when it comes
        let watchers: Vec<_> = rxs
            .into_iter()
            .map(|mut rx| {
                std::thread::spawn(move || -> anyhow::Result<Timed> {
                    let mut tokens = Vec::new();
                    loop {
                        match rx.blocking_recv() {
                            Some(Event::Token { .. }) => tokens.push(Instant::now()),
                            Some(Event::Done { usage, .. }) => {
                                let done = Instant::now();
                                return Ok(Timed {
                                    tokens,
                                    done,
                                    usage,
                                });
                            }
                            Some(Event::Failed(e)) => {
                                anyhow::bail!("request failed: {}", e.message)
                            }
                            None => anyhow::bail!("the engine thread stopped"),
                        }
                    }
                })
            })
            .collect();
        let mut seqs = Vec::new();
        for w in watchers {
            let got = w
                .join()
                .map_err(|_| anyhow::anyhow!("a request's watcher panicked"))??;
            seqs.push(got);
        }
        let mut m = Measured::default();
        for Timed { usage, .. } in &seqs {
            m.after_first += u64::from(usage.completion_tokens.saturating_sub(1));
            m.accepted += u64::from(usage.accepted_prediction_tokens);
            m.drafted +=
                u64::from(usage.accepted_prediction_tokens + usage.rejected_prediction_tokens);
        }
        (m.decoded, m.secs) = decode_window(&seqs);
        // the engine thread counts a step's end before its finished sequences leave
        let waited = Instant::now();
        while s.in_flight() > 0 && waited.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        m.steps = s.step_counts().since(&before);
        Ok(m)
    }

    /// The greedy continuation of `prompt` (speculation off), as the workloads' requests
    /// decode it: `ignore_eos`, so never an end-of-generation token.
    fn continuation(&self, prompt: &[u32], n: u32) -> anyhow::Result<Vec<u32>> {
        let mut e = Engine::new(
            self.model.clone(),
            Arc::new(nightshift_model::LocalExperts::new(
                self.model.clone(),
                Some(self.pool.clone()),
            )),
            EngineOptions {
                pool: Some(self.pool.clone()),
                prefix_cache: false,
                ..EngineOptions::default()
            },
        )?;
        let s = e.add_sequence()?;
        let mut logits = e.prefill(s, prompt)?;
        let end = EndTokens::of(self.text.as_ref());
        let mut out = Vec::new();
        for _ in 0..n {
            let t = nightshift_model::sampler::argmax(&end.masked(&logits));
            out.push(t);
            logits = e.prefill(s, &[t])?;
        }
        Ok(out)
    }

    /// Median seconds of a step of `rows` rows of one sequence (the drafts rolled back), and
    /// the engine's phase times summed over that row count's steps.
    fn step_curve(
        &self,
        prompt: &[u32],
    ) -> anyhow::Result<Vec<(usize, f64, nightshift_model::StepProfile)>> {
        let backend = Arc::new(nightshift_model::LocalExperts::new(
            self.model.clone(),
            Some(self.pool.clone()),
        ));
        let mut e = Engine::new(
            self.model.clone(),
            backend,
            EngineOptions {
                pool: Some(self.pool.clone()),
                prefix_cache: false,
                ..EngineOptions::default()
            },
        )?;
        let s = e.add_sequence()?;
        e.prefill(s, prompt)?;
        let len = prompt.len();
        let mut rng = SplitMix64::new(5);
        let vocab = self.model.config().n_vocab as u64;
        let mut curve = Vec::new();
        for rows in 1..=self.args.max_rows {
            let mut t = Vec::new();
            e.reset_profile();
            for _ in 0..5 {
                let batch: Vec<BatchToken> = (0..rows)
                    .map(|i| BatchToken {
                        seq: s,
                        token: (rng.next_u64() % vocab) as u32,
                        pos: (len + i) as u32,
                        want_logits: true,
                    })
                    .collect();
                let t0 = Instant::now();
                e.forward_drafts(&batch, &[(s, rows - 1)])?;
                t.push(t0.elapsed().as_secs_f64());
                e.truncate(s, len)?;
            }
            t.sort_by(f64::total_cmp);
            curve.push((rows, t[t.len() / 2], e.profile()));
        }
        Ok(curve)
    }
}

/// The best decode speed-up a step curve (rows, median seconds, ...) allows one sequence whose
/// draft tokens are each accepted with probability `p`, independently, with a draft of any
/// length at every step: k draft tokens emit 1 + p + ... + p^k tokens in a (k + 1)-row step.
/// (draft tokens, ratio to one row per step); what a policy can reach on that workload at most.
fn ceiling<P>(curve: &[(usize, f64, P)], p: f64) -> (usize, f64) {
    let Some(t1) = curve.iter().find(|c| c.0 == 1).map(|c| c.1) else {
        return (0, 1.0);
    };
    curve
        .iter()
        .filter(|c| c.0 >= 1 && c.1 > 0.0)
        .map(|&(rows, t, _)| {
            let tokens: f64 = (0..rows as i32).map(|j| p.powi(j)).sum();
            (rows - 1, tokens * t1 / t)
        })
        .fold((0, 1.0), |best, c| if c.1 > best.1 { c } else { best })
}

/// One request of a run as its watcher saw it: when each token event came, when it ended, and
/// its usage.
struct Timed {
    tokens: Vec<Instant>,
    done: Instant,
    usage: Usage,
}

/// Decoded tokens and seconds of a run's decode window: from the moment every request had its
/// first token (all of them decoding; before it, steps carry prompt chunks, and whether the
/// engine thread's first step held one prompt or all of them is a race with the submitting
/// thread) to the last request's end, counting the tokens that came inside it. A token the end event carries (`completion_tokens`
/// past the token events) counts at the end. One request: its tokens after the first.
fn decode_window(seqs: &[Timed]) -> (u64, f64) {
    let Some(start) = seqs
        .iter()
        .map(|s| s.tokens.first().copied().unwrap_or(s.done))
        .max()
    else {
        return (0, 0.0);
    };
    let end = seqs.iter().map(|s| s.done).max().unwrap_or(start);
    let mut decoded = 0u64;
    for s in seqs {
        decoded += s.tokens.iter().filter(|&&t| t > start).count() as u64;
        if s.done > start {
            let at_end = (s.usage.completion_tokens as usize).saturating_sub(s.tokens.len());
            decoded += at_end as u64;
        }
    }
    (decoded, end.duration_since(start).as_secs_f64())
}

/// `n` distinct token ids (no n-gram repeats), from the ordinary vocabulary.
fn distinct_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed);
    let mut seen = std::collections::HashSet::new();
    let hi = (vocab as u64).saturating_sub(300).max(2);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let t = (rng.next_u64() % hi) as u32 + 1;
        if seen.insert(t) {
            out.push(t);
        }
    }
    out
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let model =
        Model::load(&args.model).with_context(|| format!("loading {}", args.model.display()))?;
    let pool = nightshift_model::build_pool(args.threads)?;
    let text: Arc<dyn TextModel> =
        Arc::new(ModelText::from_model(&model, None).map_err(anyhow::Error::msg)?);
    let vocab = model.config().n_vocab;
    let b = Bench {
        model,
        pool,
        text,
        args,
    };
    let a = &b.args;
    println!(
        "bench spec: {} ({} layers), {} tokens per request, speculative {}",
        a.model.display(),
        b.model.config().n_layer,
        a.tokens,
        a.spec.describe()
    );
    // the honest workloads: built from the model's own greedy output
    let mut quoting = Vec::new();
    let mut predicted = Vec::new();
    let mut rng = SplitMix64::new(70);
    let mut continuations = Vec::new();
    for k in 0..4u64 {
        let p = distinct_tokens(a.prompt_tokens, vocab, 100 + k);
        let c = b.continuation(&p, a.tokens + 1)?;
        let mut q = p.clone();
        q.extend_from_slice(&c);
        q.extend_from_slice(&p);
        quoting.push(Job {
            prompt: q,
            prediction: Vec::new(),
        });
        predicted.push(Job {
            prompt: p.clone(),
            prediction: c.clone(),
        });
        continuations.push((p, c));
    }
    // one noisy prediction per level, each token replaced with the level's probability
    let noisy: Vec<(String, Job)> = a
        .noise
        .iter()
        .map(|&pct| {
            let (p, c) = &continuations[0];
            let prediction = c
                .iter()
                .map(|&t| {
                    if rng.next_u64() % 100 < u64::from(pct) {
                        (t + 1 + (rng.next_u64() % 100) as u32) % vocab as u32
                    } else {
                        t
                    }
                })
                .collect();
            let job = Job {
                prompt: p.clone(),
                prediction,
            };
            (format!("noisy {pct}%"), job)
        })
        .collect();
    let no_overlap = vec![Job {
        prompt: distinct_tokens(a.prompt_tokens * 2, vocab, 7),
        prediction: Vec::new(),
    }];
    let four: Vec<Job> = quoting
        .iter()
        .map(|j| Job {
            prompt: j.prompt.clone(),
            prediction: Vec::new(),
        })
        .collect();
    let first = |v: &Vec<Job>| {
        vec![Job {
            prompt: v[0].prompt.clone(),
            prediction: v[0].prediction.clone(),
        }]
    };
    let one = Send::OneAtATime;
    let curve_prompt = quoting[0].prompt.clone();
    let mut workloads: Vec<(String, Vec<Job>, Send)> = vec![
        ("quoting".into(), quoting, one),
        ("predicted".into(), first(&predicted), one),
    ];
    workloads.extend(noisy.into_iter().map(|(name, job)| (name, vec![job], one)));
    workloads.push(("no-overlap".into(), no_overlap, one));
    workloads.push(("4 sessions".into(), four, Send::Together));
    if !a.only.is_empty() {
        workloads.retain(|(name, _, _)| a.only.iter().any(|o| name.starts_with(o.as_str())));
        anyhow::ensure!(
            !workloads.is_empty(),
            "--only: expected workload names (quoting, predicted, noisy, no-overlap, 4 sessions), found {:?}",
            a.only
        );
    }
    println!(
        "{:<11} {:>10} {:>9} {:>12} {:>12} {:>15}",
        "workload", "accepted", "tok/step", "off tok/s", "spec tok/s", "ratio (range)"
    );
    // one scheduler per mode for the whole run (a server's), sized for the largest workload
    let n_ctx = workloads
        .iter()
        .flat_map(|(_, jobs, _)| jobs.iter().map(|j| j.prompt.len()))
        .max()
        .unwrap_or(0)
        + a.tokens as usize
        + 1;
    let seqs = workloads
        .iter()
        .map(|(_, j, send)| if *send == Send::Together { j.len() } else { 1 })
        .max()
        .unwrap_or(1);
    let off_s = b.scheduler(false, n_ctx, seqs)?;
    let on_s = b.scheduler(true, n_ctx, seqs)?;
    let mut spent = Vec::new();
    for (name, jobs, send) in &workloads {
        let mut ratios = Vec::new();
        let (mut off_sum, mut on_sum) = (Measured::default(), Measured::default());
        for round in 0..a.rounds {
            // alternate which runs first, so drift hits both alike
            let (off, on) = if round % 2 == 0 {
                let off = b.run_workload(jobs, *send, &off_s)?;
                (off, b.run_workload(jobs, *send, &on_s)?)
            } else {
                let on = b.run_workload(jobs, *send, &on_s)?;
                (b.run_workload(jobs, *send, &off_s)?, on)
            };
            ratios.push(on.tok_s() / off.tok_s().max(1e-9));
            off_sum.add(&off);
            on_sum.add(&on);
        }
        ratios.sort_by(f64::total_cmp);
        let acc = if on_sum.drafted > 0 {
            format!(
                "{:.1}%",
                100.0 * on_sum.accepted as f64 / on_sum.drafted as f64
            )
        } else {
            "no drafts".into()
        };
        // tokens per verification step (of a sequence): each emits one token plus its accepted
        // drafts; counted over whole requests, as the acceptance is
        let per_step = if on_sum.after_first > on_sum.accepted {
            on_sum.after_first as f64 / (on_sum.after_first - on_sum.accepted) as f64
        } else {
            1.0
        };
        println!(
            "{:<11} {:>10} {:>9.2} {:>12.2} {:>12.2} {:>6.2}x ({:.2}-{:.2})",
            name,
            acc,
            per_step,
            off_sum.tok_s(),
            on_sum.tok_s(),
            on_sum.tok_s() / off_sum.tok_s().max(1e-9),
            ratios[0],
            ratios[ratios.len() - 1]
        );
        spent.push((name.clone(), off_sum, on_sum));
    }
    println!("where the time went (engine steps over all rounds, off -> spec; per step):");
    println!(
        "{:<11} {:>11} {:>6} {:>6} {:>6} {:>9} {:>13} {:>13} {:>13}",
        "workload",
        "steps",
        "draft",
        "rows",
        "kept",
        "draft us",
        "plain ms",
        "forward ms",
        "rest ms"
    );
    for (name, off, on) in &spent {
        let (o, n) = (off.steps, on.steps);
        let per = |x: u64, steps: u64| x as f64 / steps.max(1) as f64;
        let ms = |x: u64, steps: u64| per(x, steps) / 1e6;
        println!(
            "{:<11} {:>5}->{:<5} {:>6} {:>6.2} {:>6.2} {:>9.1} {:>6.2}->{:<6.2} {:>6.2}->{:<6.2} {:>6.3}->{:<6.3}",
            name,
            o.steps,
            n.steps,
            n.draft_steps,
            per(n.draft_rows, n.draft_steps),
            per(n.accepted, n.draft_steps),
            per(n.drafting_nanos, n.steps) / 1e3,
            ms(o.plain_nanos, o.plain_steps),
            ms(n.plain_nanos, n.plain_steps),
            ms(o.forward_nanos, o.steps),
            ms(n.forward_nanos, n.steps),
            ms(o.step_nanos - o.forward_nanos.min(o.step_nanos), o.steps),
            ms(n.step_nanos - n.forward_nanos.min(n.step_nanos), n.steps),
        );
    }
    println!(
        "  (draft: steps with drafts; rows, kept: draft rows and accepted drafts per such step; \
         plain: decode steps without drafts or prefill; rest: a step's time outside forward)"
    );
    println!(
        "step time by rows of one sequence (median of 5; phases: mean ms per step of attention, \
         router, routed experts, other FFN, output head, the rest)"
    );
    let curve = b.step_curve(&curve_prompt)?;
    let t1 = curve.first().map_or(1.0, |c| c.1);
    let ceilings: Vec<String> = [0.7, 0.9, 1.0]
        .iter()
        .map(|&p| {
            let (k, x) = ceiling(&curve, p);
            format!("p {:.0}%: {x:.2}x at {k} draft tokens", 100.0 * p)
        })
        .collect();
    println!(
        "  ceiling (one sequence, a draft at every step, each draft token accepted with \
         probability p independently): {}",
        ceilings.join(", ")
    );
    for (rows, t, p) in curve {
        let per = |x: f64| x * 1e3 / p.steps.max(1) as f64;
        println!(
            "  {rows:>3} rows: {:>8.2} ms  ({:.2}x one row)   attn {:.2}  router {:.2}  \
             experts {:.2}  ffn {:.2}  head {:.2}  rest {:.2}",
            t * 1e3,
            t / t1.max(1e-12),
            per(p.attention),
            per(p.router),
            per(p.experts),
            per(p.ffn_other),
            per(p.output),
            per(p.other()),
        );
    }
    Ok(())
}

#[cfg(test)]
#[path = "../../../model/tests/fixture_util/locate.rs"]
mod locate;

#[cfg(test)]
mod tests {
    use super::{ceiling, decode_window, Args, Bench, Timed, Usage};
    use crate::scheduler::mock::MockText;
    use crate::scheduler::{ChatPrompt, TextModel};
    use clap::Parser;
    use nightshift_model::Model;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// The toy text with one end-of-generation token of the model's vocabulary.
    struct OneEnd {
        end: u32,
        vocab: usize,
    }

    impl TextModel for OneEnd {
        fn render_chat(&self, prompt: &ChatPrompt) -> Result<String, String> {
            MockText.render_chat(prompt)
        }
        fn encode(&self, text: &str, chat: bool) -> Vec<u32> {
            MockText.encode(text, chat)
        }
        fn token_bytes(&self, _id: u32) -> Vec<u8> {
            Vec::new()
        }
        fn max_token_bytes(&self) -> usize {
            1
        }
        fn is_eog(&self, id: u32) -> bool {
            id == self.end
        }
        fn vocab_size(&self) -> usize {
            self.vocab
        }
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn a_workload_is_built_from_what_its_requests_decode_never_an_end_token() {
        // the requests run with `ignore_eos`: a continuation holding an end token is a quote or
        // a prediction they never follow (an end token a random model put second made one of
        // the four quoting prompts fail from its second token)
        let path = super::locate::fixture_path("tiny-qwen3moe-Q2_K.gguf");
        let model = Model::load(&path).expect("fixture loads");
        let vocab = model.config().n_vocab;
        let bench = |end: u32| Bench {
            model: model.clone(),
            pool: nightshift_model::build_pool(1).expect("pool"),
            text: Arc::new(OneEnd { end, vocab }),
            args: Cli::parse_from(["spec", "--model", path.to_str().expect("utf-8")]).args,
        };
        let prompt = super::distinct_tokens(12, vocab, 5);
        let free = bench(u32::MAX).continuation(&prompt, 6).expect("decodes");
        // the model's own first choice declared the end token: it is never taken, the first
        // token is the next best and the rest follow from it
        let ended = bench(free[0]).continuation(&prompt, 6).expect("decodes");
        assert_ne!(ended[0], free[0], "{free:?} {ended:?}");
        assert!(!ended.contains(&free[0]), "{ended:?}");
        // with no end token in the way, the same continuation as before
        let other = free.iter().copied().max().expect("tokens") + 1;
        assert_eq!(
            bench(other).continuation(&prompt, 6).expect("decodes"),
            free
        );
    }

    #[test]
    fn the_decode_window_starts_when_every_request_decodes() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let timed = |tokens: Vec<Instant>, done, completion_tokens| Timed {
            tokens,
            done,
            usage: Usage {
                prompt_tokens: 8,
                completion_tokens,
                cached_tokens: 0,
                accepted_prediction_tokens: 0,
                rejected_prediction_tokens: 0,
            },
        };
        // one request: its tokens after the first, first token to end
        let one = [timed(vec![at(1), at(2), at(3)], at(3), 3)];
        assert_eq!(decode_window(&one), (2, 2.0));
        // a token carried by the end event counts at the end
        let carried = [timed(vec![at(1), at(2), at(3)], at(4), 4)];
        assert_eq!(decode_window(&carried), (3, 3.0));
        // two requests, the second prefilled after the first decoded two tokens: the window
        // starts at the second's first token and counts what both decode after it
        let two = [
            timed(vec![at(0), at(1), at(2), at(3)], at(3), 4),
            timed(vec![at(2), at(3), at(4), at(5)], at(5), 4),
        ];
        assert_eq!(decode_window(&two), (4, 3.0));
        assert_eq!(decode_window(&[]), (0, 0.0));
    }

    #[test]
    fn the_ceiling_is_the_best_draft_length_on_the_curve() {
        // the uniformly routed 30B shape: a second row costs 0.84 of a step, so at 70%
        // acceptance no draft pays; at 100% the longest does
        let q3 = [(1, 1.0, ()), (2, 1.84, ()), (3, 2.45, ()), (4, 2.82, ())];
        assert_eq!(ceiling(&q3, 0.7), (0, 1.0));
        let (k, x) = ceiling(&q3, 1.0);
        assert_eq!(k, 3);
        assert!((x - 4.0 / 2.82).abs() < 1e-12, "{x}");
        // the Kimi-K2 shape: 2 rows 1.35x, 3 rows 1.80x: one token (1.7 / 1.35) beats two
        // (2.19 / 1.80)
        let k2 = [(1, 0.040, ()), (2, 0.054, ()), (3, 0.072, ())];
        let (k, x) = ceiling(&k2, 0.7);
        assert_eq!(k, 1);
        assert!((x - 1.7 * 0.040 / 0.054).abs() < 1e-12, "{x}");
        assert_eq!(ceiling::<()>(&[], 0.7), (0, 1.0));
    }
}
