//! The second pass of `gen-model --routing-skew published`: measure what the generated file's
//! router inputs actually carry, then write routers (and deepseek2's `exp_probs_b`) whose logits
//! have the variance shares `skew_model` derives from the published statistics.
//!
//! The first pass (`skew.rs`) builds the residual stream's parts: a constant channel 0, a topic
//! state on channels `1..=m` written by layer 0's attention, the token's own channels after
//! them. What the topic state looks like on real text is not known in advance: the generated
//! vocabulary is mostly single bytes, so every prompt holds nearly the same tokens and a large
//! part of the topic is common to all sequences (routers drawn against it were skewed far past
//! the target: a shared topic acts as a static bias). So this pass runs the file's own engine
//! over [`PROMPTS`](super::calib_prompts::PROMPTS) (chat-rendered, prefill then [`DECODE`] greedy tokens; a set apart from
//! `atlas/prompts/routing.jsonl`, which measures the result) and captures every MoE layer's
//! router input. Per layer it measures the topic channels' mean `mu` and covariance `Sigma`,
//! the token channels' RMS and channel 0's mean, and the whitened topic `w = L^-1 (T - mu)`'s
//! autocorrelation `rho_j` between positions `j` apart in a sequence, where `L L^T = Sigma +
//! ridge`: whitening alone weighs the small directions that flicker from token to token like the
//! big persistent ones, so the least ridge (in steps of 10x) whose `rho_1` reaches the
//! previous-token target is taken.
//! [`skew_model::derive`] turns the targets and `rho_1` into shares (static, topic, token), and
//! `skew_fit` corrects them by simulating top-k routing on the captured inputs themselves (the
//! Gaussian model misses the previous-token overlap of a topic that moves in jumps); the
//! router row of expert `e` is then, with fresh seeded draws `g_s`, `g_t`, `g_x`,
//!
//! `logit = S (sqrt(static) g_s + sqrt(topic) g_t . w / sqrt(m) + sqrt(token) g_x . x / (sqrt(n_x) rms_x))`
//!
//! written as weights: `S sqrt(topic)/sqrt(m) L^-T g_t` on the topic channels, the token part on
//! the rest, and on channel 0 the static part minus the topic weights' product with `mu` (the
//! common topic cancelled), divided by channel 0's mean. deepseek2 selects on
//! `sigmoid(logit) + exp_probs_b`: its static part goes to `exp_probs_b` times the sigmoid's
//! slope at 0 (1/4) instead. Routing never feeds back into layer 0's topic state, but it does
//! change the tokens a random-weight model then decodes (greedy continuations loop, and the
//! loops depend on the routers): fitted on the first pass's inputs (the uncalibrated routers'
//! tokens), the written routers recorded a previous-token overlap 4-7 points above the target
//! on unseen prompts. So a second pass reruns the calibrated file on
//! [`CHECK_PROMPTS`](super::calib_prompts::CHECK_PROMPTS) (new prompts, the routers' own
//! tokens), measures what the written shares do there (`checked`) and fits the shares again on
//! those inputs, starting from the first fit (the same router draws, re-weighted: the routers
//! move less the second time, so their tokens do too).

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use rayon::ThreadPool;

use super::calib_prompts::{CHECK_PROMPTS, PROMPTS};
use super::rng::{row_rng, tensor_seed};
use super::skew_fit::{fit, Parts, Simulated};
use super::skew_model::{derive, Derived, Shares, PUBLISHED};
use super::{Arch, GenError};
use crate::chat::{encode_conversation, ChatMessage, ChatTemplate};
use crate::engine::{build_pool, Engine, EngineOptions};
use crate::error::ExpertError;
use crate::expert::{ActRows, ExpertBackend, ExpertPair, LocalExperts};
use crate::gguf::Gguf;
use crate::model::Model;
use crate::sampler::argmax;

/// Greedy tokens decoded after each calibration prompt: as many as `nightshift-atlas record`
/// decodes by default (`--max-tokens 32`), because generated tokens route differently from a
/// prompt's (a random-weight model's greedy continuation repeats itself, so its topic is more
/// persistent): calibrating on prompts and 8 tokens measured rho1 0.64 where the recording then
/// showed a previous-token overlap of 54%.
pub const DECODE: usize = 31;

/// Lags of the topic autocorrelation measured (within-8 uses all of them).
const LAGS: usize = 8;

