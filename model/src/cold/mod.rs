//! The cold-expert staging cache (`--cold-cache`): experts outside the resident set read whole
//! from the model file into this process's memory, kept by how likely the router is to ask for
//! them again (then least recently used), instead of being read through the page cache.
//!
//! Why: under a memory limit the page cache holding cold experts is the slack left after the
//! resident set, and when an expert's pages are evicted between the readahead and the layer that
//! uses them, the layer waits for them fault by fault (`MADV_RANDOM`: one page per fault). A
//! staging cache makes every miss one large read of the whole expert (`O_DIRECT` where the file
//! system takes it, so nothing is held twice in the page cache; otherwise a buffered read whose
//! page-cache pages are dropped after the copy), and what is in memory is exactly what the cache
//! holds: never more than `capacity` bytes plus the experts calls are computing and those they
//! wait for when the calls holding the rest do not let go within 100 ms.
//!
//! Reads run on `depth` I/O threads (`--cold-io-depth`, default [`DEFAULT_IO_DEPTH`]): up to
//! that many experts read at once, demand reads (a layer is waiting) before prefetch reads (the
//! one-layer-ahead prediction, [`crate::prefetch`]), and predictions never on the last free
//! thread, so **a demand read never waits behind predictions** (`io.rs`). A prefetch that finds no room without
//! evicting something a call still needs is dropped; a demand read waits for room. A copy
//! counts as used when it is read, so a prediction read ahead is not the first copy the next
//! read evicts before its layer takes it.
//!
//! Which copy goes first: the one whose expert the router is least likely to pick soon, then
//! the least recently used. [`ColdCache::score`] is told each layer's router probabilities
//! (in process, [`crate::prefetch::Prefetcher`]: the next layer's as predicted, so what was
//! read ahead is what is kept) and keeps an exponential average per expert; without scores
//! (expert nodes, or `NIGHTSHIFT_COLD_SCORES=off` for A/B runs) the order is plain LRU. Replaying a recorded decode trace of the skewed Qwen3
//! file, evicting by recent router probability read 11% fewer experts a token than LRU
//! (docs/RESULTS.md). Callers
//! ([`crate::expert::LocalExperts`]) demand a window of at most half the capacity at a time and
//! compute each expert as it arrives, so a prefill chunk that needs more cold experts than fit
//! streams through the cache.
//!
//! The cache reads through [`ExpertFiles`]: where an expert's three matrices are in a mapped
//! model's files. The in-process [`Model`](crate::model::Model) and an expert node's mapped
//! [`Gguf`](crate::gguf::Gguf) both give it, so the engine and `nightshift-expert-node` share
//! this one cache; [`run_cached`] is the one layer call over resident copies and cold experts
//! coming through it.
//!
//! The bytes are the file's bytes in the file's layout, read from the same offsets the map shows:
//! **where a cold expert is read from never changes outputs.**

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use crate::error::ExpertError;
use crate::expert::ExpertWeights;

mod files;
mod io;
mod staged;
mod window;
pub use files::ExpertFiles;
use files::{footprint, n_expert_used};
pub use staged::{run_cached, ClaimedCold};
pub(crate) use window::ColdWindow;

/// File offsets and buffer positions are aligned to this (`O_DIRECT` needs the logical block
/// size; 4 KiB covers every common disk).
const ALIGN: u64 = 4096;

/// (layer, expert)
type Key = (u32, u32);

/// Reads in flight at once by default (`--cold-io-depth`): measured on this project's VM disk
/// (README, cold-cache paragraph).
pub const DEFAULT_IO_DEPTH: usize = 2;

/// Most reads in flight a cache takes (`--cold-io-depth` above it is refused).
pub const MAX_IO_DEPTH: usize = 64;

/// How far an expert's score moves to each new router probability ([`ColdCache::score`]): on
/// the recorded trace weights 0.3 to 1.0 read the same within 1%.
const SCORE_WEIGHT: f32 = 0.5;

