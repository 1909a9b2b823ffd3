//! Criterion group `attention`: one decode token's attention over an F32 cache (single thread),
//! Qwen3-30B-A3B heads (32 query heads, 4 kv heads, 128 wide) and Kimi K2's absorbed MLA (64
//! heads over one 576-wide latent, V its first 512), at 128 / 512 / 2048 cached positions, with
//! the rows contiguous (`/contiguous`) and in the paged cache's blocks of 16 positions, each its
//! own allocation (`/paged16`): the two ids side by side are the cost of paging.
//! Throughput is in cached positions × heads.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nightshift_benches::random_f32;
use nightshift_model::attention::{attend, Heads, KvView};

fn attention(c: &mut Criterion) {
    let mut g = c.benchmark_group("attention");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    // (name, heads, kv heads, dk, dv, MLA: V is the K row's prefix)
    let shapes = [
        ("qwen3-30b-a3b", 32, 4, 128, 128, false),
        ("kimi-k2-mla", 64, 1, 576, 512, true),
    ];
    for (name, n_head, n_head_kv, dk, dv, mla) in shapes {
        for n_kv in [128usize, 512, 2048] {
            let k = random_f32(n_kv * n_head_kv * dk, 1);
            let v = if mla {
                Vec::new()
            } else {
                random_f32(n_kv * n_head_kv * dv, 2)
            };
            let q = random_f32(n_head * dk, 3);
            let hd = Heads {
                n_head,
                n_head_kv,
                dk,
                dv,
                scale: 1.0 / (dk as f32).sqrt(),
            };
            let (kw, vw) = if mla {
                (dk, dk)
            } else {
                (n_head_kv * dk, n_head_kv * dv)
            };
            let vsrc = if mla { &k } else { &v };
            let block = nightshift_model::KvLayout::BLOCK;
            let split = |x: &[f32], w: usize| -> Vec<Vec<f32>> {
                x.chunks(block * w).map(|c| c.to_vec()).collect()
            };
            let (kp, vp) = (split(&k, kw), split(vsrc, vw));
            let kr: Vec<&[f32]> = kp.iter().map(|s| &s[..]).collect();
            let vr: Vec<&[f32]> = vp.iter().map(|s| &s[..]).collect();
            let (kc, vc) = ([&k[..]], [&vsrc[..]]);
            let views = [
                ("contiguous", &kc[..], &vc[..], n_kv),
                ("paged16", &kr[..], &vr[..], block),
            ];
            let mut out = vec![0f32; n_head * dv];
            let mut scores = Vec::new();
            g.throughput(Throughput::Elements((n_kv * n_head) as u64));
            for (layout, ks, vs, blk) in views {
                let kv = KvView {
                    k: ks,
                    k_stride: kw,
                    v: vs,
                    v_stride: vw,
                    block: blk,
                    n_kv,
                };
                let id = BenchmarkId::new(format!("{name}/{layout}"), n_kv);
                g.bench_with_input(id, &n_kv, |b, _| {
                    b.iter(|| attend(&q, &kv, hd, false, &mut scores, &mut out))
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, attention);
criterion_main!(benches);
