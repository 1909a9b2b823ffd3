//! Kernel-level timing of the attention at depth: one prefill tile ([`attend_tile`]: T tokens x
//! the 8 query heads of one Qwen3-30B-A3B kv head) and one decode row ([`attend_heads`],
//! the 8 heads of one token) over D cached positions in the paged cache's layout (blocks of 16
//! positions, each its own allocation, the 4 kv heads of a position side by side). Each call
//! takes the next kv head's group (as a layer's tasks do) and is timed in this thread's CPU
//! time (`CLOCK_THREAD_CPUTIME_ID`; wall time if that clock fails), so other processes on
//! the machine do not count; prints the best and median of the calls, and GFLOP/s counting a
//! multiply and an add per K.q and p.V term.
//!
//!     cargo run --release -p nightshift-kernels --example attn_tile -- [DEPTH...]
//!
//! (default depths 4096 and 16384; `ATTN_ITERS` calls per case, default 12; `ATTN_TOKENS` tokens
//! per tile, default `tile_rows(depth) / 8`, what the model runs; `ATTN_SAME_HEAD=1` keeps
//! kv head 1). A before/after comparison runs two builds of this example alternately.

use std::hint::black_box;
use std::time::Instant;

use nightshift_kernels::attn::{attend_heads, attend_tile, tile_rows, Heads, KvView};

/// Nanoseconds this thread has run (`CLOCK_THREAD_CPUTIME_ID`), or `None` if the clock fails.
fn thread_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// Seconds of one call of `f`: thread CPU time when available.
fn timed(f: &mut impl FnMut()) -> f64 {
    let (w, c) = (Instant::now(), thread_ns());
    f();
    match (c, thread_ns()) {
        (Some(a), Some(b)) => (b - a) as f64 * 1e-9,
        _ => w.elapsed().as_secs_f64(),
    }
}

/// Best and median seconds of `iters` calls (after one warm-up call).
fn best_median(iters: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let mut t: Vec<f64> = (0..iters).map(|_| timed(&mut f)).collect();
    t.sort_by(f64::total_cmp);
    (t[0], t[t.len() / 2])
}

fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut r = nightshift_kernels::rng::SplitMix64::new(seed);
    (0..len).map(|_| r.gaussian()).collect()
}

fn main() {
    let depths: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("depths are positive integers"))
        .collect();
    let depths = if depths.is_empty() {
        vec![4096, 16384]
    } else {
        depths
    };
    let iters: usize = std::env::var("ATTN_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
        .max(1);
    let (n_head, n_head_kv, d) = (32, 4, 128);
    let hd = Heads {
        n_head,
        n_head_kv,
        dk: d,
        dv: d,
        scale: 1.0 / (d as f32).sqrt(),
    };
    let tokens_env: Option<usize> = std::env::var("ATTN_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok());
    let (g, block) = (n_head / n_head_kv, 16);
    let width = n_head_kv * d;
    println!(
        "attention of one kv head's group, kv heads in turn (8 query heads, dk = dv = 128), blocks of {block}, {iters} calls, thread CPU time"
    );
    println!("| case | depth | best ms | median ms | GFLOP/s (best) |");
    println!("|---|---:|---:|---:|---:|");
    for depth in depths {
        let tokens = tokens_env.unwrap_or(tile_rows(depth) / g).max(1);
        let n = depth + tokens;
        let segs = n.div_ceil(block);
        let k: Vec<Vec<f32>> = (0..segs)
            .map(|s| values(block * width, 2 * s as u64))
            .collect();
        let v: Vec<Vec<f32>> = (0..segs)
            .map(|s| values(block * width, 2 * s as u64 + 1))
            .collect();
        let kr: Vec<&[f32]> = k.iter().map(|s| &s[..]).collect();
        let vr: Vec<&[f32]> = v.iter().map(|s| &s[..]).collect();
        let view = KvView {
            k: &kr,
            k_stride: width,
            v: &vr,
            v_stride: width,
            block,
            n_kv: n,
        };
        // each call runs the next kv head's group, as the model's tasks go through a layer's
        // heads; with ATTN_SAME_HEAD=1 always kv head 1 (its K/V rows stay in L3)
        let same = std::env::var("ATTN_SAME_HEAD").is_ok_and(|v| v == "1");
        let mut call = 0usize;
        let mut next_h0 = move || {
            call += 1;
            if same {
                g
            } else {
                (call % n_head_kv) * g
            }
        };
        let q = values(tokens * g * d, 7);
        let n_kv: Vec<usize> = (depth + 1..=n).collect();
        let mut scores = Vec::new();
        let mut out = vec![0f32; tokens * g * d];
        let terms: usize = n_kv.iter().map(|&t| t * g * 2 * d).sum();
        let (best, med) = best_median(iters, || {
            attend_tile(
                black_box(&q),
                &n_kv,
                next_h0(),
                g,
                &view,
                hd,
                false,
                &mut scores,
                &mut out,
            );
            black_box(&out);
        });
        let gf = 2.0 * terms as f64 / best * 1e-9;
        println!(
            "| tile {tokens}x{g} | {depth} | {:.3} | {:.3} | {gf:.1} |",
            best * 1e3,
            med * 1e3
        );
        let one = KvView {
            n_kv: depth,
            ..view
        };
        let mut o1 = vec![0f32; g * d];
        let (best, med) = best_median(iters * 4, || {
            attend_heads(
                black_box(&q[..g * d]),
                next_h0(),
                g,
                &one,
                hd,
                false,
                &mut scores,
                &mut o1,
            );
            black_box(&o1);
        });
        let gf = 2.0 * (depth * g * 2 * d) as f64 / best * 1e-9;
        println!(
            "| decode row x{g} | {depth} | {:.3} | {:.3} | {gf:.1} |",
            best * 1e3,
            med * 1e3
        );
    }
}