/// What the pass found for one MoE layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerCalibration {
    pub layer: usize,
    /// router inputs measured
    pub rows: usize,
    /// autocorrelation of the whitened topic at lags 1..=8
    pub rho: [f64; LAGS],
    /// ridge of the whitening, in units of the topic's mean variance
    pub ridge: f64,
    /// share of the topic channels' energy common to all sequences (|mu|^2 / E|T|^2): what
    /// routers drawn without this pass would have taken as a static bias
    pub common: f64,
    /// the Gaussian model's answer (`skew_model`)
    pub derived: Derived,
    /// the first pass's fit (`skew_fit`): its shares and their routing on its inputs
    pub first: (Shares, Simulated),
    /// the first fit's routers on the second pass's inputs (new prompts, their own tokens)
    pub checked: Simulated,
    /// the shares written: fitted again on the second pass's inputs
    pub shares: Shares,
    /// the written shares' routing on the second pass's inputs
    pub simulated: Simulated,
}

/// The calibration of a whole file.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    pub layers: Vec<LayerCalibration>,
}

impl Calibration {
    /// One line per layer, for `gen-model`'s output.
    pub fn summary(&self) -> String {
        let mut s = String::from(
            "routers calibrated in two passes (variance shares of a logit written: static / topic / token; the topic's lag-1 autocorrelation; its part common to all prompts; the first pass's fit, its routers on the second pass's new prompts, and the refit there):\n",
        );
        for l in &self.layers {
            let sh = &l.shares;
            let off = (l.simulated.lag1 - PUBLISHED.lag1).abs() > 0.05
                || (l.simulated.coverage50 - PUBLISHED.coverage50).abs() > 0.05;
            s.push_str(&format!(
                "  layer {:>3}: {:.3} / {:.3} / {:.3}  rho1 {:.2} (ridge {})  common {:.0}%  first fit: previous token {:.1}%, on new prompts {:.1}% (hottest half {:.1}% -> {:.1}%); refitted there: hottest half {:.1}%, previous token {:.1}%, within 8 {:.1}%{}\n",
                l.layer,
                sh.static_,
                sh.topic,
                sh.token,
                l.rho[0],
                l.ridge,
                100.0 * l.common,
                100.0 * l.first.1.lag1,
                100.0 * l.checked.lag1,
                100.0 * l.first.1.coverage50,
                100.0 * l.checked.coverage50,
                100.0 * l.simulated.coverage50,
                100.0 * l.simulated.lag1,
                100.0 * l.simulated.within8,
                if off {
                    "  (no shares reach the targets on these inputs)"
                } else {
                    ""
                }
            ));
        }
        s
    }
}

/// Router inputs captured for one MoE layer.
#[derive(Default)]
struct Captured {
    seq: Vec<u32>,
    c0: Vec<f64>,
    /// rows x m topic channels
    topic: Vec<f64>,
    rest_sq: f64,
    rest_n: u64,
    /// rows x embd: the whole router inputs, for the empirical refinement (`refine`)
    rows: Vec<f32>,
}

/// The file's own expert backend, capturing every MoE layer's router inputs on the way.
struct Capture {
    inner: LocalExperts,
    embd: usize,
    m: usize,
    seq: AtomicU32,
    layers: Mutex<BTreeMap<usize, Captured>>,
}

impl ExpertBackend for Capture {
    fn run_experts(
        &self,
        layer: usize,
        acts: &ActRows,
        pairs: &[ExpertPair],
        out: &mut [f32],
    ) -> Result<(), ExpertError> {
        let h = acts.to_f32(self.embd)?;
        {
            let seq = self.seq.load(Ordering::Relaxed);
            let mut g = self.layers.lock().unwrap_or_else(|p| p.into_inner());
            let c = g.entry(layer).or_default();
            for row in h.chunks_exact(self.embd) {
                c.seq.push(seq);
                c.c0.push(f64::from(row[0]));
                c.topic
                    .extend(row[1..=self.m].iter().map(|&x| f64::from(x)));
                c.rest_sq += row[self.m + 1..]
                    .iter()
                    .map(|&x| f64::from(x) * f64::from(x))
                    .sum::<f64>();
                c.rest_n += (self.embd - self.m - 1) as u64;
                c.rows.extend_from_slice(row);
            }
        }
        self.inner.run_experts(layer, acts, pairs, out)
    }

