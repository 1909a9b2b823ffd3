//! Keeping a rayon pool's workers awake through a stretch of parallel ops.
//!
//! A decode step is a chain of short parallel ops (projections, attention, experts, head) with a
//! little serial work between them. Rayon parks an idle worker after a few dozen yields, and waking
//! it costs a futex and a reschedule: on the 2-vCPU cloud VMs we measure this costs ~55 µs per op
//! after any serial gap of 60 µs or more (an 80 µs op took 134-141 µs), which is ~30 ops x 55 µs of
//! a 20 ms step. [`hot`] runs a closure while every other worker of the current pool polls for work
//! with [`rayon::yield_now`] instead of parking, so each op starts at once (85-87 µs). ggml's
//! thread pool spins between ops for the same reason.
//!
//! Only for stretches that keep the pool busy: while the closure waits on something outside the
//! process (a remote expert node on the same machine), the polling workers would burn cores that
//! process needs.

use std::sync::atomic::{AtomicBool, Ordering};

/// Runs `f` on this thread while the other workers of the current rayon pool poll for work
/// instead of parking. On a thread outside any pool, or in a one-thread pool, it is just `f()`.
pub fn hot<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let others = match rayon::current_thread_index() {
        Some(_) => rayon::current_num_threads().saturating_sub(1),
        None => 0,
    };
    if others == 0 {
        return f();
    }
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        for _ in 0..others {
            s.spawn(|_| poll_until(&done));
        }
        // release the pollers even if `f` panics (the scope then waits for them and re-panics)
        struct Release<'a>(&'a AtomicBool);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let _release = Release(&done);
        f()
    })
}

/// Runs pending pool work as it appears until `done`.
fn poll_until(done: &AtomicBool) {
    while !done.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => {}
            _ => std::hint::spin_loop(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn parallel_ops_inside_hot_give_the_same_results_and_use_every_worker() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let (sum, workers) = pool.install(|| {
            hot(|| {
                let mut workers = std::collections::BTreeSet::new();
                let mut sum = 0u64;
                for _ in 0..50 {
                    let part: Vec<(u64, usize)> = (0..64u64)
                        .into_par_iter()
                        .map(|i| {
                            // enough work per item that idle workers steal some
                            let mut x = i;
                            for _ in 0..20_000 {
                                x = std::hint::black_box(
                                    x.wrapping_mul(6364136223846793005).wrapping_add(1),
                                );
                            }
                            std::hint::black_box(x);
                            (i, rayon::current_thread_index().unwrap())
                        })
                        .collect();
                    sum += part.iter().map(|p| p.0).sum::<u64>();
                    workers.extend(part.iter().map(|p| p.1));
                }
                (sum, workers)
            })
        });
        assert_eq!(sum, 50 * (0..64u64).sum::<u64>());
        assert!(workers.len() >= 2, "only workers {workers:?} ran the ops");
    }

    #[test]
    fn outside_a_pool_and_in_a_one_thread_pool_it_just_runs() {
        assert_eq!(hot(|| 7), 7);
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        assert_eq!(
            one.install(|| hot(|| (0..10).into_par_iter().sum::<i32>())),
            45
        );
    }

    #[test]
    fn a_panic_inside_releases_the_pollers() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let r = pool.install(|| std::panic::catch_unwind(|| hot(|| panic!("boom"))));
        assert!(r.is_err());
        // the pool still works (the poller ended)
        assert_eq!(pool.install(|| (0..10).into_par_iter().sum::<i32>()), 45);
    }
}
