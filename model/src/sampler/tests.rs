//! The sampler's tests: greedy and seeded draws, the penalties, llama.cpp's chain order, the
//! candidate sort and token masks.

use super::*;

/// OpenAI's defaults: nothing cut, temperature 1.
fn openai() -> SamplerParams {
    SamplerParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplerParams::default()
    }
}

fn greedy() -> SamplerParams {
    SamplerParams {
        temperature: 0.0,
        ..openai()
    }
}

#[test]
fn greedy_picks_argmax() {
    let mut s = Sampler::new(SamplerParams::greedy(), &[]);
    assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9]), 1);
}

#[test]
fn greedy_is_argmax_lowest_id_on_ties() {
    let mut s = Sampler::new(greedy(), &[]);
    assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
    assert_eq!(s.sample(&[f32::NAN, 1.0, 0.5]), 1);
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
        let mut s = Sampler::new(params.clone(), &[]);
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
    let mut s = Sampler::new(params, &[]);
    for _ in 0..10 {
        assert_eq!(s.sample(&[0.0, 1.0, 5.0, 4.0]), 2);
    }
}

/// llama.cpp's top-p keeps at least one token (`min_keep` 1), so `top_p` 0 keeps only the
/// first candidate: exactly greedy's token (ties to the lowest id), whatever the temperature,
/// seed or vocabulary size (the large one takes the radix sort).
#[test]
fn top_p_zero_is_greedy() {
    let mut rng = SplitMix64::new(7);
    for (row, vocab) in [8usize, 50, 3000, 5000].into_iter().enumerate() {
        let mut logits: Vec<f32> = (0..vocab)
            .map(|_| (rng.next_f64() * 4.0 - 2.0) as f32)
            .collect();
        if row % 2 == 1 {
            // a tie for the top: the lowest id wins, as argmax's
            let top = logits.iter().cloned().fold(f32::MIN, f32::max);
            logits[vocab / 2] = top;
            logits[vocab - 1] = top;
        }
        let want = Sampler::new(greedy(), &[]).sample(&logits);
        for seed in 0..20 {
            let params = SamplerParams {
                temperature: 2.0,
                top_p: 0.0,
                seed,
                ..openai()
            };
            let mut s = Sampler::new(params, &[]);
            assert_eq!(s.sample(&logits), want, "vocab {vocab} seed {seed}");
        }
    }
}

#[test]
fn repetition_penalty_moves_choice() {
    let params = SamplerParams {
        temperature: 0.0,
        repetition_penalty: 2.0,
        ..Default::default()
    };
    let mut s = Sampler::new(params, &[]);
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
        let mut s = Sampler::new(params, &[]);
        for _ in 0..20 {
            assert_eq!(s.sample(&logits), 0, "top_p {top_p} min_p {min_p}");
        }
    }
}

