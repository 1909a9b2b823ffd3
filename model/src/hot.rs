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
//! process needs. A wait inside the stretch that is not compute (a cold expert's read from disk)
//! goes through [`idle`]: the pollers park until it ends, so a step that waits on the disk does
//! not spin a core for as long as the read takes.
//!
//! **A poller never holds a worker for longer than one turn** (one piece of work, or a few
//! microseconds of looking, or an [`idle`] wait); each turn queues the next on its worker. A
//! worker waiting in a join takes queued jobs from its own queue, a poller among them, and a
//! poller that looped until the stretch ended would sit on top of that join, which the stretch
//! waits for: the pool deadlocked (seen in `nightshift serve` under a fuzzer, reproduced by
//! `model/tests/hot_stretches.rs`).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// How many times a poller's turn looks for work before it queues the next turn.
const SPINS_PER_TURN: usize = 64;

/// The pollers of one [`hot`] stretch.
#[derive(Default)]
struct Pollers {
    done: AtomicBool,
    /// [`idle`] sections in progress on the stretch's thread: the pollers park while above 0
    paused: Mutex<usize>,
    resumed: Condvar,
    /// fast path of `paused` for the polling loop
    any_paused: AtomicBool,
    /// pollers parked right now (what the tests look at)
    parked: AtomicUsize,
    /// looks for work the pollers have made (what the tests look at; not counted outside them,
    /// a poller's turn is on the step's critical path)
    #[cfg(test)]
    looks: AtomicUsize,
}

thread_local! {
    /// The [`hot`] stretch whose closure runs on this thread, if any.
    static CURRENT: RefCell<Option<Arc<Pollers>>> = const { RefCell::new(None) };
}

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
    let pollers = Arc::new(Pollers::default());
    let me = rayon::current_thread_index();
    rayon::scope(|s| {
        // one poller per other worker to start with, each on its own thread (a poller spawned
        // as an ordinary job could be stolen by another's and leave a worker asleep); this
        // thread's copy returns at once (it runs `f`)
        let p = &pollers;
        s.spawn_broadcast(move |s, ctx| {
            if Some(ctx.index()) != me {
                p.turn(s);
            }
        });
        // release the pollers even if `f` panics (the scope then waits for them and re-panics),
        // and give this thread back the stretch it was in before
        struct Release<'a> {
            pollers: &'a Pollers,
            outer: Option<Arc<Pollers>>,
        }
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                CURRENT.with(|c| *c.borrow_mut() = self.outer.take());
                self.pollers.done.store(true, Ordering::Release);
                let _g = self
                    .pollers
                    .paused
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                self.pollers.resumed.notify_all();
            }
        }
        let outer = CURRENT.with(|c| c.borrow_mut().replace(pollers.clone()));
        let _release = Release {
            pollers: &pollers,
            outer,
        };
        f()
    })
}

/// Runs `f`, a wait that is not compute (a read from disk), parking the pollers of the [`hot`]
/// stretch this thread runs, if any, until it returns. Elsewhere it is just `f()`.
pub fn idle<R>(f: impl FnOnce() -> R) -> R {
    let Some(p) = CURRENT.with(|c| c.borrow().clone()) else {
        return f();
    };
    struct Resume(Arc<Pollers>);
    impl Drop for Resume {
        fn drop(&mut self) {
            let mut n = self.0.paused.lock().unwrap_or_else(|p| p.into_inner());
            *n -= 1;
            if *n == 0 {
                self.0.any_paused.store(false, Ordering::Release);
                self.0.resumed.notify_all();
            }
        }
    }
    {
        let mut n = p.paused.lock().unwrap_or_else(|p| p.into_inner());
        *n += 1;
        p.any_paused.store(true, Ordering::Release);
    }
    let _resume = Resume(p);
    f()
}

/// The pollers of the [`hot`] stretch this thread runs, seen from any thread (tests).
#[cfg(test)]
#[derive(Clone)]
pub(crate) struct Probe(Arc<Pollers>);

#[cfg(test)]
impl Probe {
    /// The stretch this thread runs, if any.
    pub(crate) fn current() -> Option<Probe> {
        CURRENT.with(|c| c.borrow().clone()).map(Probe)
    }

