//! The expert store: the experts this node serves, as views into the memory-mapped GGUF (cold) or
//! as copies in node-local memory (hot, resident). Copies are made by the node's pinned worker
//! threads so that first touch places their pages on the node's NUMA domain. Experts can be loaded
//! and dropped while serving (live rebalance); computing holds a read lock, so a drop waits for
//! the layer calls that use the expert to finish. Copies are made by the model's `resident`
//! module (one arena per load, huge-page advised, freed with the last expert copied into it).
//!
//! With a staging cache (`--cold-cache`, the model's `cold` module) a layer call reads the held
//! experts that are not resident whole into the cache instead of faulting them in from the map,
//! through the engine's own [`run_cached`]: the call's cold experts are asked for first and
//! its resident experts computed while they load; a shared call (the claim board) reads each
//! cold expert it takes a group of ([`ClaimedCold`]).
//!
//! The coordinator's prefetch hints (the experts it predicts the next MoE layer will ask this
//! node for, [`ExpertStore::hint`]) go to the same cache as predictions, through the model's
//! [`PrefetchLedger`], which also scores them against the calls that follow (in time, late,
//! wasted: [`HintStats`]). Experts a hint names that are not held here are ignored and counted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use nightshift_atlas_core::placement::ModelShape;
use nightshift_model::cold::{run_cached, ClaimedCold, ColdCache};
use nightshift_model::expert::{run_claimed, run_grouped, ExpertWeights};
use nightshift_model::gguf::Gguf;
use nightshift_model::prefetch::{PrefetchLedger, PrefetchStats};
use nightshift_model::resident::{copy_experts, CopyError, ExpertCopy};
use nightshift_model::{ActRows, ExpertError, ExpertPair};

/// Errors of the store (wrapped into `tonic::Status` by the service).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("model has no expert layers: expected ffn_gate_exps tensors, found none")]
    NotMoe,
    #[error("layer {layer} expert {expert} does not exist in this model")]
    NoSuchExpert { layer: u32, expert: u32 },
    #[error("expert weights: {0}")]
    Expert(#[from] ExpertError),
    #[error("the store lock was poisoned by a panicking thread")]
    Poisoned,
    #[error(
        "loading would hold {needed} bytes of resident experts, capacity memory_bytes is {capacity}"
    )]
    OverCapacity { needed: u64, capacity: u64 },
    #[error("cannot allocate memory for resident copies: {0}")]
    Alloc(std::io::Error),
}

/// The MoE shape of a model as the placement validator wants it.
pub fn model_shape(g: &Gguf) -> Result<ModelShape, StoreError> {
    let s = nightshift_model::shape::moe_shape(g).ok_or(StoreError::NotMoe)?;
    Ok(ModelShape {
        moe_layers: s.moe_layers,
        n_experts: s.n_experts,
        expert_bytes: s.expert_bytes,
    })
}

/// One held expert.
struct Held {
    resident: Option<ExpertCopy>,
    bytes: u64,
}

/// Inventory line of one held expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldInfo {
    pub layer: u32,
    pub expert: u32,
    pub bytes: u64,
    pub resident: bool,
}

/// Counters of the coordinator's prefetch hints on a node (all since start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HintStats {
    /// hints received (with a layer call, or alone)
    pub hints: u64,
    /// experts they named that this node does not hold (or out of range): ignored
    pub ignored: u64,
    /// how the hinted experts fared, as the in-process prefetch's: `issued` the cold ones
    /// handed to the cache, `in_time` / `late` / `wasted` as there
    pub prefetch: PrefetchStats,
}

impl HintStats {
    /// One line for logs (the node's counterpart of `PrefetchStats::summary`).
    pub fn summary(&self) -> String {
        let p = &self.prefetch;
        let pct = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{:.1}%", 100.0 * x));
        format!(
            "prefetch hints: {} received, {} experts ignored (not held here), {} cold experts read ahead, {} cold experts needed (hinted before their layer {}: in time {}, late {}), {} wasted, precision {}, recall {}",
            self.hints,
            self.ignored,
            p.issued,
            p.cold_needed,
            pct(p.cold_hit_rate()),
            p.in_time,
            p.late,
            p.wasted,
            pct(p.precision()),
            pct(p.recall()),
        )
    }
}

/// The hints a node received and the ledger scoring them.
struct Hints {
    ledger: PrefetchLedger,
    received: AtomicU64,
    ignored: AtomicU64,
}

