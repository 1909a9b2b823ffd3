//! The staging cache's I/O threads: `depth` of them, each taking the next read (demand reads
//! first), making room for it under the cache's lock, then reading the whole expert with
//! blocking `pread`s into its buffer outside the lock. Several reads in flight are what an NVMe
//! or a cloud disk needs to give its bandwidth (one at a time it gives its latency).
//!
//! **A demand read never waits behind predictions**: predictions take at most `depth - 1`
//! threads (with one thread, that one), so a thread is free for a demand whenever no other
//! demand holds it, and no prediction starts while a demand read waits for room or is being
//! read (it would share the disk's bandwidth with the read a call waits for). Capacity accounting
//! is the cache's (`State::bytes`): a read's footprint is counted from the moment it starts, so
//! reads in flight are counted as the copies they become.

use std::cell::Cell;
use std::fs::File;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::files::expert_spans;
use super::{Buffer, ColdCopy, Key, Shared, Slot, ROOM_WAIT};
use crate::error::ExpertError;

/// One model file as the I/O threads read it.
pub(super) struct ReadFile {
    file: File,
    direct: bool,
}

/// Opens `path` for reading with `O_DIRECT` where the file system takes it.
pub(super) fn open_direct(path: &std::path::Path) -> std::io::Result<ReadFile> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        if let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            return Ok(ReadFile { file, direct: true });
        }
    }
    Ok(ReadFile {
        file: File::open(path)?,
        direct: false,
    })
}

/// Starts the `depth` I/O threads of `shared`.
pub(super) fn spawn(shared: &Arc<Shared>, depth: usize) -> std::io::Result<()> {
    shared.lock().workers = depth;
    for i in 0..depth {
        let io = shared.clone();
        if let Err(e) = std::thread::Builder::new()
            .name(format!("nightshift-cold-io-{i}"))
            .spawn(move || io.serve())
        {
            // the threads started end with the cache; the rest never ran
            let mut st = shared.lock();
            st.workers -= depth - i;
            st.closed = true;
            drop(st);
            shared.changed.notify_all();
            return Err(e);
        }
    }
    Ok(())
}

/// Marks an I/O thread gone however it ends: the read it had started fails (so no call waits
/// for it forever), and when it was the last thread the cache says so to the calls waiting.
struct Gone<'a> {
    shared: &'a Shared,
    /// the read this thread has taken and not finished: the bytes counted for it (0: not
    /// started yet), and whether it is a demand read
    current: Cell<Option<(Key, u64, bool)>>,
}

impl Drop for Gone<'_> {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        if let Some((key, bytes, demanded)) = self.current.take() {
            st.bytes = st.bytes.saturating_sub(bytes);
            if let Some(en) = st.entries.get_mut(&key) {
                en.slot = Slot::Failed("the I/O thread reading it stopped".into());
            }
            st.end_pick(demanded);
            if bytes > 0 {
                st.end_read(&self.shared.counters);
            }
        }
        st.workers = st.workers.saturating_sub(1);
        if st.workers == 0 {
            st.io_gone = true;
        }
        drop(st);
        self.shared.changed.notify_all();
    }
}

impl Shared {
    /// Predictions in flight at once: all but one thread, so one is always free for a demand
    /// (with one thread, that one: today's single-thread order).
    fn prefetch_slots(&self) -> usize {
        self.depth.saturating_sub(1).max(1)
    }

