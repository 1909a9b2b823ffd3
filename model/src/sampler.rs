//! `Sampler`: turns a row of logits into the next token. Penalties (repetition, presence,
//! frequency) over the recent tokens, then top-k, top-p and min-p, then temperature (llama.cpp's
//! order), then a draw from a seeded generator (reproducible for a given seed); greedy (argmax)
//! when the temperature is 0.

/// Sampling parameters (OpenAI / llama.cpp names).
#[derive(Clone, Debug)]
pub struct SamplerParams {
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0.0 = off.
    pub min_p: f32,
    /// 1.0 = off (llama.cpp semantics: divide positive logits, multiply negative ones).
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
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
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
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

/// A seeded sampler; keep one per sequence.
pub struct Sampler {
    params: SamplerParams,
    state: u64,
    history: Vec<u32>,
}

/// Index of the largest value (first one on ties).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Sampler {
        let state = params.seed ^ 0x9E37_79B9_7F4A_7C15;
        Sampler {
            params,
            state,
            history: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Records tokens (e.g. the prompt) for the penalties without sampling.
    pub fn accept(&mut self, tok: u32) {
        self.history.push(tok);
    }

    fn next_f64(&mut self) -> f64 {
        // splitmix64
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn penalize(&self, logits: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 {
            return;
        }
        let start = self.history.len().saturating_sub(p.penalty_last_n);
        let mut counts: Vec<(u32, u32)> = Vec::new();
        for &t in &self.history[start..] {
            match counts.iter_mut().find(|c| c.0 == t) {
                Some(c) => c.1 += 1,
                None => counts.push((t, 1)),
            }
        }
        for (t, n) in counts {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if *l > 0.0 {
                *l /= p.repetition_penalty;
            } else {
                *l *= p.repetition_penalty;
            }
            *l -= n as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }

    /// Picks the next token from `logits` and records it.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let mut l = logits.to_vec();
        self.penalize(&mut l);
        let tok = if self.params.temperature <= 0.0 || l.len() < 2 {
            argmax(&l)
        } else {
            self.draw(&l)
        };
        self.history.push(tok);
        tok
    }

    fn draw(&mut self, l: &[f32]) -> u32 {
        let p = self.params.clone();
        let mut cand: Vec<(u32, f32)> = l
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(i, &v)| (i as u32, v))
            .collect();
        if cand.is_empty() {
            return argmax(l);
        }
        cand.sort_by(|a, b| {
            b.1.partial_cmp(&a.1)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.0.cmp(&b.0))
        });
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.truncate(p.top_k);
        }
        // llama.cpp's chain: top-k, then top-p and min-p on the untempered distribution, then
        // temperature on what is left.
        let softmax = |c: &[(u32, f32)], t: f32| -> Vec<f64> {
            let max = c[0].1;
            let mut e: Vec<f64> = c.iter().map(|x| (((x.1 - max) / t) as f64).exp()).collect();
            let sum: f64 = e.iter().sum();
            e.iter_mut().for_each(|x| *x /= sum);
            e
        };
        let probs = softmax(&cand, 1.0);
        let mut keep = probs.len();
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
        cand.truncate(keep.max(1));
        let probs = softmax(&cand, p.temperature);
        let total: f64 = probs.iter().sum();
        let mut r = self.next_f64() * total;
        for (i, &x) in probs.iter().enumerate() {
            if r < x {
                return cand[i].0;
            }
            r -= x;
        }
        cand[probs.len() - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_argmax() {
        let mut s = Sampler::new(SamplerParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9]), 1);
    }

    #[test]
    fn seeded_sampling_is_reproducible() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let params = SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 42,
            ..Default::default()
        };
        let run = || {
            let mut s = Sampler::new(params.clone());
            (0..20).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn top_k_one_is_greedy() {
        let params = SamplerParams {
            temperature: 2.0,
            top_k: 1,
            seed: 7,
            ..Default::default()
        };
        let mut s = Sampler::new(params);
        for _ in 0..10 {
            assert_eq!(s.sample(&[0.0, 1.0, 5.0, 4.0]), 2);
        }
    }

    #[test]
    fn repetition_penalty_moves_choice() {
        let params = SamplerParams {
            temperature: 0.0,
            repetition_penalty: 2.0,
            ..Default::default()
        };
        let mut s = Sampler::new(params);
        s.accept(0);
        // 3.0 / 2 = 1.5 < 2.0
        assert_eq!(s.sample(&[3.0, 2.0]), 1);
    }

    #[test]
    fn top_p_and_min_p_cut_before_temperature() {
        // p = softmax([4, 2, 0, 0]) ~ [0.84, 0.11, 0.02, 0.02]: top_p 0.8 and min_p 0.2 keep one.
        let logits = [4.0, 2.0, 0.0, 0.0];
        for (top_p, min_p) in [(0.8, 0.0), (1.0, 0.2)] {
            let params = SamplerParams {
                temperature: 5.0,
                top_k: 0,
                top_p,
                min_p,
                seed: 1,
                ..Default::default()
            };
            let mut s = Sampler::new(params);
            for _ in 0..20 {
                assert_eq!(s.sample(&logits), 0, "top_p {top_p} min_p {min_p}");
            }
        }
    }
}