/// The experts a node serves.
pub struct ExpertStore {
    gguf: Arc<Gguf>,
    held: RwLock<HashMap<(u32, u32), Held>>,
    mlock: bool,
    /// Most bytes of resident copies (0: unlimited), the node's `memory_bytes`.
    capacity: u64,
    /// Most bytes resident copies and the staging cache's loan hold together (`u64::MAX`: the
    /// capacity alone), [`ExpertStore::with_loan_bound`].
    loan_bound: u64,
    /// Serialises loads, so the capacity check and the insert see the same store.
    loading: std::sync::Mutex<()>,
    /// The staging cache non-resident experts are read through (`--cold-cache`).
    cold: Option<Arc<ColdCache>>,
    hints: Hints,
}

impl ExpertStore {
    /// An empty store over a mapped model. `mlock` pins resident copies in RAM (best effort).
    pub fn new(gguf: Arc<Gguf>, mlock: bool) -> ExpertStore {
        ExpertStore {
            held: RwLock::new(HashMap::new()),
            mlock,
            capacity: 0,
            loan_bound: u64::MAX,
            loading: std::sync::Mutex::new(()),
            cold: None,
            hints: Hints {
                ledger: PrefetchLedger::new(
                    &nightshift_model::shape::moe_shape(&gguf)
                        .map(|s| s.moe_layers)
                        .unwrap_or_default(),
                ),
                received: AtomicU64::new(0),
                ignored: AtomicU64::new(0),
            },
            gguf,
        }
    }

    /// Reads held experts that are not resident whole through `cache` (a cache over this
    /// store's model) in [`ExpertStore::run`], instead of from the map. With a capacity, the
    /// cache is lent what the resident copies leave of it, now and after every load and drop
    /// ([`ColdCache::lend`], as the in-process engine's `ExpertResidency` lends its budget).
    pub fn with_cold_cache(mut self, cache: Arc<ColdCache>) -> ExpertStore {
        self.cold = Some(cache);
        self.lend(self.resident_bytes());
        self
    }

    /// The capacity `resident` bytes of copies leave (0 without a capacity: nothing to lend),
    /// within the loan bound.
    pub fn spare(&self, resident: u64) -> u64 {
        self.capacity.min(self.loan_bound).saturating_sub(resident)
    }

    /// Bounds what resident copies and the staging cache's loan hold together by `bytes`: a
    /// capacity (a placement's `memory_bytes`) larger than the memory the node has left beside
    /// its resident copies is not lent beyond that memory.
    pub fn with_loan_bound(mut self, bytes: u64) -> ExpertStore {
        self.loan_bound = bytes;
        self
    }

    /// Lends the staging cache (if any) what `resident` bytes of copies leave of the capacity.
    fn lend(&self, resident: u64) {
        if let Some(c) = &self.cold {
            c.lend(self.spare(resident));
        }
    }

    /// The staging cache of cold experts, if any.
    pub fn cold_cache(&self) -> Option<&Arc<ColdCache>> {
        self.cold.as_ref()
    }

    /// A prefetch hint from the coordinator: `experts` of `layer` will probably be asked for
    /// next. With a staging cache the held ones that are not resident are read ahead (after
    /// the reads calls wait for); experts not held here, or of a layer out of range, are
    /// ignored and counted. Never fails: a hint changes no answer.
    pub fn hint(&self, layer: u32, experts: &[u32]) {
        let h = &self.hints;
        h.received.fetch_add(1, Ordering::Relaxed);
        let Ok(held) = self.held.read() else {
            return;
        };
        let mut valid: Vec<u32> = Vec::with_capacity(experts.len());
        let mut ignored = 0u64;
        for &e in experts {
            if held.contains_key(&(layer, e)) {
                valid.push(e);
            } else {
                ignored += 1;
            }
        }
        h.ignored.fetch_add(ignored, Ordering::Relaxed);
        let Some(cache) = &self.cold else {
            return;
        };
        let resident = |e: u32| held.get(&(layer, e)).is_some_and(|x| x.resident.is_some());
        if let Err(e) = h
            .ledger
            .read_ahead(cache, layer as usize, &valid, &resident)
        {
            tracing::debug!(layer, "prefetch hint not read ahead: {e}");
        }
    }