    fn computes_on(&self, pool: &ThreadPool) -> bool {
        self.inner.computes_on(pool)
    }
}

/// Lower Cholesky factor of the `m x m` symmetric positive definite `a` (row-major).
fn cholesky(a: &[f64], m: usize) -> Option<Vec<f64>> {
    let mut l = vec![0.0; m * m];
    for i in 0..m {
        for j in 0..=i {
            let s: f64 = (0..j).map(|k| l[i * m + k] * l[j * m + k]).sum();
            if i == j {
                let d = a[i * m + i] - s;
                if d <= 0.0 || !d.is_finite() {
                    return None;
                }
                l[i * m + i] = d.sqrt();
            } else {
                l[i * m + j] = (a[i * m + j] - s) / l[j * m + j];
            }
        }
    }
    Some(l)
}

/// Solves `L x = b` (forward substitution).
fn solve_lower(l: &[f64], b: &[f64]) -> Vec<f64> {
    let m = b.len();
    let mut x = vec![0.0; m];
    for i in 0..m {
        let s: f64 = (0..i).map(|k| l[i * m + k] * x[k]).sum();
        x[i] = (b[i] - s) / l[i * m + i];
    }
    x
}

/// Solves `L^T x = b` (back substitution).
fn solve_upper_t(l: &[f64], b: &[f64]) -> Vec<f64> {
    let m = b.len();
    let mut x = vec![0.0; m];
    for i in (0..m).rev() {
        let s: f64 = (i + 1..m).map(|k| l[k * m + i] * x[k]).sum();
        x[i] = (b[i] - s) / l[i * m + i];
    }
    x
}

/// The measured statistics of one layer's router inputs (module doc).
struct LayerStats {
    rows: usize,
    c0: f64,
    mu: Vec<f64>,
    chol: Vec<f64>,
    rest_rms: f64,
    rho: [f64; LAGS],
    /// mean square of a whitened topic channel (1 without a ridge, less with one)
    wvar: f64,
    /// the ridge taken, in units of the mean variance
    ridge: f64,
    common: f64,
}

/// Ridges tried when whitening the topic (module doc), smallest first.
const RIDGES: [f64; 6] = [1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0];

/// Autocorrelation at lags 1..=8, within sequences, of the topic whitened by `chol` around `mu`.
fn autocorrelation(c: &Captured, m: usize, mu: &[f64], chol: &[f64]) -> ([f64; LAGS], f64) {
    let n = c.seq.len();
    let w: Vec<Vec<f64>> = c
        .topic
        .chunks_exact(m)
        .map(|row| {
            let d: Vec<f64> = row.iter().zip(mu).map(|(x, u)| x - u).collect();
            solve_lower(chol, &d)
        })
        .collect();
    // normalised by the whitened variance (below 1 per direction once a ridge is added)
    let var = w
        .iter()
        .map(|x| x.iter().map(|v| v * v).sum::<f64>())
        .sum::<f64>()
        / n.max(1) as f64;
    let mut rho = [0.0; LAGS];
    for (j, r) in rho.iter_mut().enumerate() {
        let lag = j + 1;
        let (mut s, mut k) = (0.0, 0usize);
        for i in lag..n {
            if c.seq[i] == c.seq[i - lag] {
                s += w[i]
                    .iter()
                    .zip(&w[i - lag])
                    .map(|(a, b)| a * b)
                    .sum::<f64>();
                k += 1;
            }
        }
        *r = if k > 0 && var > 0.0 {
            s / k as f64 / var
        } else {
            0.0
        };
    }
    (rho, var / m as f64)
}

