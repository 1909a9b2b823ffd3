//! `hot` stretches under the shape of a decode step: many short stretches of small nested
//! parallel ops. Its own test binary: it keeps both cores spinning for seconds, which would starve
//! the timing-sensitive tests of the library's own binary running beside it.

use nightshift_model::hot::hot;
use rayon::prelude::*;

/// Many short stretches of small nested parallel ops (a step's shape): no worker may be
/// left waiting on a poller that runs inside a job the stretch itself waits for (a poller
/// taken from a worker's own queue while it waits in a join used to spin there until the
/// stretch ended, and the stretch waited on that join: a deadlock).
#[test]
fn short_stretches_of_nested_ops_never_deadlock() {
    // (the old pollers deadlocked in 2 of 3 runs of 30,000 stretches on 2 threads; 3 threads
    // on a 2-core machine are slow for any spinning, so fewer there)
    for (threads, stretches) in [(2, 100_000u64), (3, 300)] {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut total = 0u64;
            for _ in 0..stretches {
                total += pool.install(|| {
                    hot(|| {
                        let mut s = 0u64;
                        for _ in 0..4 {
                            s += (0..64u32)
                                .into_par_iter()
                                .with_max_len(1)
                                .map(|i| {
                                    let i = i as u64;
                                    (0..8u64)
                                        .into_par_iter()
                                        .map(|j| std::hint::black_box(i * j))
                                        .sum::<u64>()
                                })
                                .sum::<u64>();
                        }
                        s
                    })
                });
            }
            let _ = tx.send(total);
        });
        let per_op: u64 = (0..64u64)
            .map(|i| (0..8u64).map(|j| i * j).sum::<u64>())
            .sum();
        match rx.recv_timeout(std::time::Duration::from_secs(120)) {
            Ok(total) => assert_eq!(total, stretches * 4 * per_op),
            Err(_) => panic!("{threads} threads: a hot stretch deadlocked"),
        }
    }
}
