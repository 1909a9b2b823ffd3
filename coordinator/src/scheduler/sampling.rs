//! Per-sequence sampling: OpenAI's knobs (temperature, top_p, presence/frequency penalties,
//! seed) plus llama.cpp's (top_k, min_p, repeat_penalty). Each sequence owns its `Sampler`, with
//! its own seeded generator, so a seeded request is reproducible whatever else is running.
//! Greedy (temperature 0) is a plain argmax over the penalised logits, lowest id on ties.
//! Log-probabilities reported to clients are those of the model (log-softmax of the raw
//! logits), before penalties and temperature, as OpenAI reports them.

use std::collections::HashMap;

/// Sampling parameters of one request, already validated by the gateway.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 0 = off.
    pub min_p: f32,
    /// OpenAI presence penalty (-2..2) over generated tokens.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty (-2..2) over generated tokens.
    pub frequency_penalty: f32,
    /// llama.cpp repetition penalty over the last `repeat_last_n` tokens; 1 = off.
    pub repeat_penalty: f32,
    /// Window of `repeat_penalty`, prompt included.
    pub repeat_last_n: usize,
    /// Generator seed; None = a fresh one per request.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: None,
        }
    }
}

/// splitmix64: tiny, fast and good enough for sampling; seeded per sequence.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A seed for requests that give none: time and a counter, different for every call.
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut r = Rng(t ^ COUNTER
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_mul(0x2545_f491_4f6c_dd1d));
    r.next_u64()
}

/// The sampling state of one sequence.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// How often each generated token occurred (presence/frequency penalties).
    counts: HashMap<u32, u32>,
    /// Last `repeat_last_n` tokens, prompt included (repeat penalty).
    recent: std::collections::VecDeque<u32>,
}

impl Sampler {
    /// A sampler for a sequence whose prompt is `prompt`.
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Sampler {
        let seed = params.seed.unwrap_or_else(fresh_seed);
        let n = params.repeat_last_n;
        let recent = prompt[prompt.len().saturating_sub(n)..]
            .iter()
            .copied()
            .collect();
        Sampler {
            params,
            rng: Rng(seed),
            counts: HashMap::new(),
            recent,
        }
    }

    /// Records a generated token (feeds the penalties).
    pub fn accept(&mut self, token: u32) {
        *self.counts.entry(token).or_insert(0) += 1;
        if self.params.repeat_last_n > 0 {
            if self.recent.len() == self.params.repeat_last_n {
                self.recent.pop_front();
            }
            self.recent.push_back(token);
        }
    }