/// How long a demanded read waits for room while calls hold copies before it goes over the
/// capacity.
const ROOM_WAIT: Duration = Duration::from_millis(100);

/// `depth` as `--cold-io-depth` takes it: 1 to [`MAX_IO_DEPTH`].
pub fn check_io_depth(depth: usize) -> std::io::Result<()> {
    if (1..=MAX_IO_DEPTH).contains(&depth) {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("cold cache I/O depth {depth}: expected 1 to {MAX_IO_DEPTH} reads in flight"),
    ))
}

/// Memory for one expert: an anonymous mapping on huge pages where the kernel gives them (a
/// fresh 4 KiB-page buffer would cost a page fault per 4 KiB on every read), from `start` for
/// `cap` bytes. Buffers of evicted copies are read into again.
struct Buffer {
    map: memmap2::MmapMut,
    start: usize,
    cap: u64,
}

impl Buffer {
    fn new(cap: u64) -> std::io::Result<Buffer> {
        use crate::weights::HUGE_PAGE;
        let (map, start) = crate::weights::huge_page_map(cap as usize)?;
        // Only the huge pages the buffer fills whole may be huge: one its tail (or a buffer
        // smaller than a huge page) fills in part would take up to 2 MiB of memory the cache
        // does not count (with THP `always`, on first touch).
        let whole = cap as usize / HUGE_PAGE * HUGE_PAGE;
        #[cfg(target_os = "linux")]
        map.advise_range(
            memmap2::Advice::NoHugePage,
            start + whole,
            map.len() - start - whole,
        )?;
        Ok(Buffer { map, start, cap })
    }

    fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.cap as usize]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map[self.start..self.start + self.cap as usize]
    }
}

/// One cold expert read into memory: its three matrices in one page-aligned buffer.
pub struct ColdCopy {
    buf: Buffer,
    ranges: [Range<usize>; 3],
}

impl std::fmt::Debug for ColdCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColdCopy")
            .field("footprint", &self.buf.cap)
            .field("ranges", &self.ranges)
            .finish()
    }
}

impl ColdCopy {
    /// Bytes of memory the copy takes (its aligned buffer).
    pub fn footprint(&self) -> u64 {
        self.buf.cap
    }

    /// `mapped` (the expert's views into the file) pointed at this copy instead.
    pub fn weights<'a>(
        &'a self,
        mapped: ExpertWeights<'a>,
    ) -> Result<ExpertWeights<'a>, nightshift_kernels::KernelError> {
        let b = self.buf.bytes();
        Ok(ExpertWeights {
            gate: mapped.gate.with_bytes(&b[self.ranges[0].clone()])?,
            up: mapped.up.with_bytes(&b[self.ranges[1].clone()])?,
            down: mapped.down.with_bytes(&b[self.ranges[2].clone()])?,
        })
    }
}

/// Counters of the cache (all since start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ColdStats {
    /// experts a call asked for that were in memory (or already being read)
    pub hits: u64,
    /// experts a call asked for that had to be read for it
    pub misses: u64,
    /// experts read ahead on a prediction
    pub prefetched: u64,
    /// predictions dropped for want of room, or still queued when their layer started
    pub dropped: u64,
    /// experts evicted
    pub evicted: u64,
    /// bytes read from the file
    pub bytes_read: u64,
    /// time calls waited for an expert, in microseconds
    pub wait_us: u64,
    /// time at least one read was in flight, in microseconds (`bytes_read` over it is the
    /// bandwidth the reads got)
    pub busy_us: u64,
}

impl ColdStats {
    /// Share of the cold experts calls needed that were in memory or on their way.
    pub fn hit_rate(&self) -> Option<f64> {
        let n = self.hits + self.misses;
        (n > 0).then(|| self.hits as f64 / n as f64)
    }

    /// Bytes per second read while reads were in flight.
    pub fn read_bandwidth(&self) -> Option<f64> {
        (self.busy_us > 0).then(|| self.bytes_read as f64 / (self.busy_us as f64 / 1e6))
    }

