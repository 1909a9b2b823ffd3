//! The staging cache with several reads in flight: a demand read issued behind queued
//! predictions is read before them (and before the ones in flight finish), the bytes held never
//! exceed the capacity while calls and predictions race, and a read that fails gives its own
//! expert's error without stopping the other threads.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{footprint, ColdCache, ExpertFiles, Key, Slot};
use crate::gguf::Gguf;

#[path = "../../tests/fixture_util/locate.rs"]
mod locate;

/// Reads held back by a test: an I/O thread about to read a key in `held` waits until it is
/// taken out; every read that got this far is listed in `started`, in order.
#[derive(Default)]
pub(super) struct Gate {
    state: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Default)]
struct GateState {
    held: HashSet<Key>,
    started: Vec<Key>,
}

impl Gate {
    pub(super) fn pass(&self, key: Key) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.started.push(key);
        self.cv.notify_all();
        while st.held.contains(&key) {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn hold(&self, keys: impl IntoIterator<Item = Key>) {
        self.state.lock().unwrap().held.extend(keys);
    }

    fn release_all(&self) {
        self.state.lock().unwrap().held.clear();
        self.cv.notify_all();
    }

    fn started(&self) -> Vec<Key> {
        self.state.lock().unwrap().started.clone()
    }

    /// Waits (at most 10 s) until `n` reads have started.
    fn wait_started(&self, n: usize) -> Vec<Key> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut st = self.state.lock().unwrap();
        while st.started.len() < n && Instant::now() < deadline {
            st = self
                .cv
                .wait_timeout(st, Duration::from_millis(50))
                .unwrap()
                .0;
        }
        st.started.clone()
    }
}

fn fixture() -> (Arc<Gguf>, Vec<Key>) {
    let path = locate::fixture_path("tiny-qwen3moe-Q4_K_M.gguf");
    let g = Arc::new(Gguf::open(&path).expect("fixture"));
    let shape = crate::shape::moe_shape(&g).expect("a MoE fixture");
    let keys = shape
        .moe_layers
        .iter()
        .flat_map(|&l| (0..shape.n_experts as u32).map(move |e| (l as u32, e)))
        .collect();
    (g, keys)
}

fn largest(g: &Gguf, keys: &[Key]) -> u64 {
    keys.iter()
        .map(|&(l, e)| footprint(g, l as usize, e).expect("footprint"))
        .max()
        .expect("experts")
}

const DEPTH: usize = 4;

#[test]
fn a_demand_is_read_before_queued_predictions_and_beside_those_in_flight() {
    let (g, keys) = fixture();
    let layer = keys[0].0;
    let of_layer: Vec<u32> = keys.iter().filter(|k| k.0 == layer).map(|k| k.1).collect();
    // predictions for all but the last expert of the layer: more than DEPTH of them
    let (demanded, predicted) = of_layer.split_last().expect("experts");
    assert!(predicted.len() > 2 * DEPTH, "{} experts", of_layer.len());
    let cache = Arc::new(ColdCache::with_io_depth(g.clone(), 1 << 30, DEPTH).expect("cache"));
    let gate = &cache.shared.gate;
    gate.hold(predicted.iter().map(|&e| (layer, e)));
    cache.prefetch(layer as usize, predicted).expect("prefetch");
    // predictions take all threads but one
    let started = gate.wait_started(DEPTH - 1);
    assert_eq!(started.len(), DEPTH - 1, "{started:?}");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        gate.started().len(),
        DEPTH - 1,
        "a prediction took the thread kept for demand reads"
    );
    // a demand issued now is read while the predictions in flight are still held
    let (tx, rx) = mpsc::channel();
    let c = cache.clone();
    let e = *demanded;
    std::thread::spawn(move || {
        let r = c
            .demand(layer as usize, e)
            .and_then(|()| c.take(layer as usize, e, true));
        let _ = tx.send(r.map(|c| c.is_some()));
    });
    let got = rx.recv_timeout(Duration::from_secs(10));
    let held_back: Vec<bool> = predicted
        .iter()
        .map(|&p| cache.is_ready(layer as usize, p))
        .collect();
    gate.release_all();
    assert!(
        matches!(got, Ok(Ok(true))),
        "the demand read waited behind predictions: {got:?}"
    );
    assert!(!held_back.contains(&true), "{held_back:?}");
    // it started right after the predictions in flight, before every queued one
    let order = gate.wait_started(predicted.len() + 1);
    assert_eq!(order[DEPTH - 1], (layer, e), "{order:?}");
    // the predictions are all read in the end
    for &p in predicted {
        cache.demand(layer as usize, p).expect("demand");
        assert!(cache.take(layer as usize, p, true).expect("read").is_some());
    }
    assert_eq!(cache.stats().misses, 1, "{:?}", cache.stats());
}

