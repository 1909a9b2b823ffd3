//! Criterion group `router`: the MoE router matmul (F32 `ffn_gate_inp`, single thread), the
//! plain row-major F32 gemm (ggml's generic numerics) next to the same numerics on the packed
//! layout (`PackedF32`, bit-identical), at Qwen3-30B-A3B (128 x 2048) and Kimi K2 (384 x 7168)
//! shapes, 1 and 4 tokens. Throughput is in weight elements × tokens.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nightshift_benches::random_f32;
use nightshift_kernels::{gemm, GgmlType, PackedF32, QMatrix};

fn router(c: &mut Criterion) {
    let mut g = c.benchmark_group("router");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for (name, rows, k) in [
        ("qwen3-30b-a3b", 128usize, 2048usize),
        ("kimi-k2", 384, 7168),
    ] {
        let w = random_f32(rows * k, 1);
        let wb: Vec<u8> = w.iter().flat_map(|f| f.to_le_bytes()).collect();
        let packed = PackedF32::pack(&wb, rows, k).expect("pack");
        for n in [1usize, 4] {
            let x = random_f32(n * k, 2);
            let xb: Vec<u8> = x.iter().flat_map(|f| f.to_le_bytes()).collect();
            let mut out = vec![0f32; rows * n];
            let wq = QMatrix::new(GgmlType::F32, rows, k, &wb).expect("f32 rows");
            g.throughput(Throughput::Elements((rows * k * n) as u64));
            g.bench_with_input(BenchmarkId::new(format!("{name}/plain"), n), &n, |b, _| {
                b.iter(|| gemm(wq, &xb, n, &mut out, None).expect("gemm"))
            });
            g.bench_with_input(BenchmarkId::new(format!("{name}/packed"), n), &n, |b, _| {
                b.iter(|| packed.gemm(&x, n, &mut out, None).expect("packed"))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, router);
criterion_main!(benches);
