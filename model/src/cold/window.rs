//! One call's cold experts going through the staging cache ([`ColdWindow`]).

use std::sync::Arc;

use super::{ColdCache, ColdCopy};
use crate::error::ExpertError;

/// The cold experts of one call going through the staging cache: at most half the cache's
/// capacity (at least one expert) demanded and not yet computed at a time, so a call needing
/// more than fits streams through the cache instead of evicting its own next experts.
pub(crate) struct ColdWindow<'a> {
    cache: &'a ColdCache,
    layer: usize,
    cold: &'a [u32],
    /// next expert of `cold` to demand
    demanded: usize,
    /// next expert of `cold` to take
    taken: usize,
    /// footprints demanded and not yet released
    outstanding: u64,
}

impl<'a> ColdWindow<'a> {
    pub(crate) fn new(cache: &'a ColdCache, layer: usize, cold: &'a [u32]) -> ColdWindow<'a> {
        ColdWindow {
            cache,
            layer,
            cold,
            demanded: 0,
            taken: 0,
            outstanding: 0,
        }
    }

    /// Demands experts while the window has room.
    pub(crate) fn fill(&mut self) -> Result<(), ExpertError> {
        let limit = self.cache.capacity() / 2;
        while let Some(&e) = self.cold.get(self.demanded) {
            let size = self.cache.footprint(self.layer, e)?;
            if self.outstanding > 0 && self.outstanding + size > limit {
                break;
            }
            self.cache.demand(self.layer, e)?;
            self.outstanding += size;
            self.demanded += 1;
        }
        Ok(())
    }

    /// The next expert (waiting for its read) and every demanded one after it already in
    /// memory; None when all were taken.
    #[allow(clippy::type_complexity)]
    pub(crate) fn next_chunk(&mut self) -> Result<Option<Vec<(u32, Arc<ColdCopy>)>>, ExpertError> {
        if self.taken == self.cold.len() {
            return Ok(None);
        }
        if self.taken == self.demanded {
            self.fill()?;
        }
        let e = self.cold[self.taken];
        let Some(first) = self.cache.take(self.layer, e, true)? else {
            return Err(ExpertError::Backend(
                "cold cache: no copy after waiting".into(),
            ));
        };
        self.taken += 1;
        let mut chunk = vec![(e, first)];
        chunk.extend(self.ready()?);
        Ok(Some(chunk))
    }

    /// The demanded experts, in order from the next one, already in memory (taken without
    /// waiting; possibly none).
    #[allow(clippy::type_complexity)]
    pub(crate) fn ready(&mut self) -> Result<Vec<(u32, Arc<ColdCopy>)>, ExpertError> {
        let mut chunk = Vec::new();
        while self.taken < self.demanded {
            let e = self.cold[self.taken];
            match self.cache.take(self.layer, e, false)? {
                Some(c) => {
                    chunk.push((e, c));
                    self.taken += 1;
                }
                None => break,
            }
        }
        Ok(chunk)
    }

    /// A chunk of `bytes` was computed and dropped: room for more demands.
    pub(crate) fn release(&mut self, bytes: u64) -> Result<(), ExpertError> {
        self.outstanding = self.outstanding.saturating_sub(bytes);
        self.cache.released();
        self.fill()
    }
}

impl Drop for ColdWindow<'_> {
    fn drop(&mut self) {
        // demands of a call that failed half way are given up
        for &e in &self.cold[self.taken..self.demanded] {
            self.cache.forget(self.layer, e);
        }
    }
}
