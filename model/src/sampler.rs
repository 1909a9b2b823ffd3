//! The sampler, one for every path that picks tokens (`generate`, the server's scheduler, the
//! atlas recorder): a row of logits goes through an optional token mask (constrained decoding,
//! `ignore_eos`), then the penalties, then llama.cpp's chain — top-k, then top-p and min-p on
//! the untempered distribution, then temperature — and a draw from the sequence's own seeded
//! generator, so a seeded request is reproducible whatever else runs beside it. Greedy
//! (temperature 0) is a plain argmax over the masked, penalised logits, lowest id on ties.
//!
//! The logit bias (OpenAI's `logit_bias`) comes first: each listed token's logit moves by its
//! bias, and -100 bans the token outright (as OpenAI documents it).
//! Penalties: the repetition penalty (llama.cpp's: divide positive logits, multiply negative
//! ones, once per distinct token) looks at the last `penalty_last_n` tokens, prompt included;
//! the presence and frequency penalties (OpenAI's) count the generated tokens only.
//! Log-probabilities reported to clients ([`logprobs`]) are the model's: log-softmax of the raw
//! logits, before mask, penalties and temperature, as OpenAI reports them.

use std::collections::{HashMap, VecDeque};

use nightshift_kernels::rng::SplitMix64;

/// Sampling parameters (OpenAI / llama.cpp names).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// Nucleus mass in [0, 1]; 1 = off. At least one token is kept (llama.cpp's `min_keep`
    /// 1), so 0 keeps only the most probable one: greedy.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// 1 = off (llama.cpp semantics: divide positive logits, multiply negative ones).
    pub repetition_penalty: f32,
    /// How many recent tokens (prompt included) the repetition penalty looks at.
    pub penalty_last_n: usize,
    /// OpenAI presence penalty (-2..2) over generated tokens.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty (-2..2) over generated tokens.
    pub frequency_penalty: f32,
    /// OpenAI `logit_bias`: (token, bias in -100..=100); -100 bans the token.
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            penalty_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplerParams {
    /// Argmax sampling.
    pub fn greedy() -> SamplerParams {
        SamplerParams {
            temperature: 0.0,
            ..SamplerParams::default()
        }
    }
}

/// A seed for requests that give none: time and a counter, different for every call.
pub fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    SplitMix64::new(t ^ n.wrapping_mul(0x2545_f491_4f6c_dd1d)).next_u64()
}

/// Which tokens a constrained step may pick: bit `t % 32` of word `t / 32` set = allowed
/// (llguidance's and toktrie's layout). Tokens past the end are not allowed.
#[derive(Clone, Copy, Debug)]
pub struct TokenMask<'a>(pub &'a [u32]);

impl TokenMask<'_> {
    /// Whether `token` is allowed.
    #[inline]
    pub fn allows(&self, token: u32) -> bool {
        self.0
            .get((token / 32) as usize)
            .is_some_and(|w| w >> (token % 32) & 1 == 1)
    }

    /// The first allowed token, if any.
    pub fn first(&self) -> Option<u32> {
        self.0
            .iter()
            .enumerate()
            .find(|(_, &w)| w != 0)
            .map(|(i, w)| i as u32 * 32 + w.trailing_zeros())
    }
}

/// The sampling state of one sequence; keep one per sequence.
#[derive(Debug)]
pub struct Sampler {
    params: SamplerParams,
    rng: SplitMix64,
    /// How often each generated token occurred (presence/frequency penalties).
    counts: HashMap<u32, u32>,
    /// Last `penalty_last_n` tokens, prompt included (repetition penalty).
    recent: VecDeque<u32>,
}

impl Sampler {
    /// A sampler for a sequence whose prompt is `prompt`.
    pub fn new(params: SamplerParams, prompt: &[u32]) -> Sampler {
        let n = params.penalty_last_n;
        let recent = prompt[prompt.len().saturating_sub(n)..]
            .iter()
            .copied()
            .collect();
        Sampler {
            rng: SplitMix64::new(params.seed),
            params,
            counts: HashMap::new(),
            recent,
        }
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Records a generated token (feeds the penalties).
    pub fn accept(&mut self, token: u32) {
        *self.counts.entry(token).or_insert(0) += 1;
        if self.params.penalty_last_n > 0 {
            if self.recent.len() == self.params.penalty_last_n {
                self.recent.pop_front();
            }
            self.recent.push_back(token);
        }
    }

    /// Picks the next token from one row of logits (it is not recorded: call `accept`).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sample_masked(logits, None)
    }