fn layer_stats(
    layer: usize,
    c: &Captured,
    m: usize,
    enough: &dyn Fn(f64, f64) -> bool,
) -> Result<LayerStats, GenError> {
    let n = c.seq.len();
    let fail = |what: &str| GenError::Calibrate(format!("layer {layer}: {what}"));
    if n < 4 * m {
        return Err(fail(&format!(
            "expected at least {} router inputs to measure, found {n}",
            4 * m
        )));
    }
    let nf = n as f64;
    let c0 = c.c0.iter().sum::<f64>() / nf;
    if c0.abs() < 1e-3 {
        return Err(fail(&format!(
            "expected the constant channel 0 in the router inputs, found a mean of {c0}"
        )));
    }
    let mut mu = vec![0.0; m];
    for row in c.topic.chunks_exact(m) {
        for (a, x) in mu.iter_mut().zip(row) {
            *a += x / nf;
        }
    }
    let mut cov = vec![0.0; m * m];
    let mut energy = 0.0;
    for row in c.topic.chunks_exact(m) {
        energy += row.iter().map(|x| x * x).sum::<f64>() / nf;
        for i in 0..m {
            let di = row[i] - mu[i];
            for j in 0..=i {
                cov[i * m + j] += di * (row[j] - mu[j]) / nf;
            }
        }
    }
    for i in 0..m {
        for j in 0..i {
            cov[j * m + i] = cov[i * m + j];
        }
    }
    let trace: f64 = (0..m).map(|i| cov[i * m + i]).sum();
    if trace <= 0.0 || !trace.is_finite() {
        return Err(fail(
            "expected the topic channels to vary, found them constant",
        ));
    }
    // Whitening with a ridge of `alpha` x the mean variance: small alphas weigh every direction
    // of the topic alike, including the small ones that flicker from token to token; large ones
    // keep the big, persistent directions. The least ridge whose topic is persistent enough for
    // the targets (`enough(rho_1, mean rho_1..8)`) is taken, else the most persistent.
    let mut best: Option<(Vec<f64>, [f64; LAGS], f64, f64)> = None;
    for alpha in RIDGES {
        let mut reg = cov.clone();
        for i in 0..m {
            reg[i * m + i] += alpha * trace / m as f64;
        }
        let chol =
            cholesky(&reg, m).ok_or_else(|| fail("topic covariance is not positive definite"))?;
        let (rho, wvar) = autocorrelation(c, m, &mu, &chol);
        let ok = enough(rho[0], rho.iter().sum::<f64>() / LAGS as f64);
        if ok || best.as_ref().is_none_or(|b| rho[0] > b.1[0]) {
            best = Some((chol, rho, wvar, alpha));
        }
        if ok {
            break;
        }
    }
    let (chol, rho, wvar, ridge) = best.ok_or_else(|| fail("no ridge to try"))?;
    let rest_rms = (c.rest_sq / c.rest_n.max(1) as f64).sqrt();
    if rest_rms <= 0.0 || !rest_rms.is_finite() {
        return Err(fail("expected the token channels to vary, found them zero"));
    }
    let common = mu.iter().map(|x| x * x).sum::<f64>() / energy.max(f64::MIN_POSITIVE);
    Ok(LayerStats {
        rows: n,
        c0,
        mu,
        chol,
        rest_rms,
        rho,
        wvar,
        ridge,
        common,
    })
}

/// Runs `prompts` through the file's engine and returns the captured router inputs.
fn measure(
    path: &Path,
    m: usize,
    prompts: &[&str],
) -> Result<(Arc<Model>, BTreeMap<usize, Captured>), GenError> {
    let err = |what: &str, e: &dyn std::fmt::Display| GenError::Calibrate(format!("{what}: {e}"));
    let model = Model::load(path).map_err(|e| err("loading the generated file", &e))?;
    let pool = build_pool(0).map_err(|e| err("thread pool", &e))?;
    let capture = Arc::new(Capture {
        inner: LocalExperts::new(model.clone(), Some(pool.clone())),
        embd: model.config().n_embd,
        m,
        seq: AtomicU32::new(0),
        layers: Mutex::new(BTreeMap::new()),
    });
    let opts = EngineOptions {
        pool: Some(pool),
        prefix_cache: false,
        ..EngineOptions::default()
    };
    let mut engine = Engine::new(model.clone(), capture.clone(), opts)
        .map_err(|e| err("starting the engine", &e))?;
    let tok = model.tokenizer();
    let template =
        ChatTemplate::from_gguf(model.gguf()).map_err(|e| err("reading the chat template", &e))?;
    for (i, p) in prompts.iter().enumerate() {
        capture.seq.store(i as u32, Ordering::Relaxed);
        let ids = encode_conversation(tok, template.as_ref(), &[ChatMessage::new("user", *p)])
            .map_err(|e| err("rendering a prompt", &e))?;
        let seq = engine
            .add_sequence()
            .map_err(|e| err("adding a sequence", &e))?;
        let mut logits = engine.prefill(seq, &ids).map_err(|e| err("prefill", &e))?;
        for _ in 0..DECODE {
            let next = argmax(&logits);
            if tok.is_eog(next) {
                break;
            }
            logits = engine
                .prefill(seq, &[next])
                .map_err(|e| err("decode", &e))?;
        }
        engine.remove_sequence(seq);
    }
    drop(engine);
    let layers = std::mem::take(&mut *capture.layers.lock().unwrap_or_else(|p| p.into_inner()));
    Ok((model, layers))
}

