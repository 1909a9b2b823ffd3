//! Resident copies of routed experts, and the in-process engine's resident set under a memory
//! budget.
//!
//! [`copy_experts`] is the one way an expert becomes resident, on expert nodes and in process:
//! its three matrices are copied from the mapped file into one anonymous, huge-page-advised arena
//! per call (on the caller's pool, so first touch puts the pages where that pool runs), and the
//! file pages are released from this process's page tables. An [`ExpertCopy`] holds its arena
//! alive; the arena is freed with the last copy made into it.
//!
//! [`ExpertResidency`] is the set the in-process engine keeps resident (`--memory-budget`): at
//! most `budget` bytes of copies, every other expert read from the file map (page cache). It can
//! be replaced while serving ([`ExpertResidency::set`]): adding experts copies only the new ones
//! into a fresh arena; a set that drops any expert is rebuilt from scratch after dropping the old
//! copies, so the arenas alive never hold more than the budget (arenas are freed whole; the budget
//! counts the experts' bytes, as placements do, and each matrix adds < 64 bytes of alignment). Lookups
//! hold a read lock for one layer call, so a swap waits for the calls using the old copies.
//! Copies are the file's blocks, in the order the active kernel tier reads fastest
//! (`nightshift_kernels::dispatch::resident_layout`: on the aarch64 SDOT/SMMLA tiers Q8_0,
//! Q4_0, Q3_K, Q4_K, Q5_K and Q6_K are repacked four rows at a time, same bytes, same length; elsewhere
//! the file's order):
//! **which experts are resident never changes outputs.**

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, RwLock};

use nightshift_kernels::dispatch::resident_layout;
use nightshift_kernels::formats::repack::{repack, Layout};
use rayon::prelude::*;
use rayon::ThreadPool;

use crate::cold::ColdCache;
use crate::error::ExpertError;
use crate::expert::ExpertWeights;
use crate::gguf::{AccessHint, Gguf};

/// Alignment of each copy in an arena (a cache line).
const COPY_ALIGN: usize = 64;

/// One anonymous mapping holding the copies one call made, from `start` (2 MiB aligned) for
/// `bytes`, advised to use transparent huge pages (unless `NIGHTSHIFT_HUGE_PAGES=off`): the
/// kernels stream each expert through 2 MiB pages instead of 4 KiB ones (`stream-report
/// --huge-pages`: Q3_K 43.7 -> 37.2 ms, Q4_K +7-10%, Q2_K/Q6_K +3-5%).
struct Arena {
    map: memmap2::MmapMut,
    start: usize,
    bytes: usize,
}

/// A resident copy of one expert's three matrices (ranges of a shared arena).
pub struct ExpertCopy {
    arena: Arc<Arena>,
    gate: Range<usize>,
    up: Range<usize>,
    down: Range<usize>,
    /// The order of gate, up and down in the arena.
    layouts: [Layout; 3],
}

impl ExpertCopy {
    /// Bytes of the three matrices.
    pub fn bytes(&self) -> u64 {
        (self.gate.len() + self.up.len() + self.down.len()) as u64
    }

    /// `mapped` (the expert's views into the file) pointed at this copy instead (an error only
    /// if the copy's lengths disagree with the matrices, which `copy_experts` rules out).
    pub fn weights<'a>(
        &'a self,
        mapped: ExpertWeights<'a>,
    ) -> Result<ExpertWeights<'a>, nightshift_kernels::KernelError> {
        let m = &self.arena.map;
        Ok(ExpertWeights {
            gate: (mapped.gate.with_bytes(&m[self.gate.clone()])?).in_layout(self.layouts[0])?,
            up: (mapped.up.with_bytes(&m[self.up.clone()])?).in_layout(self.layouts[1])?,
            down: (mapped.down.with_bytes(&m[self.down.clone()])?).in_layout(self.layouts[2])?,
        })
    }

    /// The copies of the arena this copy lives in (for `mlock`).
    pub fn arena_bytes(&self) -> &[u8] {
        let a = &self.arena;
        &a.map[a.start..a.start + a.bytes]
    }
}

/// Errors of making copies.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("{0}")]
    Expert(#[from] ExpertError),
    #[error("cannot allocate {bytes} bytes for resident experts: {source}")]
    Alloc {
        bytes: usize,
        source: std::io::Error,
    },
}