    /// Picks the next token among those `mask` allows (all when None). When the mask leaves no
    /// finite logit, the first allowed token is taken, so a constrained sequence never leaves
    /// its grammar.
    pub fn sample_masked(&mut self, logits: &[f32], mask: Option<TokenMask>) -> u32 {
        let mut l = logits.to_vec();
        if let Some(m) = mask {
            for (t, x) in l.iter_mut().enumerate() {
                if !m.allows(t as u32) {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        self.apply_penalties(&mut l);
        // nothing left (the mask, or a logit bias banning all it allows): the grammar wins
        if let Some(m) = mask.filter(|_| !l.iter().any(|x| x.is_finite())) {
            if let Some(t) = m.first() {
                return t;
            }
        }
        if self.params.temperature <= 0.0 {
            return argmax(&l);
        }
        self.draw(&l)
    }

    /// llama.cpp's chain over the finite logits: top-k, then top-p and min-p on the untempered
    /// distribution, then temperature on what is left, then one draw.
    fn draw(&mut self, l: &[f32]) -> u32 {
        let p = &self.params;
        let mut cand = sorted_candidates(l);
        if cand.is_empty() {
            return argmax(l);
        }
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.truncate(p.top_k);
        }
        let mut keep = cand.len();
        if p.top_p < 1.0 || p.min_p > 0.0 {
            let probs = softmax(&cand, 1.0);
            if p.top_p < 1.0 {
                let mut acc = 0.0;
                for (i, &x) in probs.iter().enumerate() {
                    acc += x;
                    if acc >= p.top_p as f64 {
                        keep = i + 1;
                        break;
                    }
                }
            }
            if p.min_p > 0.0 {
                let floor = probs[0] * p.min_p as f64;
                keep = keep.min(probs.iter().take_while(|&&x| x >= floor).count().max(1));
            }
        }
        cand.truncate(keep.max(1));
        let probs = softmax(&cand, p.temperature);
        let total: f64 = probs.iter().sum();
        let mut r = self.rng.next_f64() * total;
        for (i, &x) in probs.iter().enumerate() {
            if r < x {
                return cand[i].0;
            }
            r -= x;
        }
        cand[probs.len() - 1].0
    }

    /// The logit bias, then the penalties.
    fn apply_penalties(&self, l: &mut [f32]) {
        let p = &self.params;
        for &(t, b) in &p.logit_bias {
            if let Some(x) = l.get_mut(t as usize) {
                *x = if b <= -100.0 {
                    f32::NEG_INFINITY
                } else {
                    *x + b
                };
            }
        }
        if p.repetition_penalty != 1.0 {
            let mut seen = std::collections::HashSet::new();
            for &t in &self.recent {
                if let Some(x) = l.get_mut(t as usize) {
                    if seen.insert(t) {
                        *x = if *x > 0.0 {
                            *x / p.repetition_penalty
                        } else {
                            *x * p.repetition_penalty
                        };
                    }
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&t, &c) in &self.counts {
                if let Some(x) = l.get_mut(t as usize) {
                    *x -= p.presence_penalty + p.frequency_penalty * c as f32;
                }
            }
        }
    }
}

/// Softmax of sorted candidates (the first is the largest) at temperature `t`.
fn softmax(c: &[(u32, f32)], t: f32) -> Vec<f64> {
    let max = c[0].1;
    let mut e: Vec<f64> = c.iter().map(|x| (((x.1 - max) / t) as f64).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter_mut().for_each(|x| *x /= sum);
    e
}

/// The finite logits as (id, logit), by logit descending, ties by id ascending. Large
/// vocabularies (150k tokens) go through a stable LSD radix sort on the float bits, which gives
/// exactly the comparison sort's order in linear time: the full sort was milliseconds per token
/// on the engine thread, between two steps of every running sequence.
fn sorted_candidates(l: &[f32]) -> Vec<(u32, f32)> {
    let by_value = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let mut a: Vec<(u32, f32)> = l
        .iter()
        .enumerate()
        .filter(|(_, x)| x.is_finite())
        .map(|(i, &x)| (i as u32, x))
        .collect();
    if a.len() < 2048 {
        a.sort_by(by_value);
        return a;
    }
    // An unsigned key whose ascending order is the logits' descending total order.
    let key = |x: f32| {
        let b = x.to_bits();
        let ascending = if b & 0x8000_0000 != 0 {
            !b
        } else {
            b | 0x8000_0000
        };
        !ascending
    };
    let mut b = vec![(0u32, 0.0f32); a.len()];
    for shift in [0u32, 8, 16, 24] {
        let digit = |c: &(u32, f32)| ((key(c.1) >> shift) & 0xff) as usize;
        let mut start = [0usize; 257];
        for c in &a {
            start[digit(c) + 1] += 1;
        }
        for i in 0..256 {
            start[i + 1] += start[i];
        }
        // stable: equal digits keep their order, so ties stay in ascending id order
        for c in &a {
            let d = digit(c);
            b[start[d]] = *c;
            start[d] += 1;
        }
        std::mem::swap(&mut a, &mut b);
    }
    a
}

/// Index of the largest value, lowest index on ties; NaN never wins (all NaN: the last index).
///
/// Two passes a vocabulary's logits fit in cache for: the maximum over 16 independent lanes
/// (a compare-and-select the compiler vectorizes; NaN is never selected), then the first index
/// holding it. One pass keeping the best index branches on every element and ran 6x slower.
pub fn argmax(l: &[f32]) -> u32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = l.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    let max = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    // no value above -inf and none equal to it: every value is NaN
    l.iter()
        .position(|&x| x == max)
        .unwrap_or(l.len().saturating_sub(1)) as u32
}

/// log-softmax of the raw logits at `token`, and the `top` most likely tokens with theirs
/// (descending, ties by id).
pub fn logprobs(logits: &[f32], token: u32, top: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    let lp = |x: f32| (x as f64 - lse) as f32;
    let chosen = logits
        .get(token as usize)
        .map(|&x| lp(x))
        .unwrap_or(f32::NEG_INFINITY);
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &x) in logits.iter().enumerate() {
            if best.len() < top || x > best[best.len() - 1].1 {
                let at = best.partition_point(|b| b.1 >= x);
                best.insert(at, (i as u32, x));
                best.truncate(top);
            }
        }
    }
    (chosen, best.into_iter().map(|(i, x)| (i, lp(x))).collect())
}

#[cfg(test)]
mod tests;