#[test]
fn penalties_change_greedy_choice() {
    // presence penalty 2 on token 1 makes token 2 win
    let mut s = Sampler::new(
        SamplerParams {
            presence_penalty: 2.0,
            ..greedy()
        },
        &[],
    );
    s.accept(1);
    assert_eq!(s.sample(&[0.0, 3.0, 2.0]), 2);
    // repeat penalty over the prompt
    let mut s = Sampler::new(
        SamplerParams {
            repetition_penalty: 2.0,
            ..greedy()
        },
        &[1],
    );
    assert_eq!(s.sample(&[0.0, 3.0, 2.0]), 2);
    // frequency penalty grows with the count
    let mut s = Sampler::new(
        SamplerParams {
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
    let p = SamplerParams {
        temperature: 1.0,
        seed: 42,
        top_k: 3,
        ..openai()
    };
    let draw = |p: &SamplerParams| {
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
        SamplerParams {
            min_p: 1.0,
            top_k: 0,
            ..p.clone()
        },
        &[],
    );
    assert!((0..20).all(|_| s.sample(&logits) % 7 == 6));
    // a tiny top_p keeps only the first candidate
    let mut s = Sampler::new(
        SamplerParams {
            top_p: 0.01,
            top_k: 0,
            ..p
        },
        &[],
    );
    assert!((0..20).all(|_| s.sample(&logits) == 6));
}

/// The draws of the server's former sampler (temperature, then the cuts; here nothing is cut,
/// so the chains agree): a seeded request gives the tokens it gave before the samplers merged.
#[test]
fn openai_defaults_draw_as_before() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let p = SamplerParams {
        temperature: 0.7,
        seed: 1234,
        ..openai()
    };
    let mut s = Sampler::new(p.clone(), &[]);
    let got: Vec<u32> = (0..16).map(|_| s.sample(&logits)).collect();
    // the former code: softmax at temperature over all candidates, one uniform draw each
    let mut rng = SplitMix64::new(1234);
    let cand = sorted_candidates(&logits);
    let want: Vec<u32> = (0..16)
        .map(|_| {
            let probs = softmax(&cand, 0.7);
            let mass: f64 = probs.iter().sum();
            let mut r = rng.next_f64() * mass;
            for (i, &x) in probs.iter().enumerate() {
                if r < x {
                    return cand[i].0;
                }
                r -= x;
            }
            cand[cand.len() - 1].0
        })
        .collect();
    assert_eq!(got, want);
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
    let mut r = SplitMix64::new(7);
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

fn bits(allowed: &[u32], vocab: usize) -> Vec<u32> {
    let mut w = vec![0u32; vocab.div_ceil(32)];
    for &t in allowed {
        w[t as usize / 32] |= 1 << (t % 32);
    }
    w
}

#[test]
fn a_mask_restricts_greedy_and_seeded_draws() {
    let logits: Vec<f32> = (0..100).map(|i| (i % 10) as f32).collect();
    let allowed = [3u32, 40, 77];
    let w = bits(&allowed, 100);
    let mut g = Sampler::new(greedy(), &[]);
    // 77 % 10 = 7 is the best of the allowed
    assert_eq!(g.sample_masked(&logits, Some(TokenMask(&w))), 77);
    let mut s = Sampler::new(
        SamplerParams {
            temperature: 1.5,
            seed: 9,
            ..openai()
        },
        &[],
    );
    for _ in 0..50 {
        let t = s.sample_masked(&logits, Some(TokenMask(&w)));
        assert!(allowed.contains(&t), "{t}");
    }
    // only tokens whose logit is -inf allowed: the first allowed one, never an outside one
    let mut l = logits.clone();
    l[40] = f32::NEG_INFINITY;
    l[77] = f32::NEG_INFINITY;
    let w = bits(&[40, 77], 100);
    assert_eq!(g.sample_masked(&l, Some(TokenMask(&w))), 40);
    // a logit bias that bans every allowed token leaves the grammar's first, not an outside one
    let mut banned = Sampler::new(
        SamplerParams {
            logit_bias: vec![(3, -100.0), (40, -100.0), (77, -100.0)],
            ..greedy()
        },
        &[],
    );
    let w = bits(&allowed, 100);
    assert_eq!(banned.sample_masked(&logits, Some(TokenMask(&w))), 3);
    // a short mask allows nothing past its end
    assert!(!TokenMask(&[u32::MAX]).allows(32));
    assert_eq!(TokenMask(&[0, 0, 1 << 5]).first(), Some(69));
}

/// The vectorized argmax against its definition (first index of the largest value, `>` order so
/// that -0.0 ties 0.0, NaN never chosen unless every value is NaN, then the last index) on
/// drawn rows with ties, infinities, signed zeros and NaNs, at lengths around the lane count.
#[test]
fn argmax_is_the_first_largest_and_skips_nan() {
    fn definition(l: &[f32]) -> u32 {
        let mut best = 0usize;
        for (i, &x) in l.iter().enumerate() {
            if x > l[best] || l[best].is_nan() {
                best = i;
            }
        }
        best as u32
    }
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1.0,
        -1.0,
    ];
    let mut rng = nightshift_kernels::rng::SplitMix64::new(11);
    for len in (0..40).chain([151_936, 1000]) {
        for round in 0..40 {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    let r = rng.next_u64();
                    match (r % 8, round % 4) {
                        // some rows all NaN, some with many special values
                        (_, 0) if round == 0 => f32::NAN,
                        (0 | 1, _) => specials[(r >> 8) as usize % specials.len()],
                        // a few distinct values, so ties are common
                        _ => ((r >> 16) % 5) as f32 - 2.0,
                    }
                })
                .collect();
            assert_eq!(argmax(&row), definition(&row), "len {len} round {round}");
        }
    }
}

/// `logit_bias`: -100 bans a token whatever its logit, other biases add to it; greedy and
/// seeded draws both see them.
#[test]
fn logit_bias_bans_and_shifts() {
    let logits = [0.1, 3.0, -1.0, 2.9];
    let biased = |bias: Vec<(u32, f32)>, p: SamplerParams| {
        let mut s = Sampler::new(
            SamplerParams {
                logit_bias: bias,
                ..p
            },
            &[],
        );
        s.sample(&logits)
    };
    assert_eq!(biased(vec![], greedy()), 1);
    assert_eq!(biased(vec![(1, -100.0)], greedy()), 3);
    assert_eq!(biased(vec![(2, 4.5)], greedy()), 2, "-1 + 4.5 beats 3.0");
    assert_eq!(biased(vec![(2, 3.9)], greedy()), 1, "-1 + 3.9 does not");
    // a banned token is never drawn at any temperature; out-of-vocabulary ids are ignored
    for seed in 0..200 {
        let p = SamplerParams {
            temperature: 2.0,
            seed,
            ..openai()
        };
        assert_ne!(biased(vec![(1, -100.0), (99, 5.0)], p), 1);
    }
}
