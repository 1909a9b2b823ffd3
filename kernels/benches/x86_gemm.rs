//! Quick throughput check of the x86 tiers against the scalar reference (no criterion, so it
//! builds fast): `cargo bench -p nightshift-kernels --bench x86_gemm [-- TYPE...]`. Prints, per
//! type and batch size, nanoseconds per (weight row x activation row x 256 elements) and the
//! speed-up over scalar (k = 4096, 128 rows unless `X86_GEMM_K` / `X86_GEMM_ROWS` say otherwise),
//! and for the AVX-512 tier the time of the call against its batch-1 time (`t/t1`: the cost per
//! weight byte read relative to batch 1, what issue #22's 1.15x target is about).
//! `X86_GEMM_BATCHES=1,4` picks the batch sizes (with `X86_GEMM_ROWS` large enough, e.g.
//! 65536 rows of 7168, the weights stream from DRAM: the decode case), `X86_GEMM_SCALAR=off` skips the (slow) scalar
//! reference and `X86_GEMM_AVX2=off` the AVX2 tier. `X86_GEMM_HUGE=on` puts the weights on
//! transparent huge pages, as the engine's dense weights are, and `X86_GEMM_THREADS=2` runs the
//! engine's path instead (`dispatch::gemm_with` over a rayon pool of that many threads, with its
//! transpose; timed by the wall clock): with both, a head-sized shape (`X86_GEMM_K=2048
//! X86_GEMM_ROWS=151936`) runs as the engine's output head does.
//! The benches crate compares against ggml itself.

#[cfg(target_arch = "x86_64")]
use std::hint::black_box;
use std::time::Instant;

#[cfg(target_arch = "x86_64")]
use nightshift_kernels::arch::x86_64::{Avx2, Avx512Vnni};
use nightshift_kernels::{scalar, GgmlType};
#[cfg(target_arch = "x86_64")]
use nightshift_kernels::{QMatrix, Tile};

/// Realistic blocks: random floats through the reference quantizers; for the i-quants (no
/// quantizer here) random valid blocks: random bytes with a finite scale.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn quantized(ty: GgmlType, rows: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let rb = ty.row_bytes(k).expect("k fits");
    let mut out = vec![0u8; rb * rows];
    if ty.is_iq() {
        let mut r = nightshift_kernels::rng::SplitMix64::new(seed);
        for b in out.iter_mut() {
            *b = r.next_u64() as u8;
        }
        for (i, blk) in out.chunks_exact_mut(ty.block_bytes()).enumerate() {
            let d = 0x2000 + (i as u16 % 0x1000);
            nightshift_kernels::formats::set_iq_scale(ty, blk, d).expect("i-quant block");
        }
        return out;
    }
    for r in 0..rows {
        let f: Vec<f32> = (0..k)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) as f32
            })
            .collect();
        scalar::quantize_row(ty, &f, &mut out[r * rb..][..rb]).expect("quantize");
    }
    out
}

/// Seconds this thread has run on a CPU (`CLOCK_THREAD_CPUTIME_ID`, exact to the call: the
/// scheduler's statistics in `/proc/thread-self/schedstat` advance by whole ticks, which
/// quantized a ~30 ms run by up to ~13%), so that other processes competing for the cores do not
/// inflate the figures; wall time where that clock is missing.
fn cpu_time() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
        return ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
    }
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// Seconds since the first call (the clock of runs on several threads).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn wall_time() -> f64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// Best of a few timed runs of `f` (seconds per call on `clock`), each run at least ~30 ms.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn time(clock: fn() -> f64, mut f: impl FnMut()) -> f64 {
    f();
    let t = clock();
    let mut reps = 0u32;
    while clock() - t < 0.03 {
        f();
        reps += 1;
    }
    let mut best = (clock() - t) / reps as f64;
    for _ in 0..4 {
        let t = clock();
        for _ in 0..reps {
            f();
        }
        best = best.min((clock() - t) / reps as f64);
    }
    best
}