    /// The counters of the coordinator's prefetch hints.
    pub fn hint_stats(&self) -> HintStats {
        HintStats {
            hints: self.hints.received.load(Ordering::Relaxed),
            ignored: self.hints.ignored.load(Ordering::Relaxed),
            prefetch: self.hints.ledger.stats(),
        }
    }

    /// Scores the hints for `layer` against a call of it that used `experts` (with a staging
    /// cache only), `ready(e)` whether cold expert `e` was in memory as the call started.
    fn score_hints(
        &self,
        held: &HashMap<(u32, u32), Held>,
        layer: u32,
        experts: &[u32],
        ready: &dyn Fn(u32) -> bool,
    ) {
        let cold = |e: u32| held.get(&(layer, e)).is_some_and(|x| x.resident.is_none());
        self.hints
            .ledger
            .call(layer as usize, experts, &cold, ready);
    }

    /// Limits resident copies to `bytes` (0: unlimited): a load that would exceed it fails
    /// whole, before anything is copied.
    pub fn with_capacity(mut self, bytes: u64) -> ExpertStore {
        self.capacity = bytes;
        self
    }

    /// The mapped weights of an expert of the model and their size in bytes.
    fn mapped(&self, layer: u32, expert: u32) -> Result<(ExpertWeights<'_>, u64), StoreError> {
        let w =
            ExpertWeights::from_gguf(&self.gguf, layer as usize, expert as usize).map_err(|e| {
                match e {
                    ExpertError::UnknownExpert { .. } => StoreError::NoSuchExpert { layer, expert },
                    other => StoreError::Expert(other),
                }
            })?;
        let bytes = w.bytes() as u64;
        Ok((w, bytes))
    }

    /// How many of `experts`, taken in order, fit in `bytes` of resident copies.
    pub fn fitting(&self, experts: &[(u32, u32)], bytes: u64) -> Result<usize, StoreError> {
        let mut used = 0u64;
        for (i, &(layer, expert)) in experts.iter().enumerate() {
            used += self.mapped(layer, expert)?.1;
            if used > bytes {
                return Ok(i);
            }
        }
        Ok(experts.len())
    }

    /// Bytes of resident copies held now.
    pub fn resident_bytes(&self) -> u64 {
        self.held.read().map_or(0, |h| {
            h.values()
                .filter(|x| x.resident.is_some())
                .map(|x| x.bytes)
                .sum()
        })
    }

    /// The mapped model.
    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    /// Adds experts; `resident` ones are copied into node-local memory on `pool`'s pinned
    /// threads. Already-held experts are upgraded to resident when asked, never downgraded.
    /// Either all experts are added or none (a missing expert fails the whole call).
    pub fn load(
        &self,
        experts: &[(u32, u32)],
        resident: bool,
        pool: &rayon::ThreadPool,
    ) -> Result<usize, StoreError> {
        let _one_load = self.loading.lock().map_err(|_| StoreError::Poisoned)?;
        // With a capacity: the resident bytes once the load is done.
        let mut after = None;
        if resident && self.capacity > 0 {
            let held = self.held.read().map_err(|_| StoreError::Poisoned)?;
            let mut needed = 0u64;
            let mut seen = std::collections::HashSet::new();
            for &(layer, expert) in experts {
                let key = (layer, expert);
                if held.get(&key).is_some_and(|h| h.resident.is_some()) || !seen.insert(key) {
                    continue;
                }
                needed += self.mapped(layer, expert)?.1;
            }
            let now: u64 = held
                .values()
                .filter(|x| x.resident.is_some())
                .map(|x| x.bytes)
                .sum();
            if now + needed > self.capacity {
                return Err(StoreError::OverCapacity {
                    needed: now + needed,
                    capacity: self.capacity,
                });
            }
            after = Some(now + needed);
        }
        // The loan is taken back before the copies are made (the cache evicts at once), so
        // copies and loan never hold more than the capacity together; a failed load gives it
        // back.
        if let Some(then) = after {
            self.lend(then);
        }
        let loaded = self.load_checked(experts, resident, pool);
        if after.is_some() {
            self.lend(self.resident_bytes());
        }
        loaded
    }