    /// How many of its pollers are parked now.
    pub(crate) fn parked(&self) -> usize {
        self.0.parked.load(Ordering::Relaxed)
    }

    /// How many looks for work its pollers have made so far.
    pub(crate) fn looks(&self) -> usize {
        self.0.looks.load(Ordering::Relaxed)
    }
}

impl Pollers {
    /// One turn of a poller: runs one piece of pending pool work (or spins briefly when there is
    /// none), or waits out an [`idle`] section, then queues the next turn on this worker, until the
    /// stretch is done.
    ///
    /// A turn is bounded, never a loop until the stretch ends: a worker waiting in a join (inside
    /// a piece of the stretch's work it stole) may take a queued poller from its own queue, and a
    /// poller that then polled until the stretch ended would sit on top of that join, which the
    /// stretch waits for: a deadlock. A turn returns after one piece of work, and the join below
    /// goes on.
    fn turn<'s>(&'s self, s: &rayon::Scope<'s>) {
        if self.done.load(Ordering::Acquire) {
            return;
        }
        if self.any_paused.load(Ordering::Acquire) {
            self.park();
        } else {
            // up to a few microseconds of looking before the next turn (fewer re-queues while
            // the pool has nothing to hand out); no more looks once an idle section begins
            for _ in 0..SPINS_PER_TURN {
                if self.any_paused.load(Ordering::Acquire) {
                    break;
                }
                #[cfg(test)]
                self.looks.fetch_add(1, Ordering::Relaxed);
                match rayon::yield_now() {
                    Some(rayon::Yield::Executed) => break,
                    _ => std::hint::spin_loop(),
                }
            }
        }
        if !self.done.load(Ordering::Acquire) {
            s.spawn(move |s| self.turn(s));
        }
    }

    /// Waits while an [`idle`] section runs and the stretch is not done.
    fn park(&self) {
        let mut n = self.paused.lock().unwrap_or_else(|p| p.into_inner());
        self.parked.fetch_add(1, Ordering::Relaxed);
        while *n > 0 && !self.done.load(Ordering::Acquire) {
            n = self.resumed.wait(n).unwrap_or_else(|p| p.into_inner());
        }
        self.parked.fetch_sub(1, Ordering::Relaxed);
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
    fn pollers_park_through_an_idle_wait_and_poll_again_after_it() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let (polling, parked, spinning, after, outside) = pool.install(|| {
            hot(|| {
                let probe = Probe::current().unwrap();
                // the pollers are polling before the wait
                let t = std::time::Instant::now();
                while probe.looks() == 0 && t.elapsed().as_secs() < 5 {}
                let polling = probe.looks() > 0;
                // during it, a poller parks; each may finish at most the one look it had begun
                // when the wait began, however long the wait lasts
                let (parked, spinning) = idle(|| {
                    let l0 = probe.looks();
                    let t = std::time::Instant::now();
                    while probe.parked() == 0 && t.elapsed().as_secs() < 5 {
                        std::hint::spin_loop();
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    (probe.parked(), probe.looks() - l0)
                });
                // after the wait every worker takes part again
                let mut workers = std::collections::BTreeSet::new();
                for _ in 0..200 {
                    let w: Vec<usize> = (0..64u64)
                        .into_par_iter()
                        .map(|i| {
                            let mut x = i;
                            for _ in 0..20_000 {
                                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                            }
                            std::hint::black_box(x);
                            rayon::current_thread_index().unwrap()
                        })
                        .collect();
                    workers.extend(w);
                    if workers.len() == 4 {
                        break;
                    }
                }
                (polling, parked, spinning, workers.len(), idle(|| 5))
            })
        });
        assert!(polling, "no poller looked for work before the wait");
        assert!(parked >= 1, "no poller parked during the idle wait");
        assert!(
            spinning <= 3,
            "the pollers looked for work {spinning} times during the idle wait"
        );
        assert_eq!(after, 4, "the pollers did not come back after the wait");
        assert_eq!(outside, 5);
        // outside any stretch, idle just runs
        assert_eq!(idle(|| 9), 9);
        assert!(CURRENT.with(|c| c.borrow().is_none()));
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