#[test]
fn a_hot_step_waiting_on_a_read_parks_the_pools_pollers() {
    let (g, keys) = fixture();
    let (layer, e) = keys[0];
    let cache = Arc::new(ColdCache::with_io_depth(g, 1 << 30, 2).expect("cache"));
    cache.shared.gate.hold([(layer, e)]);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap();
    let (got, (parked, spinning)) = pool.install(|| {
        crate::hot::hot(|| {
            let probe = crate::hot::Probe::current().expect("a hot stretch");
            cache.demand(layer as usize, e).expect("demand");
            // while the read is held back, the pollers must park (none looks for work once the
            // turns under way have ended); then let it go
            let c = cache.clone();
            let watcher = std::thread::spawn(move || {
                let t = Instant::now();
                while probe.parked() == 0 && t.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                // each poller may finish the one look it had begun when the wait began
                let l0 = probe.looks();
                std::thread::sleep(Duration::from_millis(20));
                let spinning = probe.looks() - l0;
                let parked = probe.parked();
                c.shared.gate.release_all();
                (parked, spinning)
            });
            let got = cache.take(layer as usize, e, true);
            (got, watcher.join().expect("watcher"))
        })
    });
    assert!(matches!(got, Ok(Some(_))), "{got:?}");
    assert!(
        parked >= 1,
        "no poller parked while the step waited on the disk"
    );
    assert!(
        spinning <= 3,
        "the pollers spun while the step waited on the disk ({spinning} looks)"
    );
}

#[test]
fn reads_racing_with_calls_stay_within_the_capacity() {
    let (g, keys) = fixture();
    let one = largest(&g, &keys);
    // room for what two callers pin (a copy held, one demanded) and every read in flight: no
    // read ever needs to wait for room, so none may go over
    let capacity = 8 * one;
    assert!(keys.len() as u64 > 2 * 8, "{} experts", keys.len());
    let cache = Arc::new(ColdCache::with_io_depth(g.clone(), capacity, DEPTH).expect("cache"));
    let stop = Arc::new(AtomicBool::new(false));
    let watch = {
        let (c, stop) = (cache.clone(), stop.clone());
        std::thread::spawn(move || {
            // the memory the cache holds (copies, reads in flight, spare buffers), and what it
            // counts: the same, always
            let mut most = 0;
            while !stop.load(Ordering::Relaxed) {
                let st = c.shared.lock();
                let real = st
                    .entries
                    .values()
                    .filter(|en| matches!(en.slot, Slot::Loading | Slot::Ready(_)))
                    .map(|en| en.size)
                    .sum::<u64>()
                    + st.spare.iter().map(|b| b.cap).sum::<u64>();
                if real != st.bytes {
                    return Err(format!("{real} bytes held, {} counted", st.bytes));
                }
                most = most.max(real);
                drop(st);
                std::thread::yield_now();
            }
            Ok(most)
        })
    };
    let callers: Vec<_> = (0..2)
        .map(|t| {
            let (c, g, keys) = (cache.clone(), g.clone(), keys.clone());
            std::thread::spawn(move || {
                for round in 0..3 {
                    for (i, &(l, e)) in keys.iter().enumerate().skip(t) {
                        if (i + round) % 3 == 0 {
                            // predict a few ahead of the call, as the engine does
                            let ahead: Vec<u32> = keys[i + 1..]
                                .iter()
                                .take(6)
                                .filter(|k| k.0 == l)
                                .map(|k| k.1)
                                .collect();
                            c.prefetch(l as usize, &ahead).expect("prefetch");
                        }
                        c.demand(l as usize, e).expect("demand");
                        let copy = c.take(l as usize, e, true).expect("read").expect("copy");
                        let w = g.expert_weights(l as usize, e).expect("expert");
                        assert_eq!(copy.weights(w).unwrap().up.bytes(), w.up.bytes());
                        drop(copy);
                        c.released();
                    }
                }
            })
        })
        .collect();
    for c in callers {
        c.join().expect("caller");
    }
    stop.store(true, Ordering::Relaxed);
    let most = watch.join().expect("watcher").expect("exact count");
    let st = cache.stats();
    assert!(most <= capacity, "{most} bytes held, capacity {capacity}");
    assert!(cache.held_bytes() <= capacity);
    assert!(st.evicted > 0 && st.prefetched > 0, "{st:?}");
    assert!(st.busy_us > 0 && st.read_bandwidth().is_some(), "{st:?}");
}