/// Bytes in an anonymous map advised onto transparent huge pages (`X86_GEMM_HUGE=on`).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct HugeBytes {
    ptr: *mut u8,
    len: usize,
    map_len: usize,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl HugeBytes {
    fn copy_of(src: &[u8]) -> HugeBytes {
        const HUGE: usize = 2 << 20;
        let map_len = src.len().div_ceil(HUGE).max(1) * HUGE;
        // SAFETY: a fresh private anonymous map; checked for failure below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(p != libc::MAP_FAILED, "mmap of {map_len} bytes failed");
        // SAFETY: `p` is a map of `map_len` bytes; the advice is only a hint.
        unsafe { libc::madvise(p, map_len, libc::MADV_HUGEPAGE) };
        // SAFETY: the map is writable and holds `src.len()` bytes; they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p as *mut u8, src.len()) };
        HugeBytes {
            ptr: p as *mut u8,
            len: src.len(),
            map_len,
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the map holds `len` initialised bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for HugeBytes {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the map made in `copy_of`, no longer borrowed.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.map_len) };
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    // `X86_GEMM_K` / `X86_GEMM_ROWS` change the shape (e.g. 7168 / 2048 for a Kimi K2 expert).
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let k = env("X86_GEMM_K", 4096);
    let rows = env("X86_GEMM_ROWS", 128);
    let batches: Vec<usize> = std::env::var("X86_GEMM_BATCHES")
        .ok()
        .map(|v| v.split(',').filter_map(|b| b.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4, 8, 16, 64]);
    let with_scalar = std::env::var("X86_GEMM_SCALAR").map_or(true, |v| v != "off");
    let with_avx2 = std::env::var("X86_GEMM_AVX2").map_or(true, |v| v != "off");
    let huge = std::env::var("X86_GEMM_HUGE").is_ok_and(|v| v == "on");
    let threads = env("X86_GEMM_THREADS", 1).max(1);
    let pool = (threads > 1).then(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("thread pool")
    });
    let types = [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::IQ1_S,
        GgmlType::IQ2_XXS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ4_XS,
        GgmlType::IQ1_M,
        GgmlType::IQ2_XS,
        GgmlType::IQ2_S,
        GgmlType::IQ3_S,
        GgmlType::IQ4_NL,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
    ];
    println!(
        "k={k} rows={rows}{}{}; ns per (row x act x 256 elements); speed-up vs scalar",
        if huge { ", huge pages" } else { "" },
        if threads > 1 {
            format!(", {threads} threads (wall)")
        } else {
            String::new()
        }
    );
    for ty in types {
        if !filter.is_empty() && !filter.iter().any(|f| f.eq_ignore_ascii_case(ty.name())) {
            continue;
        }
        let w = quantized(ty, rows.min(256), k, 7);
        // More rows than 256 repeat the first 256 (same speed, far less quantizing).
        let w: Vec<u8> = w
            .iter()
            .copied()
            .cycle()
            .take(rows * w.len() / rows.min(256))
            .collect();
        let huge_w = huge.then(|| HugeBytes::copy_of(&w));
        let w: &[u8] = huge_w.as_ref().map_or(&w, HugeBytes::bytes);
        let mut t1 = None;
        for &n in &batches {
            let x = quantized(ty.vec_dot_type(), n, k, 11 + n as u64);
            let mut out = vec![0f32; rows * n];
            let wq = QMatrix::new(ty, rows, k, w).expect("weights fit");
            let xq = QMatrix::activations(&wq, &x, n).expect("activations fit");
            let mut tile = Tile::new(wq, xq, &mut out).expect("output fits");
            let units = (rows * n * k / 256) as f64;
            let sc = if with_scalar {
                time(cpu_time, || {
                    scalar::gemm_block(&mut tile).expect("scalar");
                    black_box(tile.out());
                })
            } else {
                f64::NAN
            };
            let mut line = format!("{:5} n={n:2}  scalar {:7.2}", ty.name(), sc * 1e9 / units);
            if let Some(t) = Avx2::new().filter(|_| with_avx2) {
                let s = time(cpu_time, || {
                    assert!(t.gemm_block(&mut tile));
                    black_box(tile.out());
                });
                line += &format!("  avx2 {:6.2} ({:4.1}x)", s * 1e9 / units, sc / s);
            }
            if let Some(t) = Avx512Vnni::new() {
                let s = if let Some(pool) = &pool {
                    // The engine's path: `gemm_with` splitting rows over a rayon pool (and, from
                    // 2 activation rows, its scratch matrix and transpose).
                    let mut outs = vec![0f32; rows * n];
                    time(wall_time, || {
                        let wq = QMatrix::new(ty, rows, k, w).expect("weights fit");
                        nightshift_kernels::dispatch::gemm_with(
                            nightshift_kernels::dispatch::Tier::Avx512Vnni,
                            wq,
                            &x,
                            n,
                            &mut outs,
                            Some(pool),
                        )
                        .expect("gemm");
                        black_box(&outs);
                    })
                } else {
                    time(cpu_time, || {
                        assert!(t.gemm_block(&mut tile));
                        black_box(tile.out());
                    })
                };
                line += &format!("  avx512vnni {:6.2} ({:4.1}x)", s * 1e9 / units, sc / s);
                let base = *t1.get_or_insert(if n == 1 { s } else { f64::NAN });
                line += &format!("  t/t1 {:.2}", s / base);
            }
            println!("{line}");
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("x86 tiers only");
}
