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