/// Copies the experts `keys` (layer, expert; distinct) of `g` into one fresh arena on `pool`
/// (None: the calling thread), releasing their mapped pages, and with `evict` also their
/// page-cache pages (a process under a memory limit should not hold both; nodes sharing the
/// file's cache do not evict). Nothing is copied when an expert does not exist.
pub fn copy_experts(
    g: &Gguf,
    keys: &[(u32, u32)],
    pool: Option<&ThreadPool>,
    evict: bool,
) -> Result<Vec<((u32, u32), ExpertCopy)>, CopyError> {
    let mut total = 0usize;
    let mut plan: Vec<((u32, u32), [Range<usize>; 3], [Layout; 3])> =
        Vec::with_capacity(keys.len());
    for &(layer, expert) in keys {
        let w = ExpertWeights::from_gguf(g, layer as usize, expert as usize)?;
        let mut at = |len: usize| {
            let r = total..total + len;
            total += len.div_ceil(COPY_ALIGN) * COPY_ALIGN;
            r
        };
        plan.push((
            (layer, expert),
            [
                at(w.gate.bytes().len()),
                at(w.up.bytes().len()),
                at(w.down.bytes().len()),
            ],
            [w.gate, w.up, w.down].map(|m| resident_layout(m.ty(), m.rows())),
        ));
    }
    if plan.is_empty() {
        return Ok(Vec::new());
    }
    let (mut map, start) =
        crate::weights::huge_page_map(total).map_err(|source| CopyError::Alloc {
            bytes: total,
            source,
        })?;
    {
        // disjoint destination slices, one per expert, in plan order
        let mut rest: &mut [u8] = &mut map[start..start + total];
        type Job<'d> = ((u32, u32), [Layout; 3], &'d mut [u8]);
        let mut jobs: Vec<Job<'_>> = Vec::with_capacity(plan.len());
        let mut consumed = 0;
        for (key, r, layouts) in &plan {
            let end = r[2].end;
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(end - consumed);
            consumed = end;
            rest = tail;
            jobs.push((*key, *layouts, mine));
        }
        let copy = |((layer, expert), layouts, dest): Job<'_>| {
            let w = ExpertWeights::from_gguf(g, layer as usize, expert as usize)?;
            // the three matrices read ahead in large requests (the mapping may be advised
            // `MADV_RANDOM` by the cold path, and faults would then read one page at a time)
            for m in [&w.gate, &w.up, &w.down] {
                g.advise_bytes(m.bytes(), AccessHint::WillNeed);
            }
            let mut at = 0;
            for (m, layout) in [w.gate, w.up, w.down].into_iter().zip(layouts) {
                let len = m.bytes().len();
                // the file's bytes, repacked for the active tier where it has a layout
                repack(&m, layout, &mut dest[at..at + len])?;
                // the copy serves from now on: stop counting the mapped pages too
                g.release_mapped(m.bytes());
                if evict {
                    g.evict_cached(m.bytes());
                }
                at += len.div_ceil(COPY_ALIGN) * COPY_ALIGN;
            }
            Ok::<(), ExpertError>(())
        };
        match pool {
            Some(p) => p.install(|| jobs.into_par_iter().try_for_each(copy))?,
            None => jobs.into_iter().try_for_each(copy)?,
        }
    }
    let arena = Arc::new(Arena {
        map,
        start,
        bytes: total,
    });
    let shift = |r: &Range<usize>| start + r.start..start + r.end;
    Ok(plan
        .iter()
        .map(|(key, [g, u, d], layouts)| {
            (
                *key,
                ExpertCopy {
                    arena: arena.clone(),
                    gate: shift(g),
                    up: shift(u),
                    down: shift(d),
                    layouts: *layouts,
                },
            )
        })
        .collect())
}

/// Errors of changing the resident set.
#[derive(Debug, thiserror::Error)]
pub enum ResidencyError {
    #[error("the resident set takes {needed} bytes, the memory budget is {budget} bytes")]
    OverBudget { needed: u64, budget: u64 },
    #[error("resident expert: {0}")]
    Expert(#[from] ExpertError),
    #[error("{0}")]
    Copy(#[from] CopyError),
}

/// What [`ExpertResidency::set`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// experts copied from the file
    pub loaded: usize,
    /// experts whose copies were dropped
    pub dropped: usize,
    /// bytes of copies held afterwards
    pub resident_bytes: u64,
}

/// The experts the in-process engine keeps resident under a memory budget (module doc).
pub struct ExpertResidency {
    budget: u64,
    copies: RwLock<HashMap<(u32, u32), ExpertCopy>>,
    /// serialises `set`, so its budget check and swap see the same set
    moving: Mutex<()>,
    /// the staging cache the budget the set leaves is lent to
    spare_to: Mutex<Option<Arc<ColdCache>>>,
}

impl ExpertResidency {
    /// An empty set bounded by `budget` bytes of copies.
    pub fn new(budget: u64) -> ExpertResidency {
        ExpertResidency {
            budget,
            copies: RwLock::new(HashMap::new()),
            moving: Mutex::new(()),
            spare_to: Mutex::new(None),
        }
    }