    /// [`ExpertStore::load`] once the capacity is checked (the loading lock held).
    fn load_checked(
        &self,
        experts: &[(u32, u32)],
        resident: bool,
        pool: &rayon::ThreadPool,
    ) -> Result<usize, StoreError> {
        // Which experts get a copy (once each, not those resident already); every expert is
        // checked to exist before anything is copied.
        let mut to_copy: Vec<(u32, u32)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut sizes: Vec<((u32, u32), u64)> = Vec::with_capacity(experts.len());
        {
            let held = self.held.read().map_err(|_| StoreError::Poisoned)?;
            for &(layer, expert) in experts {
                let key = (layer, expert);
                sizes.push((key, self.mapped(layer, expert)?.1));
                if resident
                    && !held.get(&key).is_some_and(|h| h.resident.is_some())
                    && seen.insert(key)
                {
                    to_copy.push(key);
                }
            }
        }
        // Copied on the pinned threads (first touch: the pages land on their NUMA node).
        let mut copies: HashMap<(u32, u32), ExpertCopy> =
            copy_experts(&self.gguf, &to_copy, Some(pool), false)
                .map_err(|e| match e {
                    CopyError::Alloc { source, .. } => StoreError::Alloc(source),
                    CopyError::Expert(e) => StoreError::Expert(e),
                })?
                .into_iter()
                .collect();
        if self.mlock {
            if let Some(c) = copies.values().next() {
                lock_in_ram(c.arena_bytes());
            }
        }
        let mut fresh: Vec<((u32, u32), Held)> = sizes
            .into_iter()
            .map(|(key, bytes)| {
                let resident = copies.remove(&key);
                (key, Held { resident, bytes })
            })
            .collect();
        let mut held = self.held.write().map_err(|_| StoreError::Poisoned)?;
        let n = fresh.len();
        for (key, h) in fresh.drain(..) {
            match held.get_mut(&key) {
                Some(old) if old.resident.is_some() => {}
                Some(old) => old.resident = h.resident,
                None => {
                    held.insert(key, h);
                }
            }
        }
        Ok(n)
    }

    /// Drops experts; returns how many were held. Freed resident bytes go to the staging
    /// cache's loan.
    pub fn drop_experts(&self, experts: &[(u32, u32)]) -> Result<usize, StoreError> {
        let _one_load = self.loading.lock().map_err(|_| StoreError::Poisoned)?;
        let dropped = {
            let mut held = self.held.write().map_err(|_| StoreError::Poisoned)?;
            experts.iter().filter(|k| held.remove(k).is_some()).count()
        };
        self.lend(self.resident_bytes());
        Ok(dropped)
    }

    /// Whether this node holds the expert.
    pub fn holds(&self, layer: u32, expert: u32) -> bool {
        self.held
            .read()
            .map(|h| h.contains_key(&(layer, expert)))
            .unwrap_or(false)
    }

    /// The inventory, sorted by (layer, expert).
    pub fn inventory(&self) -> Vec<HeldInfo> {
        let Ok(held) = self.held.read() else {
            return Vec::new();
        };
        let mut v: Vec<HeldInfo> = held
            .iter()
            .map(|(&(layer, expert), h)| HeldInfo {
                layer,
                expert,
                bytes: h.bytes,
                resident: h.resident.is_some(),
            })
            .collect();
        v.sort_by_key(|h| (h.layer, h.expert));
        v
    }

    /// Computes the layer call `pairs` of `layer` into `out` (one `n_embd` row per pair), as
    /// `run_grouped` over [`ExpertStore::with_layer`]'s weights; with a cold cache the experts
    /// that are not resident come through it. The store cannot change while it runs.
    pub fn run(
        &self,
        layer: u32,
        acts: &ActRows,
        pairs: &[ExpertPair],
        n_embd: usize,
        out: &mut [f32],
        pool: Option<&rayon::ThreadPool>,
    ) -> Result<(), StoreError> {
        let Some(cache) = &self.cold else {
            return self
                .with_layer(layer, |w| run_grouped(w, acts, pairs, n_embd, out, pool))?
                .map_err(StoreError::from);
        };
        let held = self.held.read().map_err(|_| StoreError::Poisoned)?;
        let used: Vec<u32> = pairs.iter().map(|p| p.expert).collect();
        self.score_hints(&held, layer, &used, &|e| cache.is_ready(layer as usize, e));
        let mapped = |expert: u32| self.held_views(&held, layer, expert).map(|(_, w)| w);
        let copy = |expert: u32| held.get(&(layer, expert)).and_then(|h| h.resident.as_ref());
        run_cached(
            cache,
            layer as usize,
            &mapped,
            &copy,
            acts,
            pairs,
            n_embd,
            out,
            pool,
        )?;
        Ok(())
    }