/// Little-endian f32 bytes of `v`.
fn f32_bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect()
}

/// Where tensor `name` lives in the (single) file and its length in floats; it must be F32.
fn f32_tensor(g: &Gguf, name: &str) -> Result<(u64, usize), GenError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| GenError::Calibrate(format!("expected tensor {name}, found none")))?;
    if t.ty != nightshift_kernels::GgmlType::F32 || t.shard() != 0 {
        return Err(GenError::Calibrate(format!(
            "expected {name} as F32 in the first file, found {}",
            t.ty.name()
        )));
    }
    Ok((t.offset(), (t.size() / 4) as usize))
}

/// One layer's router drawn at unit variance shares (module doc): the expert rows of each part
/// (static, topic, token), which the fitted shares then weigh (`combine`).
struct UnitRouter {
    n: usize,
    embd: usize,
    /// n x embd each
    static_: Vec<f64>,
    topic: Vec<f64>,
    token: Vec<f64>,
    /// deepseek2: the static part as a selection bias per expert (else zeros)
    bias: Option<Vec<f64>>,
}

impl UnitRouter {
    /// The three parts of layer `name`'s router for the measured `st`, drawn from `seed` (the
    /// same draws whatever the shares: each part scales by the square root of its share).
    #[allow(clippy::too_many_arguments)]
    fn draw(
        st: &LayerStats,
        sigmoid_bias: bool,
        n: usize,
        embd: usize,
        m: usize,
        scale: f64,
        seed: u64,
        name: &str,
    ) -> UnitRouter {
        let rest = embd - m - 1;
        let tseed = tensor_seed(seed, &format!("{name}#calibrated"));
        let mut u = UnitRouter {
            n,
            embd,
            static_: vec![0.0; n * embd],
            topic: vec![0.0; n * embd],
            token: vec![0.0; n * embd],
            bias: sigmoid_bias.then(|| vec![0.0; n]),
        };
        let gain_t = scale / (m as f64 * st.wvar).sqrt();
        let gain_x = scale / ((rest as f64).sqrt() * st.rest_rms);
        for e in 0..n {
            let mut r = row_rng(tseed, e as u64);
            let g_s = f64::from(r.gaussian());
            let g_t: Vec<f64> = (0..m).map(|_| f64::from(r.gaussian())).collect();
            let row = e * embd..(e + 1) * embd;
            let topic = &mut u.topic[row.clone()];
            for (w, t) in topic[1..=m].iter_mut().zip(solve_upper_t(&st.chol, &g_t)) {
                *w = gain_t * t;
            }
            // the topic common to all prompts cancelled on the constant channel
            let common: f64 = topic[1..=m].iter().zip(&st.mu).map(|(w, u)| w * u).sum();
            topic[0] = -common / st.c0;
            for w in &mut u.token[row.start + m + 1..row.end] {
                *w = gain_x * f64::from(r.gaussian());
            }
            match &mut u.bias {
                // sigmoid'(0) = 1/4: the selection moves as a logit of 4x this would
                Some(b) => b[e] = scale * g_s / 4.0,
                None => u.static_[row.start] = scale * g_s / st.c0,
            }
        }
        u
    }

    /// Each captured row's three logit parts for every expert (deepseek2's static part is its
    /// bias, the same on every row).
    fn parts(&self, cap: &Captured, k: usize, m: usize) -> Parts {
        use rayon::prelude::*;
        let (n, embd) = (self.n, self.embd);
        let rows = cap.seq.len();
        let mut p = Parts {
            experts: n,
            k,
            seq: cap.seq.clone(),
            static_: vec![0.0; rows * n],
            topic: vec![0.0; rows * n],
            token: vec![0.0; rows * n],
            sigmoid_bias: self.bias.is_some(),
        };
        let dot =
            |w: &[f64], h: &[f32]| -> f64 { w.iter().zip(h).map(|(a, &b)| a * f64::from(b)).sum() };
        // each part lives on its own channels: static on channel 0, topic on 0..=m, token after
        p.static_
            .par_chunks_mut(n)
            .zip(p.topic.par_chunks_mut(n))
            .zip(p.token.par_chunks_mut(n))
            .zip(cap.rows.par_chunks(embd))
            .for_each(|(((ps, pt), px), h)| {
                for e in 0..n {
                    let w = e * embd;
                    ps[e] = match &self.bias {
                        Some(b) => b[e],
                        None => self.static_[w] * f64::from(h[0]),
                    };
                    pt[e] = dot(&self.topic[w..w + m + 1], &h[..=m]);
                    px[e] = dot(&self.token[w + m + 1..w + embd], &h[m + 1..]);
                }
            });
        p
    }