    /// Picks the next token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let mut l = logits.to_vec();
        self.apply_penalties(&mut l);
        let p = &self.params;
        if p.temperature <= 0.0 {
            return argmax(&l);
        }
        // Candidates sorted by logit, descending (ties by id for determinism).
        let mut cand = sorted_candidates(&l);
        if cand.is_empty() {
            return argmax(&l);
        }
        if p.top_k > 0 && (p.top_k as usize) < cand.len() {
            cand.truncate(p.top_k as usize);
        }
        // Softmax with temperature.
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand
            .iter()
            .map(|c| (((c.1 - max) / p.temperature) as f64).exp())
            .collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= sum);
        // min_p: drop tokens below min_p * p(top).
        let mut keep = probs.len();
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            keep = probs.iter().take_while(|&&x| x >= floor).count().max(1);
        }
        // top_p: smallest prefix with mass >= top_p.
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut n = 0;
            for &x in &probs[..keep] {
                acc += x;
                n += 1;
                if acc >= p.top_p as f64 {
                    break;
                }
            }
            keep = n.max(1);
        }
        let mass: f64 = probs[..keep].iter().sum();
        let mut r = self.rng.next_f64() * mass;
        for (i, &x) in probs[..keep].iter().enumerate() {
            if r < x {
                return cand[i].0;
            }
            r -= x;
        }
        cand[keep - 1].0
    }

    fn apply_penalties(&self, l: &mut [f32]) {
        let p = &self.params;
        if p.repeat_penalty != 1.0 {
            let mut seen = std::collections::HashSet::new();
            for &t in &self.recent {
                if let Some(x) = l.get_mut(t as usize) {
                    if seen.insert(t) {
                        *x = if *x > 0.0 {
                            *x / p.repeat_penalty
                        } else {
                            *x * p.repeat_penalty
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

/// Index of the largest value, lowest index on ties; NaN never wins.
pub fn argmax(l: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &x) in l.iter().enumerate() {
        if x > l[best] || l[best].is_nan() {
            best = i;
        }
    }
    best as u32
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
mod tests {
    use super::*;

    fn greedy() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_is_argmax_lowest_id_on_ties() {
        let mut s = Sampler::new(greedy(), &[]);
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(s.sample(&[f32::NAN, 1.0, 0.5]), 1);
    }

    #[test]
    fn penalties_change_greedy_choice() {
        // presence penalty 2 on token 1 makes token 2 win
        let mut s = Sampler::new(
            SamplingParams {
                presence_penalty: 2.0,
                ..greedy()
            },
            &[],
        );
        s.accept(1);
        assert_eq!(s.sample(&[0.0, 3.0, 2.0]), 2);
        // repeat penalty over the prompt
        let mut s = Sampler::new(
            SamplingParams {
                repeat_penalty: 2.0,
                ..greedy()
            },
            &[1],
        );
        assert_eq!(s.sample(&[0.0, 3.0, 2.0]), 2);
        // frequency penalty grows with the count
        let mut s = Sampler::new(
            SamplingParams {
                frequency_penalty: 0.6,
                ..greedy()
            },
            &[],
        );
        s.accept(1);
        assert_eq!(s.sample(&[0.0, 3.0, 2.0]), 1);
        s.accept(1);
        assert_eq!(s.sample(&[0.0, 3.0, 2.0]), 2);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_respects_top_k() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let p = SamplingParams {
            temperature: 1.0,
            seed: Some(42),
            top_k: 3,
            ..Default::default()
        };
        let draw = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone(), &[]);
            (0..64).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        let a = draw(&p);
        assert_eq!(a, draw(&p));
        // top_k 3: only the three best (value 1.8 at ids 6, 13, 20)
        assert!(a.iter().all(|t| [6, 13, 20].contains(t)), "{a:?}");
        assert!(a.iter().any(|&t| t != a[0]), "sampling never varied: {a:?}");
        // min_p 1.0 keeps only the tokens tied with the top one (ids 6 mod 7)
        let mut s = Sampler::new(
            SamplingParams {
                min_p: 1.0,
                top_k: 0,
                ..p.clone()
            },
            &[],
        );
        assert!((0..20).all(|_| s.sample(&logits) % 7 == 6));
        // a tiny top_p keeps only the first candidate
        let mut s = Sampler::new(
            SamplingParams {
                top_p: 0.01,
                top_k: 0,
                ..p
            },
            &[],
        );
        assert!((0..20).all(|_| s.sample(&logits) == 6));
    }

    /// The radix order equals the comparison sort's, ties, signed zeros and non-finite
    /// values included, at vocabulary sizes on both sides of the switch.
    #[test]
    fn candidate_order_matches_a_comparison_sort() {
        let check = |l: &[f32]| {
            let mut want: Vec<(u32, f32)> = l
                .iter()
                .enumerate()
                .filter(|(_, x)| x.is_finite())
                .map(|(i, &x)| (i as u32, x))
                .collect();
            want.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let got = sorted_candidates(l);
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert_eq!((g.0, g.1.to_bits()), (w.0, w.1.to_bits()));
            }
        };
        let mut r = Rng(7);
        for n in [0usize, 5, 2047, 2048, 5000, 151_936] {
            let l: Vec<f32> = (0..n)
                .map(|i| match r.next_u64() % 16 {
                    0 => 0.0,
                    1 => -0.0,
                    2 => f32::NAN,
                    3 => f32::NEG_INFINITY,
                    4 => f32::INFINITY,
                    5 => 1.5, // many exact ties
                    6 => -(i as f32),
                    7 => f32::MIN_POSITIVE / 4.0, // subnormal
                    _ => (r.next_f64() as f32 - 0.5) * 40.0,
                })
                .collect();
            check(&l);
        }
    }

    #[test]
    fn logprobs_are_log_softmax() {
        let (lp, top) = logprobs(&[0.0, (2.0f32).ln(), 0.0], 1, 2);
        assert!((lp - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].0, 1);
        assert_eq!(top[1].0, 0);
        assert!((top[1].1 - 0.25f32.ln()).abs() < 1e-6);
    }
}