    /// Computes the expert groups of the layer call `pairs` of `layer` that `claim` hands out
    /// (a shared call, `run_claimed`) into `out`; returns the pairs computed. With a cold cache
    /// the non-resident experts of the groups taken come through it. The store cannot change
    /// while it runs.
    #[allow(clippy::too_many_arguments)]
    pub fn run_claimed(
        &self,
        layer: u32,
        acts: &ActRows,
        pairs: &[ExpertPair],
        n_embd: usize,
        out: &mut [f32],
        pool: Option<&rayon::ThreadPool>,
        claim: &(dyn Fn(usize) -> Option<usize> + Sync),
    ) -> Result<Vec<u32>, StoreError> {
        let held = self.held.read().map_err(|_| StoreError::Poisoned)?;
        let mut cold: Vec<u32> = Vec::new();
        if self.cold.is_some() {
            for p in pairs {
                let resident = held
                    .get(&(layer, p.expert))
                    .is_some_and(|h| h.resident.is_some());
                if !resident && !cold.contains(&p.expert) {
                    cold.push(p.expert);
                }
            }
        }
        let cached = self.cold.as_deref().map(|cache| ClaimedCold {
            cache,
            layer: layer as usize,
            experts: &cold,
        });
        // which cold experts were in memory as the call started, for scoring the hints against
        // the groups this node then takes
        let ready: Vec<u32> = match &self.cold {
            Some(cache) => cold
                .iter()
                .copied()
                .filter(|&e| cache.is_ready(layer as usize, e))
                .collect(),
            None => Vec::new(),
        };
        let weights = |expert: u32| self.weights(&held, layer, expert);
        let done = run_claimed(
            weights,
            acts,
            pairs,
            n_embd,
            out,
            pool,
            claim,
            cached.as_ref(),
        )?;
        if self.cold.is_some() {
            let used: Vec<u32> = done.iter().map(|&i| pairs[i as usize].expert).collect();
            self.score_hints(&held, layer, &used, &|e| ready.contains(&e));
        }
        Ok(done)
    }

    /// Held expert `expert` of `layer` and its mapped views (an error for one not held).
    fn held_views<'a>(
        &'a self,
        held: &'a HashMap<(u32, u32), Held>,
        layer: u32,
        expert: u32,
    ) -> Result<(&'a Held, ExpertWeights<'a>), ExpertError> {
        let h = held
            .get(&(layer, expert))
            .ok_or(ExpertError::UnknownExpert {
                layer: layer as usize,
                expert,
            })?;
        Ok((
            h,
            ExpertWeights::from_gguf(&self.gguf, layer as usize, expert as usize)?,
        ))
    }

    /// The weights of held expert `expert` of `layer`: its resident copy, else its mapped views.
    fn weights<'a>(
        &'a self,
        held: &'a HashMap<(u32, u32), Held>,
        layer: u32,
        expert: u32,
    ) -> Result<ExpertWeights<'a>, ExpertError> {
        let (h, w) = self.held_views(held, layer, expert)?;
        Ok(match &h.resident {
            Some(c) => c.weights(w)?,
            None => w,
        })
    }

    /// Runs `f` with a function giving the weights of held experts of `layer`; the store cannot
    /// change while `f` runs.
    pub fn with_layer<R>(
        &self,
        layer: u32,
        f: impl for<'a> FnOnce(&'a dyn Fn(u32) -> Result<ExpertWeights<'a>, ExpertError>) -> R,
    ) -> Result<R, StoreError> {
        let held = self.held.read().map_err(|_| StoreError::Poisoned)?;
        let lookup = |expert: u32| self.weights(&held, layer, expert);
        Ok(f(&lookup))
    }
}

/// Best-effort `mlock` of a resident copy (needs CAP_IPC_LOCK or a high RLIMIT_MEMLOCK).
fn lock_in_ram(buf: &[u8]) {
    if buf.is_empty() {
        return;
    }
    // SAFETY: the pointer and length describe a live allocation owned by the caller; mlock only
    // changes paging of those pages and does not touch their contents.
    let rc = unsafe { libc::mlock(buf.as_ptr().cast(), buf.len()) };
    if rc != 0 {
        tracing::warn!(
            "mlock of {} bytes failed: {}",
            buf.len(),
            std::io::Error::last_os_error()
        );
    }
}
