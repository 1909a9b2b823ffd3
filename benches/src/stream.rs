//! A STREAM-style triad (`a[i] = b[i] + s·c[i]` over f64 arrays far larger than the caches) to
//! measure the memory bandwidth the roofline divides by. Counts 24 bytes per element, as STREAM
//! does (write-allocate traffic not counted), and reports the best of several passes.

use std::time::Instant;

use rayon::prelude::*;

/// Best triad bandwidth in bytes/s with `threads` threads over arrays of `n` f64.
pub fn triad_bandwidth(
    n: usize,
    threads: usize,
    passes: usize,
) -> Result<f64, rayon::ThreadPoolBuildError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()?;
    let chunk = n.div_ceil(threads.max(1) * 8).max(1 << 14);
    let mut a = vec![0f64; n];
    let b = vec![1.5f64; n];
    let c = vec![2.5f64; n];
    let s = 3.0f64;
    let mut best = 0f64;
    pool.install(|| {
        // first touch in parallel so pages spread like the timed passes
        a.par_chunks_mut(chunk).for_each(|x| x.fill(0.0));
        for _ in 0..passes.max(1) {
            let t = Instant::now();
            a.par_chunks_mut(chunk)
                .zip(b.par_chunks(chunk))
                .zip(c.par_chunks(chunk))
                .for_each(|((a, b), c)| {
                    for ((a, b), c) in a.iter_mut().zip(b).zip(c) {
                        *a = b + s * c;
                    }
                });
            let secs = t.elapsed().as_secs_f64();
            best = best.max(24.0 * n as f64 / secs);
        }
    });
    std::hint::black_box(&a);
    Ok(best)
}

/// Best read-only bandwidth in bytes/s over `buf` with `threads` threads: each thread sums its
/// contiguous share as `streams` interleaved sequential streams (as a GEMM tile reads several
/// weight rows at once), 64 bytes per stream and step, with and without a software prefetch 1 KiB
/// ahead (the better is kept). The ceiling a weight-streaming kernel can reach on this machine.
pub fn read_bandwidth(
    buf: &[u8],
    threads: usize,
    streams: usize,
    passes: usize,
) -> Result<f64, rayon::ThreadPoolBuildError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()?;
    let streams = streams.max(1);
    let share = (buf.len() / threads.max(1)).max(1);
    let mut best = 0f64;
    for prefetch in [false, true] {
        for _ in 0..passes.max(1) {
            let t = Instant::now();
            let sum: u64 = pool.install(|| {
                buf.par_chunks(share)
                    .map(|c| sum_streams(c, streams, prefetch))
                    .reduce(|| 0, |a, b| a ^ b)
            });
            std::hint::black_box(sum);
            best = best.max(buf.len() as f64 / t.elapsed().as_secs_f64());
        }
    }
    Ok(best)
}

/// Wrapping sum of `c` read as `streams` equal sequential streams, 64 bytes of each per step.
fn sum_streams(c: &[u8], streams: usize, prefetch: bool) -> u64 {
    let steps = c.len() / 64 / streams;
    let mut acc = [0u64; 8];
    for i in 0..steps {
        for s in 0..streams {
            let o = (s * steps + i) * 64;
            let line: &[u8; 64] = match c[o..o + 64].try_into() {
                Ok(l) => l,
                Err(_) => continue,
            };
            #[cfg(target_arch = "x86_64")]
            if prefetch {
                // SAFETY: a prefetch never faults, whatever the address.
                unsafe {
                    core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                        line.as_ptr().wrapping_add(1024) as *const i8,
                    )
                };
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = prefetch;
            for (a, w) in acc.iter_mut().zip(line.chunks_exact(8)) {
                *a = a.wrapping_add(u64::from_le_bytes([
                    w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7],
                ]));
            }
        }
    }
    acc.iter().fold(0, |x, y| x ^ y)
}