    /// The router rows (n x embd) and deepseek2's bias for `shares`.
    fn combine(&self, shares: &Shares) -> (Vec<f64>, Option<Vec<f64>>) {
        let (s, t, x) = (
            shares.static_.sqrt(),
            shares.topic.sqrt(),
            shares.token.sqrt(),
        );
        let rows = self
            .static_
            .iter()
            .zip(&self.topic)
            .zip(&self.token)
            .map(|((a, b), c)| s * a + t * b + x * c)
            .collect();
        let bias = self
            .bias
            .as_ref()
            .map(|b| b.iter().map(|v| s * v).collect());
        (rows, bias)
    }
}

/// Writes `writes` (offset, bytes) into the file at `path` and syncs it.
fn write_at(path: &Path, writes: &[(u64, Vec<u8>)]) -> Result<(), GenError> {
    let file_err = |source| GenError::File {
        path: path.to_path_buf(),
        source,
    };
    let mut f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(file_err)?;
    for (off, bytes) in writes {
        f.seek(SeekFrom::Start(*off)).map_err(file_err)?;
        f.write_all(bytes).map_err(file_err)?;
    }
    f.sync_all().map_err(file_err)
}

/// One layer's router between the passes: where it is written, its unit draws, the first fit.
struct Pending {
    layer: usize,
    router_at: u64,
    bias_at: Option<u64>,
    unit: UnitRouter,
    st: LayerStats,
    derived: Derived,
    first: (Shares, Simulated),
}

impl Pending {
    /// The router (and bias) bytes for `shares`, as (offset, bytes) writes.
    fn writes(&self, shares: &Shares) -> Vec<(u64, Vec<u8>)> {
        let (rows, bias) = self.unit.combine(shares);
        let mut w = vec![(self.router_at, f32_bytes(&rows))];
        if let (Some(boff), Some(b)) = (self.bias_at, bias) {
            w.push((boff, f32_bytes(&b)));
        }
        w
    }
}