    /// One line for logs and reports.
    pub fn summary(&self) -> String {
        format!(
            "cold cache: {} hits, {} misses ({}), {} read ahead, {} predictions dropped, {} evicted, {:.1} MiB read ({} while reading), {:.1} ms waited",
            self.hits,
            self.misses,
            self.hit_rate()
                .map_or("-".into(), |h| format!("{:.1}% hits", 100.0 * h)),
            self.prefetched,
            self.dropped,
            self.evicted,
            self.bytes_read as f64 / (1u64 << 20) as f64,
            self.read_bandwidth()
                .map_or("-".into(), |b| format!("{:.0} MiB/s", b / (1u64 << 20) as f64)),
            self.wait_us as f64 / 1000.0
        )
    }
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    prefetched: AtomicU64,
    dropped: AtomicU64,
    evicted: AtomicU64,
    bytes_read: AtomicU64,
    wait_us: AtomicU64,
    busy_us: AtomicU64,
}

enum Slot {
    /// waiting for an I/O thread (holds no memory yet)
    Queued,
    /// taken by an I/O thread that is making room for it (holds no memory yet)
    Picked,
    /// being read (its footprint is reserved)
    Loading,
    Ready(Arc<ColdCopy>),
    Failed(String),
}

struct Entry {
    slot: Slot,
    /// footprint (aligned bytes) of the expert; once read, of its buffer
    size: u64,
    /// LRU clock of the last use
    last: u64,
    /// calls that demanded it and have not taken it yet: not evictable while > 0
    wanted: u32,
}

impl Entry {
    /// An expert waiting for an I/O thread, demanded by `wanted` calls.
    fn queued(size: u64, wanted: u32) -> Entry {
        Entry {
            slot: Slot::Queued,
            size,
            last: 0,
            wanted,
        }
    }
}

#[derive(Default)]
struct State {
    entries: HashMap<Key, Entry>,
    /// each expert's score by layer and expert ([`ColdCache::score`]): an exponential average
    /// of its router probabilities; experts never scored count 0
    scores: Vec<Vec<f32>>,
    /// footprints of Loading and Ready entries, and spare buffers
    bytes: u64,
    /// buffers of evicted copies, to read into again
    spare: Vec<Buffer>,
    tick: u64,
    demand: VecDeque<Key>,
    prefetch: VecDeque<Key>,
    /// predictions taken by I/O threads and not finished (at most `depth - 1`, or 1)
    prefetching: usize,
    /// demand reads taken by I/O threads and not finished (no prediction starts meanwhile)
    demanding: usize,
    /// reads in flight, and since when one has been (the disk's busy time)
    in_flight: usize,
    busy_since: Option<Instant>,
    closed: bool,
    /// I/O threads running
    workers: usize,
    /// every I/O thread has ended (a cache whose reads can never finish must not be waited on)
    io_gone: bool,
}

struct Shared {
    files: Arc<dyn ExpertFiles>,
    readers: Vec<RwLock<io::ReadFile>>,
    /// the cache's own capacity (`--cold-cache`)
    capacity: u64,
    /// what the memory budget lends it on top: the budget the resident set does not use
    lent: AtomicU64,
    /// I/O threads: reads in flight at most
    depth: usize,
    /// whether [`ColdCache::score`] is heeded (`NIGHTSHIFT_COLD_SCORES=off`: plain LRU, for A/B
    /// runs)
    scored: bool,
    state: Mutex<State>,
    changed: Condvar,
    counters: Counters,
    /// holds reads back where a test says (the order they start in is what it checks)
    #[cfg(test)]
    gate: tests::Gate,
}

/// The staging cache and its I/O threads (module doc). The threads end with the cache.
pub struct ColdCache {
    shared: Arc<Shared>,
}

impl Drop for ColdCache {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.changed.notify_all();
    }
}

