//! `stream-report`: our GEMM on weights far larger than the caches (the decode case: every weight
//! byte comes from DRAM once per token), next to the read-only bandwidth of the same buffer with
//! the same threads. Prints one markdown row per (type, batch): milliseconds, weight GB/s, the
//! read ceiling and the fraction of it the kernel reaches. At batch 1 a kernel below ~100% of the
//! ceiling is either compute-bound (its in-cache speed, `kernel-report`, is the limit) or not
//! keeping enough loads in flight (software prefetch).

use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use nightshift_benches::stream::read_bandwidth;
use nightshift_benches::{quantize_rows, random_f32, random_iq_blocks};
use nightshift_kernels::{dispatch, gemm, GgmlType, QMatrix};

/// Out-of-cache GEMM throughput vs the read bandwidth ceiling.
#[derive(Parser)]
struct Args {
    /// Weight types to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,Q8_0"
    )]
    types: Vec<String>,
    /// Activation rows (batch sizes).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    batches: Vec<usize>,
    /// Row length (elements).
    #[arg(long, default_value_t = 2048)]
    k: usize,
    /// Weight bytes per type (well above the last-level cache).
    #[arg(long, default_value_t = 768)]
    mib: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Timed passes per case (best one kept).
    #[arg(long, default_value_t = 5)]
    passes: usize,
    /// Also measure each case on a copy of the weights in transparent huge pages
    /// (`madvise(MADV_HUGEPAGE)`): fewer TLB misses while streaming.
    #[arg(long)]
    huge_pages: bool,
}

/// An anonymous mapping of `len` bytes advised to be backed by transparent huge pages (the
/// advice is best effort: the kernel may still use 4 KiB pages). Never unmapped (a report binary).
fn huge_buffer(len: usize) -> anyhow::Result<&'static mut [u8]> {
    // SAFETY: a fresh private anonymous mapping; checked for MAP_FAILED before use, then only
    // accessed through the returned slice of exactly `len` bytes.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        anyhow::ensure!(p != libc::MAP_FAILED, "mmap of {len} bytes failed");
        libc::madvise(p, len, libc::MADV_HUGEPAGE);
        Ok(std::slice::from_raw_parts_mut(p as *mut u8, len))
    }
}

fn parse_type(s: &str) -> anyhow::Result<GgmlType> {
    GgmlType::from_name(s)
        .filter(|t| t.has_vec_dot() && t.block_len() > 1)
        .with_context(|| format!("expected a quantized weight type such as Q4_K, found {s}"))
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.max(1))
        .build()?;
    println!(
        "tier {:?}, {} threads, {} MiB of weights per type, rows of {}",
        dispatch::active_tier(),
        a.threads,
        a.mib,
        a.k
    );
    println!("| type | batch | ms | weight GB/s | read ceiling GB/s | of ceiling |");
    println!("|---|---:|---:|---:|---:|---:|");
    for name in &a.types {
        let ty = parse_type(name)?;
        let wb = ty.row_bytes(a.k)?;
        let m = (a.mib << 20) / wb;
        // 64 distinct quantized rows repeated: the values do not change the speed, and quantizing
        // hundreds of MiB would dominate the run. The i-quants (no quantizer here) take random
        // valid blocks.
        let base = if ty.has_quantizer() {
            quantize_rows(ty, &random_f32(64 * a.k, 7), a.k)?
        } else {
            random_iq_blocks(ty, 64 * a.k, 7)?
        };
        let mut w = vec![0u8; m * wb];
        for c in w.chunks_mut(base.len()) {
            let l = c.len();
            c.copy_from_slice(&base[..l]);
        }
        let huge = if a.huge_pages {
            let h = huge_buffer(w.len())?;
            h.copy_from_slice(&w);
            Some(&*h)
        } else {
            None
        };
        for (w, pages) in std::iter::once((&w[..], "4K")).chain(huge.map(|h| (h, "huge"))) {
            for &n in &a.batches {
                // measured next to each case: the machine's bandwidth drifts (shared hosts)
                let ceiling = read_bandwidth(&w, a.threads, 8, a.passes)?;
                let xt = ty.vec_dot_type();
                let x = quantize_rows(xt, &random_f32(n * a.k, 11), a.k)?;
                let mut out = vec![0f32; m * n];
                let wq = QMatrix::new(ty, m, a.k, w)?;
                gemm(wq, &x, n, &mut out, Some(&pool))?;
                let mut best = f64::MAX;
                for _ in 0..a.passes.max(1) {
                    let t = Instant::now();
                    gemm(wq, &x, n, &mut out, Some(&pool))?;
                    best = best.min(t.elapsed().as_secs_f64());
                }
                let gbs = w.len() as f64 / best / 1e9;
                println!(
                    "| {}{} | {n} | {:.2} | {:.2} | {:.2} | {:.0}% |",
                    ty.name(),
                    if a.huge_pages {
                        format!(" ({pages})")
                    } else {
                        String::new()
                    },
                    best * 1e3,
                    gbs,
                    ceiling / 1e9,
                    100.0 * gbs * 1e9 / ceiling
                );
            }
        }
    }
    Ok(())
}