    /// One I/O thread: demand reads first, then predictions (module doc).
    pub(super) fn serve(&self) {
        let gone = Gone {
            shared: self,
            current: Cell::new(None),
        };
        let mut st = self.lock();
        loop {
            if st.closed {
                return;
            }
            let (key, demanded) = if let Some(k) = st.demand.pop_front() {
                (k, true)
            } else if st.prefetching < self.prefetch_slots() && st.demanding == 0 {
                match st.prefetch.pop_front() {
                    Some(k) => (k, false),
                    None => {
                        st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                        continue;
                    }
                }
            } else {
                st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            };
            let Some(size) = st.entries.get_mut(&key).and_then(|en| {
                // another thread may have taken it from the other queue (a prediction demanded
                // while queued is in both until one of them takes it)
                matches!(en.slot, Slot::Queued).then(|| {
                    en.slot = Slot::Picked;
                    en.size
                })
            }) else {
                continue;
            };
            if demanded {
                st.demanding += 1;
            } else {
                st.prefetching += 1;
            }
            gone.current.set(Some((key, 0, demanded)));
            // make room: reuse a spare buffer, or evict the least recently used copies no
            // call holds or still needs
            let mut buffer = None;
            let waiting = Instant::now();
            let mut dropped = false;
            loop {
                if st.closed {
                    return;
                }
                if let Some(i) = st.spare.iter().position(|b| b.cap >= size) {
                    buffer = Some(st.spare.swap_remove(i));
                    break;
                }
                if st.bytes + size <= self.capacity() {
                    break;
                }
                if let Some(b) = st.spare.pop() {
                    st.bytes = st.bytes.saturating_sub(b.cap);
                    continue;
                }
                if st.evict_one(&self.counters) {
                    continue;
                }
                let wanted = st.entries.get(&key).is_some_and(|en| en.wanted > 0);
                if !wanted && !demanded {
                    // a prediction with no room: not read
                    st.entries.remove(&key);
                    self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                    dropped = true;
                    break;
                }
                // nothing to evict: wait for calls to drop copies or reads to finish, unless
                // nothing would ever free room (every byte held is wanted by calls that wait
                // for this read), or not within ROOM_WAIT (the call holding copies may be
                // waiting for this read further up its own thread: a pool worker that took up
                // another call while it joined): then go over the capacity rather than stall
                let busy = st.entries.values().any(|en| {
                    matches!(en.slot, Slot::Loading)
                        || matches!(&en.slot, Slot::Ready(c) if Arc::strong_count(c) > 1)
                });
                if !busy || waiting.elapsed() >= ROOM_WAIT {
                    break;
                }
                st = self
                    .changed
                    .wait_timeout(st, Duration::from_millis(5))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            if dropped {
                gone.current.set(None);
                st.end_pick(demanded);
                self.changed.notify_all();
                continue;
            }
            let size = match &buffer {
                Some(b) => b.cap,
                None => {
                    st.bytes += size;
                    size
                }
            };
            gone.current.set(Some((key, size, demanded)));
            if let Some(en) = st.entries.get_mut(&key) {
                en.slot = Slot::Loading;
                en.size = size;
            }
            st.start_read();
            drop(st);
            #[cfg(test)]
            self.gate.pass(key);
            let read = self.read(key, buffer);
            st = self.lock();
            gone.current.set(None);
            st.end_pick(demanded);
            // a copy just read is the most recently used: a prediction read ahead is not the
            // first thing the next read evicts before its layer takes it
            let tick = st.tick + 1;
            st.tick = tick;
            match (st.entries.get_mut(&key), read) {
                (Some(en), Ok(copy)) => {
                    en.slot = Slot::Ready(Arc::new(copy));
                    en.last = tick;
                    if !demanded {
                        self.counters.prefetched.fetch_add(1, Ordering::Relaxed);
                    }
                }
                (Some(en), Err(e)) => {
                    en.slot = Slot::Failed(e.to_string());
                    st.bytes = st.bytes.saturating_sub(size);
                }
                // cannot happen (Loading entries are not removed); keep the count right
                (None, _) => st.bytes = st.bytes.saturating_sub(size),
            }
            st.end_read(&self.counters);
            self.changed.notify_all();
        }
    }

    /// Reads expert `key` whole into `buffer` (None: a fresh one).
    fn read(&self, (layer, e): Key, buffer: Option<Buffer>) -> Result<ColdCopy, ExpertError> {
        let spans = expert_spans(&*self.files, layer as usize, e)?;
        let total: u64 = spans.iter().map(|s| s.2).sum();
        let mut buf = match buffer {
            Some(b) if b.cap >= total => b,
            _ => Buffer::new(total)
                .map_err(|err| ExpertError::Backend(format!("cold cache: allocating: {err}")))?,
        };
        let mut at = 0usize;
        let mut ranges: [Range<usize>; 3] = [0..0, 0..0, 0..0];
        for (i, &(file, start, len, skip, mlen)) in spans.iter().enumerate() {
            let dst = &mut buf.bytes_mut()[at..at + len as usize];
            let got = self.read_at(file, start, dst)?;
            if got < skip + mlen {
                return Err(ExpertError::Backend(format!(
                    "cold cache: short read of layer {layer} expert {e} ({got} of {} bytes): the model file changed",
                    skip + mlen
                )));
            }
            ranges[i] = at + skip..at + skip + mlen;
            at += len as usize;
        }
        self.counters.bytes_read.fetch_add(total, Ordering::Relaxed);
        Ok(ColdCopy { buf, ranges })
    }

    /// Reads from file `file` at `offset` into `dst` until it is full or the file ends; the
    /// bytes read. Threads read one file at once (`pread` has no shared position); only the
    /// switch to buffered reads takes the file alone.
    fn read_at(&self, file: usize, offset: u64, dst: &mut [u8]) -> Result<usize, ExpertError> {
        use std::os::unix::fs::FileExt;
        let Some(f) = self.readers.get(file) else {
            return Err(ExpertError::Backend(format!("cold cache: no file {file}")));
        };
        let mut got = 0usize;
        let mut direct = true;
        while got < dst.len() {
            let r = {
                let g = f.read().unwrap_or_else(|p| p.into_inner());
                direct = g.direct;
                g.file.read_at(&mut dst[got..], offset + got as u64)
            };
            match r {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    // this file system refuses O_DIRECT for this read: buffered from now on
                    let mut w = f.write().unwrap_or_else(|p| p.into_inner());
                    if w.direct {
                        let p = self.files.gguf().paths().nth(file).ok_or_else(|| {
                            ExpertError::Backend(format!("cold cache: no file {file}"))
                        })?;
                        w.file = File::open(p)
                            .map_err(|e| ExpertError::Backend(format!("cold cache: {e}")))?;
                        w.direct = false;
                    }
                }
                Err(e) => {
                    return Err(ExpertError::Backend(format!(
                        "cold cache: reading the model file: {e}"
                    )))
                }
            }
        }
        if !direct {
            let g = f.read().unwrap_or_else(|p| p.into_inner());
            drop_cached(&g.file, offset, got);
        }
        Ok(got)
    }
}

/// Drops the page-cache pages of a buffered read whose bytes now live in the cache.
fn drop_cached(file: &File, offset: u64, len: usize) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open descriptor; fadvise only drops clean cached pages.
        let _ = unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            )
        };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}