impl ColdCache {
    /// A cache of at most `capacity` bytes of cold experts of `files` (the experts a call is
    /// computing may add to it), with [`DEFAULT_IO_DEPTH`] I/O threads.
    pub fn new(files: Arc<dyn ExpertFiles>, capacity: u64) -> std::io::Result<ColdCache> {
        ColdCache::with_io_depth(files, capacity, DEFAULT_IO_DEPTH)
    }

    /// A cache of at most `capacity` bytes of cold experts of `files` reading up to `depth`
    /// experts at once (`depth` I/O threads; 1 to [`MAX_IO_DEPTH`], an `InvalidInput` error
    /// otherwise).
    pub fn with_io_depth(
        files: Arc<dyn ExpertFiles>,
        capacity: u64,
        depth: usize,
    ) -> std::io::Result<ColdCache> {
        check_io_depth(depth)?;
        let readers = files
            .gguf()
            .paths()
            .map(|p| io::open_direct(p).map(RwLock::new))
            .collect::<std::io::Result<Vec<_>>>()?;
        let shared = Arc::new(Shared {
            files,
            readers,
            capacity,
            lent: AtomicU64::new(0),
            depth,
            scored: std::env::var("NIGHTSHIFT_COLD_SCORES").map_or(true, |v| v != "off"),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            counters: Counters::default(),
            #[cfg(test)]
            gate: Default::default(),
        });
        io::spawn(&shared, depth)?;
        Ok(ColdCache { shared })
    }

    /// The cache `--cold-cache` and `--cold-io-depth` ask for (on `serve`/`generate` and on
    /// expert nodes), its I/O threads started: `capacity` None (`auto`) is
    /// [`ColdCache::default_capacity`] beside `lent` bytes the memory budget will lend it
    /// ([`ColdCache::lend`]); 0 is no cache (cold experts are read through the page cache).
    pub fn start(
        files: Arc<dyn ExpertFiles>,
        capacity: Option<u64>,
        depth: usize,
        lent: u64,
    ) -> std::io::Result<Option<ColdCache>> {
        check_io_depth(depth)?;
        let capacity = capacity.unwrap_or_else(|| ColdCache::default_capacity(&*files, lent));
        if capacity == 0 {
            return Ok(None);
        }
        ColdCache::with_io_depth(files, capacity, depth).map(Some)
    }

    /// Reads in flight at most (its I/O threads).
    pub fn io_depth(&self) -> usize {
        self.shared.depth
    }

    /// The default capacity for `files` (`--cold-cache auto`): [`ColdCache::auto_capacity`] of
    /// the memory this process can still take ([`crate::weights::mem_available`], cgroup limits
    /// included) beyond `lent` bytes the memory budget will lend the cache (free now, so not
    /// counted twice).
    pub fn default_capacity(files: &dyn ExpertFiles, lent: u64) -> u64 {
        let free = crate::weights::mem_available().unwrap_or(0);
        ColdCache::auto_capacity(free.saturating_sub(lent), files)
    }

    /// What `--cold-cache auto` takes of `available` bytes: half, and at least
    /// [`ColdCache::decode_capacity`]. The KV cache's default takes a quarter; the last quarter
    /// stays for the process. Cold experts are read with `O_DIRECT`, so memory left to the page
    /// cache holds none of them: under a disk capped at 200 MB/s, 47 MiB of cache (the decode
    /// minimum) against 200 MiB in the same cgroup limit took a 50%-budget decode from 8.4 to
    /// 34 tok/s (`memory-report`, docs/RESULTS.md).
    pub fn auto_capacity(available: u64, files: &dyn ExpertFiles) -> u64 {
        (available / 2).max(ColdCache::decode_capacity(files))
    }

    /// What a one-row decode step needs: the experts two MoE layers use (this layer's and the
    /// next one's, read ahead), at the largest expert's footprint.
    pub fn decode_capacity(files: &dyn ExpertFiles) -> u64 {
        let Some(shape) = crate::shape::moe_shape(files.gguf()) else {
            return 0;
        };
        let mut largest = 0u64;
        for &l in &shape.moe_layers {
            for e in 0..shape.n_experts as u32 {
                if let Ok(f) = footprint(files, l, e) {
                    largest = largest.max(f);
                }
            }
        }
        2 * n_expert_used(files.gguf()).max(1) as u64 * largest
    }

