//! Criterion group `kernels`: our expert GEMM (single thread, dispatched tier) side by side with
//! ggml's `vec_dot` row by row (feature `ggml`), Kimi K2 expert shapes, Q2_K/Q4_K/Q6_K/Q8_0 and
//! Q3_K/Q5_K, batch 1..16. Throughput is in weight elements × batch; GFLOP/s = 2 × elements/s.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nightshift_benches::{kimi_cases, Acts, Case, Weights, BATCHES, SHAPES};
use nightshift_kernels::{gemm, GgmlType, QMatrix};

/// The shared Kimi K2 cases, then the same shapes and batches for Q3_K and Q5_K.
fn cases() -> Vec<Case> {
    let mut v = kimi_cases();
    for ty in [GgmlType::Q3_K, GgmlType::Q5_K] {
        for (shape, m, k) in SHAPES {
            for n in BATCHES {
                v.push(Case { ty, m, k, n, shape });
            }
        }
    }
    v
}

fn kernels(c: &mut Criterion) {
    let mut g = c.benchmark_group("kernels");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for case in cases() {
        let w = Weights::new(&case).expect("weights");
        let x = Acts::new(&case).expect("activations");
        let id = format!(
            "{}/{}/n{}",
            case.ty.name(),
            case.shape.replace('/', "+"),
            case.n
        );
        g.throughput(Throughput::Elements(case.elements()));
        let mut out = vec![0f32; case.m * case.n];
        let wq = QMatrix::new(case.ty, case.m, case.k, &w.q).expect("weight rows");
        g.bench_function(BenchmarkId::new("ours", &id), |b| {
            b.iter(|| gemm(wq, &x.q, case.n, &mut out, None).expect("gemm"))
        });
        #[cfg(feature = "ggml")]
        {
            let k = nightshift_benches::ggml::GgmlKernel::new(case.ty).expect("ggml traits");
            g.bench_function(BenchmarkId::new("ggml", &id), |b| {
                b.iter(|| k.gemm(case.k, &w.q, case.m, &x.q, case.n, &mut out))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