    /// Lends `cache` the part of the budget the resident set does not use, now and whenever
    /// the set changes ([`ColdCache::lend`]): a plan that keeps part of the budget for the
    /// staging cache (`nightshift-atlas plan --resident-share`) leaves it fewer experts.
    pub fn lend_spare_to(&self, cache: Arc<ColdCache>) {
        let _one = self.moving.lock().unwrap_or_else(|p| p.into_inner());
        cache.lend(self.spare());
        *self.spare_to.lock().unwrap_or_else(|p| p.into_inner()) = Some(cache);
    }

    /// The budget the resident set leaves (what [`ExpertResidency::lend_spare_to`] lends).
    pub fn spare(&self) -> u64 {
        self.budget.saturating_sub(self.resident_bytes())
    }

    /// Lends the staging cache (if any) what `held` bytes of copies leave of the budget.
    fn lend_spare(&self, held: u64) {
        if let Some(c) = &*self.spare_to.lock().unwrap_or_else(|p| p.into_inner()) {
            c.lend(self.budget.saturating_sub(held));
        }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes of copies held now.
    pub fn resident_bytes(&self) -> u64 {
        let c = self.copies.read().unwrap_or_else(|p| p.into_inner());
        c.values().map(ExpertCopy::bytes).sum()
    }

    /// The resident experts, sorted.
    pub fn experts(&self) -> Vec<(u32, u32)> {
        let c = self.copies.read().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<(u32, u32)> = c.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Whether expert `expert` of `layer` is resident now.
    pub fn is_resident(&self, layer: usize, expert: u32) -> bool {
        let c = self.copies.read().unwrap_or_else(|p| p.into_inner());
        c.contains_key(&(layer as u32, expert))
    }

    /// Makes exactly `wanted` resident (duplicates ignored), checked against the budget before
    /// anything changes.
    pub fn set(
        &self,
        g: &Gguf,
        wanted: &[(u32, u32)],
        pool: Option<&ThreadPool>,
    ) -> Result<Moved, ResidencyError> {
        let _one = self.moving.lock().unwrap_or_else(|p| p.into_inner());
        let mut want: Vec<(u32, u32)> = wanted.to_vec();
        want.sort_unstable();
        want.dedup();
        let mut needed = 0u64;
        for &(layer, expert) in &want {
            let w = ExpertWeights::from_gguf(g, layer as usize, expert as usize)?;
            needed += (w.gate.bytes().len() + w.up.bytes().len() + w.down.bytes().len()) as u64;
        }
        if needed > self.budget {
            return Err(ResidencyError::OverBudget {
                needed,
                budget: self.budget,
            });
        }
        // the cache gives back what the new set takes before it is copied (the old copies are
        // dropped first, or kept and within it), so the two never hold more than the budget
        self.lend_spare(needed.max(self.resident_bytes()));
        let held = self.experts();
        let keeps_all = held.iter().all(|k| want.binary_search(k).is_ok());
        let dropped = if keeps_all {
            0
        } else {
            // arenas are freed whole: drop every copy first, then copy the new set at once
            let mut c = self.copies.write().unwrap_or_else(|p| p.into_inner());
            let n = c.keys().filter(|k| want.binary_search(k).is_err()).count();
            c.clear();
            n
        };
        let have = self.experts();
        let missing: Vec<(u32, u32)> = want
            .iter()
            .filter(|k| have.binary_search(k).is_err())
            .copied()
            .collect();
        let fresh = match copy_experts(g, &missing, pool, true) {
            Ok(f) => f,
            Err(e) => {
                self.lend_spare(self.resident_bytes());
                return Err(e.into());
            }
        };
        let loaded = fresh.len();
        let mut c = self.copies.write().unwrap_or_else(|p| p.into_inner());
        c.extend(fresh);
        let resident_bytes = c.values().map(ExpertCopy::bytes).sum();
        drop(c);
        self.lend_spare(resident_bytes);
        Ok(Moved {
            loaded,
            dropped,
            resident_bytes,
        })
    }

    /// Runs `f` with a lookup of the resident copy of an expert of `layer` (None: not resident);
    /// the set cannot change while `f` runs.
    pub fn with_layer<R>(
        &self,
        layer: usize,
        f: impl for<'a> FnOnce(&'a dyn Fn(u32) -> Option<&'a ExpertCopy>) -> R,
    ) -> R {
        let c = self.copies.read().unwrap_or_else(|p| p.into_inner());
        let l = layer as u32;
        f(&|expert: u32| c.get(&(l, expert)))
    }

    /// Bytes of the arenas alive (at most the budget plus < 192 bytes of alignment per expert).
    pub fn arena_bytes(&self) -> u64 {
        let c = self.copies.read().unwrap_or_else(|p| p.into_inner());
        let mut seen: Vec<*const Arena> = Vec::new();
        let mut total = 0u64;
        for copy in c.values() {
            let p = Arc::as_ptr(&copy.arena);
            if !seen.contains(&p) {
                seen.push(p);
                total += copy.arena.bytes as u64;
            }
        }
        total
    }
}