    /// Tells the cache how likely layer `layer`'s experts are to be asked for soon: `probs[e]`
    /// the router's probability of expert `e` (plus the layer's selection bias where it has one;
    /// over several rows, the largest). Each expert's score moves [`SCORE_WEIGHT`] of the way to
    /// it; eviction takes the copy with the lowest score first (module doc). Only the eviction
    /// order depends on it, never an output.
    pub fn score(&self, layer: usize, probs: &[f32]) {
        if !self.shared.scored {
            return;
        }
        let mut st = self.shared.lock();
        if st.scores.len() <= layer {
            st.scores.resize_with(layer + 1, Vec::new);
        }
        let row = &mut st.scores[layer];
        if row.len() < probs.len() {
            row.resize(probs.len(), 0.0);
        }
        for (s, &p) in row.iter_mut().zip(probs) {
            *s += SCORE_WEIGHT * (p - *s);
        }
    }

    /// Expert `e` of `layer`'s score ([`ColdCache::score`]), if it was ever scored.
    pub fn score_of(&self, layer: usize, e: u32) -> Option<f32> {
        self.shared
            .lock()
            .scores
            .get(layer)?
            .get(e as usize)
            .copied()
    }

    /// Bytes the cache may hold: its own capacity and what the memory budget lends it.
    pub fn capacity(&self) -> u64 {
        self.shared.capacity()
    }

    /// Lends the cache `bytes` of the memory budget on top of its own capacity: the part of
    /// `--memory-budget` the resident set leaves (`resident::ExpertResidency` lends it whenever
    /// its set changes), so a plan that keeps fewer experts resident gives the rest to the
    /// cache, which keeps what was used last. A smaller loan evicts at once, in eviction order
    /// (module doc), down to the new capacity (copies calls hold stay until they are dropped).
    pub fn lend(&self, bytes: u64) {
        self.shared.lent.store(bytes, Ordering::Relaxed);
        let mut st = self.shared.lock();
        let cap = self.shared.capacity();
        while st.bytes > cap {
            if let Some(b) = st.spare.pop() {
                st.bytes = st.bytes.saturating_sub(b.cap);
            } else if !st.evict_one(&self.shared.counters) {
                break;
            }
        }
        drop(st);
        self.shared.changed.notify_all();
    }

    /// Bytes of the memory budget lent to the cache ([`ColdCache::lend`]).
    pub fn lent(&self) -> u64 {
        self.shared.lent.load(Ordering::Relaxed)
    }

    /// Footprint of expert `e` of `layer` in the cache.
    pub fn footprint(&self, layer: usize, e: u32) -> Result<u64, ExpertError> {
        footprint(&*self.shared.files, layer, e)
    }

    /// Bytes held or being read now.
    pub fn held_bytes(&self) -> u64 {
        self.shared.lock().bytes
    }

    /// Whether expert `e` of `layer` is in memory now.
    pub fn is_ready(&self, layer: usize, e: u32) -> bool {
        matches!(
            self.shared.lock().entries.get(&(layer as u32, e)),
            Some(Entry {
                slot: Slot::Ready(_),
                ..
            })
        )
    }

    pub fn stats(&self) -> ColdStats {
        let c = &self.shared.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ColdStats {
            hits: g(&c.hits),
            misses: g(&c.misses),
            prefetched: g(&c.prefetched),
            dropped: g(&c.dropped),
            evicted: g(&c.evicted),
            bytes_read: g(&c.bytes_read),
            wait_us: g(&c.wait_us),
            busy_us: g(&c.busy_us),
        }
    }

