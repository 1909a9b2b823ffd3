//! Recorder overhead per token on Kimi K2's routing shape (60 MoE layers × 384 experts, top-8):
//! one "token" = one `record` call per MoE layer for one row. Reported as ns per token (criterion
//! `Throughput::Elements` = tokens), beside the cost of merely touching the same routing arrays
//! (summing ids) so the ratio shows what the counting itself adds. `record` samples pairs from one
//! row in 4 (the default); `record_all_pairs` feeds every row to the pair sketch.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use nightshift_atlas::placement::ModelShape;
use nightshift_atlas::trace::{Recorder, RecorderConfig};

const LAYERS: usize = 60;
const EXPERTS: usize = 384;
const TOP_K: usize = 8;

/// Deterministic pseudo-random routing for `rows` tokens: distinct experts per row, skewed.
fn routing(rows: usize) -> (Vec<usize>, Vec<f32>) {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut ids = Vec::with_capacity(rows * TOP_K);
    for _ in 0..rows {
        let mut row = [usize::MAX; TOP_K];
        let mut n = 0;
        while n < TOP_K {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // square of a uniform in [0,1) -> skewed toward low ids
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            let e = ((u * u) * EXPERTS as f64) as usize;
            if !row[..n].contains(&e) {
                row[n] = e;
                n += 1;
            }
        }
        ids.extend_from_slice(&row);
    }
    let weights = vec![1.0 / TOP_K as f32; rows * TOP_K];
    (ids, weights)
}

fn bench(c: &mut Criterion) {
    let shape = ModelShape {
        moe_layers: (1..=LAYERS).collect(),
        n_experts: EXPERTS,
        expert_bytes: 1,
    };
    let mut g = c.benchmark_group("recorder_kimi_k2");
    for batch in [1usize, 16] {
        let steps = 64;
        let (ids, w) = routing(batch * steps);
        g.throughput(Throughput::Elements((batch * steps) as u64));
        // warm recorder (pages touched, sketch full): the steady state a long-running server sees
        let mut all_pairs = RecorderConfig::new("bench", TOP_K);
        all_pairs.pair_sample_every = 1;
        let mut r = Recorder::new(shape.clone(), RecorderConfig::new("bench", TOP_K));
        let mut r_all = Recorder::new(shape.clone(), all_pairs);
        let run = |r: &mut Recorder| {
            for step in 0..steps {
                let range = step * batch * TOP_K..(step + 1) * batch * TOP_K;
                for layer in 1..=LAYERS {
                    r.record(layer, &ids[range.clone()], &w[range.clone()])
                        .unwrap();
                }
            }
        };
        for _ in 0..16 {
            run(&mut r);
            run(&mut r_all);
        }
        g.bench_function(format!("record_batch{batch}"), |b| b.iter(|| run(&mut r)));
        g.bench_function(format!("record_all_pairs_batch{batch}"), |b| {
            b.iter(|| run(&mut r_all))
        });
        g.bench_function(format!("touch_only_batch{batch}"), |b| {
            b.iter(|| {
                let mut acc = 0usize;
                for step in 0..steps {
                    let range = step * batch * TOP_K..(step + 1) * batch * TOP_K;
                    for _layer in 1..=LAYERS {
                        acc = acc.wrapping_add(
                            std::hint::black_box(&ids[range.clone()])
                                .iter()
                                .sum::<usize>(),
                        );
                    }
                }
                acc
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