/// Calibrates the routers of the generated file at `path` in place (module doc): `arch`, `m`
/// topic channels, logits of total spread `scale`, draws from `seed`. Two measuring passes:
/// the first fits the shares on [`PROMPTS`] and writes them, the second reruns the file on
/// [`CHECK_PROMPTS`] and fits again on what those routers do there.
pub fn calibrate(
    path: &Path,
    arch: Arch,
    m: usize,
    scale: f64,
    seed: u64,
) -> Result<Calibration, GenError> {
    let (model, captured) = measure(path, m, &PROMPTS)?;
    let c = model.config();
    let (embd, n, k) = (c.n_embd, c.n_expert, c.n_expert_used);
    let mut pending = Vec::new();
    for (&layer, cap) in &captured {
        let enough = |rho1: f64, rho8: f64| derive(&PUBLISHED, k, n, rho1, rho8).feasible;
        let st = layer_stats(layer, cap, m, &enough)?;
        let rho8 = st.rho.iter().sum::<f64>() / LAGS as f64;
        let name = format!("blk.{layer}.ffn_gate_inp.weight");
        let (router_at, len) = f32_tensor(model.gguf(), &name)?;
        if len != n * embd {
            return Err(GenError::Calibrate(format!(
                "expected {name} of {n} x {embd}, found {len} floats"
            )));
        }
        let bias_at = match arch {
            Arch::Deepseek2 => {
                let b = format!("blk.{layer}.exp_probs_b.bias");
                let (boff, blen) = f32_tensor(model.gguf(), &b)?;
                if blen != n {
                    return Err(GenError::Calibrate(format!(
                        "expected {b} of {n}, found {blen} floats"
                    )));
                }
                Some(boff)
            }
            Arch::Qwen3Moe | Arch::Qwen3 | Arch::Llama => None,
        };
        let unit = UnitRouter::draw(&st, bias_at.is_some(), n, embd, m, scale, seed, &name);
        let parts = unit.parts(cap, k, m);
        let derived = derive(&PUBLISHED, k, n, st.rho[0], rho8);
        let first = fit(&parts, &PUBLISHED, derived.shares);
        pending.push(Pending {
            layer,
            router_at,
            bias_at,
            unit,
            st,
            derived,
            first,
        });
    }
    if pending.is_empty() {
        return Err(GenError::Calibrate(
            "expected MoE layers to calibrate, found no expert calls".into(),
        ));
    }
    drop(captured);
    drop(model);
    let writes: Vec<_> = pending.iter().flat_map(|p| p.writes(&p.first.0)).collect();
    write_at(path, &writes)?;
    // the second pass: the calibrated routers on new prompts, with the tokens they decode
    let (model, captured) = measure(path, m, &CHECK_PROMPTS)?;
    drop(model);
    let mut layers = Vec::new();
    let mut writes = Vec::new();
    for p in pending {
        let cap = captured.get(&p.layer).ok_or_else(|| {
            GenError::Calibrate(format!(
                "layer {}: expected router inputs in the second pass, found none",
                p.layer
            ))
        })?;
        let parts = p.unit.parts(cap, k, m);
        let f = &p.first.0;
        let checked = parts.simulate((f.static_, f.topic, f.token));
        let (shares, simulated) = fit(&parts, &PUBLISHED, p.first.0);
        writes.extend(p.writes(&shares));
        layers.push(LayerCalibration {
            layer: p.layer,
            rows: p.st.rows,
            rho: p.st.rho,
            ridge: p.st.ridge,
            common: p.st.common,
            derived: p.derived,
            first: p.first,
            checked,
            shares,
            simulated,
        });
    }
    write_at(path, &writes)?;
    Ok(Calibration { layers })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cholesky_solves_round_trip() {
        let a = [4.0, 2.0, 0.4, 2.0, 3.0, 0.5, 0.4, 0.5, 2.0];
        let l = cholesky(&a, 3).unwrap();
        let b = [1.0, -2.0, 0.5];
        // L L^T x = b
        let x = solve_upper_t(&l, &solve_lower(&l, &b));
        for i in 0..3 {
            let ax: f64 = (0..3).map(|j| a[i * 3 + j] * x[j]).sum();
            assert!((ax - b[i]).abs() < 1e-12);
        }
        assert!(cholesky(&[1.0, 2.0, 2.0, 1.0], 2).is_none());
    }

    #[test]
    fn stats_whiten_and_find_the_common_part() {
        // two sequences whose topic is a constant common vector plus a per-sequence offset
        let m = 4;
        let mut c = Captured::default();
        let mut r = crate::gen::rng::SplitMix64::new(5);
        for s in 0..8u32 {
            let own: Vec<f64> = (0..m).map(|_| f64::from(r.gaussian())).collect();
            for _ in 0..20 {
                c.seq.push(s);
                c.c0.push(1.0);
                for (i, o) in own.iter().enumerate() {
                    let common = if i == 0 { 3.0 } else { 0.0 };
                    c.topic.push(common + o + 0.01 * f64::from(r.gaussian()));
                }
                c.rest_sq += 2.0;
                c.rest_n += 2;
            }
        }
        let st = layer_stats(1, &c, m, &|_, _| true).unwrap();
        // a topic constant within each sequence: autocorrelation ~1 at every lag
        assert!(st.rho.iter().all(|&x| x > 0.95), "{:?}", st.rho);
        assert!(st.common > 0.5, "common {}", st.common);
        assert!((st.mu[0] - 3.0).abs() < 1.0);
        assert!((st.rest_rms - 1.0).abs() < 1e-9);
        // too few rows is an error, not a guess
        let short = Captured {
            seq: vec![0; 3],
            c0: vec![1.0; 3],
            topic: vec![0.0; 3 * m],
            rest_sq: 1.0,
            rest_n: 1,
            rows: Vec::new(),
        };
        assert!(layer_stats(1, &short, m, &|_, _| true).is_err());
        // a target no ridge reaches: the most persistent whitening is kept
        let st2 = layer_stats(1, &c, m, &|_, _| false).unwrap();
        assert!(st2.rho[0] >= st.rho[0] - 1e-12);
    }
}