    /// Reads the experts of `layer` in `experts` ahead, where room can be made without evicting
    /// what a call still needs (a prediction: dropped otherwise).
    pub fn prefetch(&self, layer: usize, experts: &[u32]) -> Result<(), ExpertError> {
        let mut queued = 0;
        let sizes: Vec<u64> = experts
            .iter()
            .map(|&e| self.footprint(layer, e))
            .collect::<Result<_, _>>()?;
        let mut st = self.shared.lock();
        for (&e, size) in experts.iter().zip(sizes) {
            let key = (layer as u32, e);
            if st.entries.contains_key(&key) {
                continue;
            }
            st.entries.insert(key, Entry::queued(size, 0));
            st.prefetch.push_back(key);
            queued += 1;
        }
        drop(st);
        if queued > 0 {
            self.shared.changed.notify_all();
        }
        Ok(())
    }

    /// Asks for expert `e` of `layer` for a call: it is kept (not evicted) until [`take`]n, and
    /// read first if it is not in memory.
    ///
    /// [`take`]: ColdCache::take
    pub fn demand(&self, layer: usize, e: u32) -> Result<(), ExpertError> {
        let size = self.footprint(layer, e)?;
        let key = (layer as u32, e);
        let mut st = self.shared.lock();
        let c = &self.shared.counters;
        match st.entries.get_mut(&key) {
            Some(en) if !matches!(en.slot, Slot::Failed(_)) => {
                en.wanted += 1;
                c.hits.fetch_add(1, Ordering::Relaxed);
                if matches!(en.slot, Slot::Queued) {
                    // a queued prediction is now needed: read it before other predictions
                    st.prefetch.retain(|k| *k != key);
                    st.demand.push_back(key);
                }
            }
            _ => {
                st.entries.insert(key, Entry::queued(size, 1));
                st.demand.push_back(key);
                c.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        drop(st);
        self.shared.changed.notify_all();
        Ok(())
    }

    /// The copy of an expert [`demand`]ed before, waiting for its read; `Ok(None)` unless
    /// `wait` when it is not in memory yet.
    ///
    /// [`demand`]: ColdCache::demand
    pub fn take(
        &self,
        layer: usize,
        e: u32,
        wait: bool,
    ) -> Result<Option<Arc<ColdCopy>>, ExpertError> {
        let t = Instant::now();
        match self.take_since(layer, e, false, t)? {
            Some(c) => Ok(Some(c)),
            None if !wait => Ok(None),
            // a wait on the disk: a hot step's pollers park until it ends
            None => crate::hot::idle(|| self.take_since(layer, e, true, t)),
        }
    }

    /// [`ColdCache::take`], its wait counted from `t`.
    fn take_since(
        &self,
        layer: usize,
        e: u32,
        wait: bool,
        t: Instant,
    ) -> Result<Option<Arc<ColdCopy>>, ExpertError> {
        let key = (layer as u32, e);
        let mut st = self.shared.lock();
        loop {
            let tick = st.tick + 1;
            let io_gone = st.io_gone;
            let Some(en) = st.entries.get_mut(&key) else {
                return Err(ExpertError::Backend(format!(
                    "cold cache: layer {layer} expert {e} was taken without being demanded"
                )));
            };
            match &en.slot {
                Slot::Ready(c) => {
                    let c = c.clone();
                    en.wanted = en.wanted.saturating_sub(1);
                    en.last = tick;
                    st.tick = tick;
                    self.shared
                        .counters
                        .wait_us
                        .fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                    return Ok(Some(c));
                }
                Slot::Failed(msg) => {
                    let msg = msg.clone();
                    en.wanted = en.wanted.saturating_sub(1);
                    if en.wanted == 0 {
                        st.entries.remove(&key);
                    }
                    return Err(ExpertError::Backend(format!(
                        "cold expert (layer {layer} expert {e}): {msg}"
                    )));
                }
                Slot::Queued | Slot::Picked | Slot::Loading if !wait => return Ok(None),
                Slot::Queued | Slot::Picked | Slot::Loading if io_gone => {
                    return Err(ExpertError::Backend(
                        "cold cache: its I/O threads have stopped".into(),
                    ));
                }
                Slot::Queued | Slot::Picked | Slot::Loading => {
                    st = self
                        .shared
                        .changed
                        .wait_timeout(st, Duration::from_secs(1))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }

    /// Drops the predictions for `layer` not yet being read: the layer has started and
    /// [`demand`]ed what it uses, so the rest would only take the disk from reads it waits
    /// for. Returns how many were dropped.
    ///
    /// [`demand`]: ColdCache::demand
    pub fn settle(&self, layer: usize) -> usize {
        let l = layer as u32;
        let mut st = self.shared.lock();
        let stale: Vec<Key> = st
            .prefetch
            .iter()
            .copied()
            .filter(|k| {
                k.0 == l
                    && st
                        .entries
                        .get(k)
                        .is_some_and(|en| en.wanted == 0 && matches!(en.slot, Slot::Queued))
            })
            .collect();
        for k in &stale {
            st.entries.remove(k);
        }
        st.prefetch.retain(|k| !stale.contains(k));
        self.shared
            .counters
            .dropped
            .fetch_add(stale.len() as u64, Ordering::Relaxed);
        stale.len()
    }

    /// Gives up a [`demand`] that will not be taken (a call that failed half way).
    ///
    /// [`demand`]: ColdCache::demand
    pub fn forget(&self, layer: usize, e: u32) {
        let mut st = self.shared.lock();
        if let Some(en) = st.entries.get_mut(&(layer as u32, e)) {
            en.wanted = en.wanted.saturating_sub(1);
        }
        drop(st);
        self.shared.changed.notify_all();
    }

    /// Tells the I/O threads that copies taken have been dropped (room may be free).
    pub fn released(&self) {
        self.shared.changed.notify_all();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn capacity(&self) -> u64 {
        self.capacity
            .saturating_add(self.lent.load(Ordering::Relaxed))
    }
}

impl State {
    /// Evicts the copy no call holds or still needs with the lowest score, of those the least
    /// recently used, its buffer kept as a spare; false when there is none.
    fn evict_one(&mut self, c: &Counters) -> bool {
        let score = |&(l, e): &Key| {
            let row = self.scores.get(l as usize).map_or(&[][..], Vec::as_slice);
            row.get(e as usize).copied().unwrap_or(0.0)
        };
        let victim = self
            .entries
            .iter()
            .filter(|(_, en)| {
                en.wanted == 0 && matches!(&en.slot, Slot::Ready(c) if Arc::strong_count(c) == 1)
            })
            .min_by(|(a, ea), (b, eb)| score(a).total_cmp(&score(b)).then(ea.last.cmp(&eb.last)))
            .map(|(k, _)| *k);
        let Some(en) = victim.and_then(|v| self.entries.remove(&v)) else {
            return false;
        };
        c.evicted.fetch_add(1, Ordering::Relaxed);
        match en.slot {
            Slot::Ready(copy) => match Arc::try_unwrap(copy) {
                Ok(copy) => self.spare.push(copy.buf),
                Err(_) => self.bytes = self.bytes.saturating_sub(en.size),
            },
            _ => self.bytes = self.bytes.saturating_sub(en.size),
        }
        true
    }

    /// A read taken by an I/O thread has ended (read, failed or dropped).
    fn end_pick(&mut self, demanded: bool) {
        if demanded {
            self.demanding -= 1;
        } else {
            self.prefetching -= 1;
        }
    }

    /// A read starts: the disk is busy from the first read in flight.
    fn start_read(&mut self) {
        if self.in_flight == 0 {
            self.busy_since = Some(Instant::now());
        }
        self.in_flight += 1;
    }

    /// A read ended: the time the disk was busy is counted when the last one in flight ends.
    fn end_read(&mut self, c: &Counters) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.in_flight == 0 {
            if let Some(t) = self.busy_since.take() {
                c.busy_us
                    .fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests;