#[test]
fn a_failed_read_is_that_experts_error_and_the_others_go_on() {
    let (_, keys) = fixture();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("copy.gguf");
    std::fs::copy(locate::fixture_path("tiny-qwen3moe-Q4_K_M.gguf"), &path).expect("copy");
    let g = Arc::new(Gguf::open(&path).expect("copy opens"));
    // cut the file at the start of the expert laid out last: its read comes up short
    let spans: Vec<(Key, u64)> = keys
        .iter()
        .map(|&(l, e)| {
            let s = super::files::expert_spans(&*g, l as usize, e).expect("spans");
            ((l, e), s.iter().map(|s| s.1).min().unwrap())
        })
        .collect();
    let &(cut_key, cut_at) = spans.iter().max_by_key(|s| s.1).expect("experts");
    let ends = |k: Key| {
        let s = super::files::expert_spans(&*g, k.0 as usize, k.1).unwrap();
        s.iter().map(|s| s.1 + s.2).max().unwrap()
    };
    let fine: Vec<Key> = keys
        .iter()
        .copied()
        .filter(|&k| ends(k) <= cut_at)
        .take(12)
        .collect();
    assert!(fine.len() >= DEPTH, "{fine:?}");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(cut_at))
        .expect("truncate");
    let cache = ColdCache::with_io_depth(g.clone(), 1 << 30, DEPTH).expect("cache");
    cache.demand(cut_key.0 as usize, cut_key.1).expect("demand");
    for &(l, e) in &fine {
        cache.demand(l as usize, e).expect("demand");
    }
    let err = cache
        .take(cut_key.0 as usize, cut_key.1, true)
        .expect_err("a read past the end of the file");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("layer {} expert {}", cut_key.0, cut_key.1))
            && msg.contains("short read"),
        "{msg}"
    );
    for &(l, e) in &fine {
        let c = cache
            .take(l as usize, e, true)
            .expect("the other reads go on")
            .expect("copy");
        let w = g.expert_weights(l as usize, e).expect("expert");
        assert_eq!(c.weights(w).unwrap().down.bytes(), w.down.bytes());
    }
    // the failed expert is asked for again and fails again, not wedged
    cache.demand(cut_key.0 as usize, cut_key.1).expect("demand");
    assert!(cache.take(cut_key.0 as usize, cut_key.1, true).is_err());
}

#[test]
fn an_io_depth_outside_its_range_is_refused() {
    let (g, _) = fixture();
    for depth in [0, super::MAX_IO_DEPTH + 1] {
        let err = ColdCache::with_io_depth(g.clone(), 1 << 20, depth)
            .err()
            .expect("refused");
        assert!(err.to_string().contains("I/O depth"), "{err}");
        assert!(ColdCache::start(g.clone(), Some(1 << 20), depth, 0).is_err());
    }
    let c = ColdCache::with_io_depth(g, 1 << 20, 1).expect("depth 1");
    assert_eq!(c.io_depth(), 1);
}

/// Reads expert `k` through `cache` (a demand and its take) and drops the copy.
fn read_one(cache: &ColdCache, (l, e): Key) {
    cache.demand(l as usize, e).expect("demand");
    drop(
        cache
            .take(l as usize, e, true)
            .expect("read")
            .expect("copy"),
    );
    cache.released();
}

