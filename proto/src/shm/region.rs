//! The mapped region either end of the link holds: atomic header words (the counters, which
//! are also futex words), bounds-checked copies in and out of the areas, and the `u32` arrays'
//! byte form.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::MmapRaw;

use super::futex::futex_wake;
use super::{HEADER_BYTES, OFF_CLOSED, OFF_REQ_SEQ, OFF_RESP_SEQ};

/// A mapped region (either end).
pub(super) struct Region {
    pub(super) map: MmapRaw,
    pub(super) size: usize,
    pub(super) req_cap: usize,
}

impl Region {
    pub(super) fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    pub(super) fn word(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= HEADER_BYTES);
        // SAFETY: in bounds (the header is inside every region), 4-aligned (the map is page
        // aligned), and only ever accessed atomically by both processes.
        unsafe { &*(self.base().add(off) as *const AtomicU32) }
    }

    pub(super) fn wide(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= HEADER_BYTES);
        // SAFETY: as `word`, 8-aligned.
        unsafe { &*(self.base().add(off) as *const AtomicU64) }
    }

    pub(super) fn get(&self, off: usize) -> u32 {
        self.word(off).load(Ordering::Relaxed)
    }

    pub(super) fn set(&self, off: usize, v: u32) {
        self.word(off).store(v, Ordering::Relaxed)
    }

    pub(super) fn resp_cap(&self) -> usize {
        self.size - HEADER_BYTES - self.req_cap
    }

    /// Copies `src` into the region at `off` (the caller checked the bounds).
    pub(super) fn write(&self, off: usize, src: &[u8]) {
        assert!(off + src.len() <= self.size);
        // SAFETY: in bounds (asserted); the peer does not touch this area now (protocol).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base().add(off), src.len()) }
    }

    /// Copies `len` bytes at `off` out of the region (the caller checked the bounds).
    pub(super) fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.size);
        let mut v = vec![0u8; len];
        // SAFETY: in bounds (asserted).
        unsafe { std::ptr::copy_nonoverlapping(self.base().add(off), v.as_mut_ptr(), len) }
        v
    }

    pub(super) fn closed(&self) -> u32 {
        self.word(OFF_CLOSED).load(Ordering::Acquire)
    }

    pub(super) fn close(&self, bit: u32) {
        self.word(OFF_CLOSED).fetch_or(bit, Ordering::AcqRel);
        futex_wake(self.word(OFF_REQ_SEQ));
        futex_wake(self.word(OFF_RESP_SEQ));
    }
}

pub(super) fn u32s(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

pub(super) fn from_u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