#[test]
fn a_loan_from_the_budget_grows_the_cache_and_taking_it_back_evicts_at_once() {
    let (g, keys) = fixture();
    let one = largest(&g, &keys);
    assert!(keys.len() >= 8, "{} experts", keys.len());
    let cache = ColdCache::with_io_depth(g.clone(), 2 * one, 1).expect("cache");
    assert_eq!((cache.capacity(), cache.lent()), (2 * one, 0));
    // 2 experts fit: reading 6 evicts 4
    for &k in &keys[..6] {
        read_one(&cache, k);
    }
    assert!(cache.held_bytes() <= 2 * one);
    assert_eq!(cache.stats().evicted, 4);
    // lent room for 4 more: 6 held, the last 6 read, nothing evicted
    cache.lend(4 * one);
    assert_eq!(cache.capacity(), 6 * one);
    let evicted = cache.stats().evicted;
    for &k in &keys[..6] {
        read_one(&cache, k);
    }
    for &k in &keys[..6] {
        assert!(cache.is_ready(k.0 as usize, k.1), "{k:?} not held");
    }
    assert_eq!(cache.stats().evicted, evicted, "the loan made room");
    let misses = cache.stats().misses;
    for &k in &keys[..6] {
        read_one(&cache, k);
    }
    assert_eq!(cache.stats().misses, misses, "all six were held");
    // the loan taken back: down to its own capacity now, the least recently used gone first
    cache.lend(0);
    assert!(cache.held_bytes() <= 2 * one, "{} held", cache.held_bytes());
    let kept: Vec<bool> = keys[..6]
        .iter()
        .map(|k| cache.is_ready(k.0 as usize, k.1))
        .collect();
    assert_eq!(kept.iter().filter(|&&r| r).count(), 2, "{kept:?}");
    assert!(kept[4] && kept[5], "the two used last stay: {kept:?}");
}

#[test]
fn the_copy_the_router_is_least_likely_to_ask_for_goes_first() {
    let (g, keys) = fixture();
    let one = largest(&g, &keys);
    let layer = keys[0].0;
    let of_layer: Vec<Key> = keys.iter().copied().filter(|k| k.0 == layer).collect();
    assert!(of_layer.len() >= 4, "{} experts", of_layer.len());
    let (a, b, c, d) = (of_layer[0], of_layer[1], of_layer[2], of_layer[3]);
    let held = |cache: &ColdCache| -> Vec<bool> {
        [a, b, c, d]
            .iter()
            .map(|k| cache.is_ready(k.0 as usize, k.1))
            .collect()
    };
    // without scores: least recently used first (a, read first, goes when c comes)
    let lru = ColdCache::with_io_depth(g.clone(), 2 * one, 1).expect("cache");
    for k in [a, b, c] {
        read_one(&lru, k);
    }
    assert_eq!(held(&lru), [false, true, true, false]);
    // the router now favours a: b, the least likely, goes when c comes, although a was read
    // before it; then d evicts c (scored below a), and a stays throughout
    let scored = ColdCache::with_io_depth(g.clone(), 2 * one, 1).expect("cache");
    let mut probs = vec![0.0f32; of_layer.len()];
    probs[a.1 as usize] = 0.6;
    probs[b.1 as usize] = 0.05;
    probs[c.1 as usize] = 0.2;
    scored.score(layer as usize, &probs);
    for k in [a, b, c] {
        read_one(&scored, k);
    }
    assert_eq!(held(&scored), [true, false, true, false]);
    read_one(&scored, d);
    assert_eq!(held(&scored), [true, false, false, true]);
    // scores move half way to each new probability: after two rounds favouring b and d, a
    // (0.6 -> 0.3 -> 0.15) is below d (0 -> 0.25 -> 0.375) and goes when b comes back
    probs[a.1 as usize] = 0.0;
    probs[b.1 as usize] = 0.8;
    probs[d.1 as usize] = 0.5;
    scored.score(layer as usize, &probs);
    scored.score(layer as usize, &probs);
    read_one(&scored, b);
    assert_eq!(held(&scored), [false, true, false, true]);
}
