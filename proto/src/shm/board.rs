//! The claim board: one small shared-memory page through which several expert nodes on the
//! coordinator's machine split one layer call between them as they go, instead of by a split
//! fixed in advance.
//!
//! With a static split a layer call lasts as long as its slowest share, and on a machine whose
//! cores also run the coordinator and other processes no estimate of a share's time holds (an
//! expert routed 3 rows is not exactly 3x one routed 1 row, a node may be descheduled). Here the
//! coordinator posts the whole call to every node holding all its experts (each through its own
//! region, `super`) and marks it on the board with a fresh tag; each node then takes the call's
//! expert groups one at a time from the board's counter, answers the pairs of the groups it
//! took, and stops when none are left. Nodes finish within one group of each other, whatever
//! their speed; a node that wakes late finds nothing left and answers no pairs.
//!
//! The board (native byte order, both ends on one machine):
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `NSCLMv01` |
//! | 8..12 | the coordinator's process id |
//! | 64..72 | claim word: the current call's tag (high 32 bits) and its next group (low 32) |
//!
//! A claim is a compare-and-swap that succeeds only while the word still carries the caller's
//! tag, so a node still working on an earlier call can never take a group of a later one. Tag 0
//! means "no shared call".

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapRaw;

use super::{open_checked, ShmError, SHM_DIR};

/// Size of a board.
pub const BOARD_BYTES: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"NSCLMv01");
const OFF_PID: usize = 8;
const OFF_CLAIM: usize = 64;

/// A mapped claim board (either end).
pub struct ClaimBoard {
    map: MmapRaw,
    path: PathBuf,
    /// The creating end removes the file when it drops the board.
    owner: bool,
}

impl ClaimBoard {
    /// Creates a board in [`SHM_DIR`] (mode 0600; the file is removed when the board drops).
    pub fn create() -> Result<ClaimBoard, ShmError> {
        Self::create_in(Path::new(SHM_DIR))
    }

    /// As [`ClaimBoard::create`], in another directory (tests of the node's path checks).
    pub fn create_in(dir: &Path) -> Result<ClaimBoard, ShmError> {
        let (file, path) = super::create_file(dir, "board", BOARD_BYTES)?;
        let map = MmapRaw::map_raw(&file).map_err(|source| {
            let _ = std::fs::remove_file(&path);
            ShmError::Io {
                what: format!("mapping {}", path.display()),
                source,
            }
        })?;
        let board = ClaimBoard {
            map,
            path,
            owner: true,
        };
        board
            .word(OFF_PID)
            .store(std::process::id() as u64, Ordering::Relaxed);
        board.word(OFF_CLAIM).store(0, Ordering::Relaxed);
        board.word(0).store(MAGIC, Ordering::Release);
        Ok(board)
    }

    /// Maps the board at `path` (a node), with the checks of a region: a regular file named
    /// `SHM_PREFIX*` directly in `dir`, not a link, of the board's size and magic, created by a
    /// process that is running.
    pub fn open_in(dir: &Path, path: &Path) -> Result<ClaimBoard, ShmError> {
        let refuse = |reason: String| ShmError::Refused {
            path: path.display().to_string(),
            reason,
        };
        let (map, size) = open_checked(dir, path, BOARD_BYTES..=BOARD_BYTES)?;
        debug_assert_eq!(size, BOARD_BYTES);
        let board = ClaimBoard {
            map,
            path: path.to_path_buf(),
            owner: false,
        };
        if board.word(0).load(Ordering::Acquire) != MAGIC {
            return Err(refuse("bad magic for a claim board".into()));
        }
        let pid = board.word(OFF_PID).load(Ordering::Relaxed);
        if !u32::try_from(pid).is_ok_and(super::process_alive) {
            return Err(refuse(format!(
                "its creator (process {pid}) is not running here"
            )));
        }
        Ok(board)
    }

    /// As [`ClaimBoard::open_in`] for [`SHM_DIR`].
    pub fn open(path: &Path) -> Result<ClaimBoard, ShmError> {
        Self::open_in(Path::new(SHM_DIR), path)
    }

    /// Removes the board's file (the creating end; mappings stay valid): when no node will
    /// attach any more. Dropping the board does it too.
    pub fn unlink(&self) {
        if self.owner {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// The board's path, for the nodes' `AttachShm`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= BOARD_BYTES);
        // SAFETY: in bounds (every board is BOARD_BYTES long), 8-aligned (the map is page
        // aligned), and only accessed atomically by every process that maps it.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU64) }
    }

    /// Opens a shared call under `tag` (not 0) with its first group unclaimed (the coordinator,
    /// before posting the call: the posts' release order publishes it).
    pub fn start(&self, tag: u32) {
        self.word(OFF_CLAIM)
            .store((tag as u64) << 32, Ordering::Release);
    }

    /// Ends any shared call: later claims under every tag fail (the coordinator, once it has
    /// every answer or gave up on them).
    pub fn finish(&self) {
        self.word(OFF_CLAIM).store(0, Ordering::Release);
    }

    /// Takes the next of the `groups` groups of the call tagged `tag`; `None` once all are
    /// taken or the board moved on to another call.
    pub fn claim(&self, tag: u32, groups: u32) -> Option<u32> {
        if tag == 0 {
            return None;
        }
        let w = self.word(OFF_CLAIM);
        let mut cur = w.load(Ordering::Acquire);
        loop {
            let (t, next) = ((cur >> 32) as u32, cur as u32);
            if t != tag || next >= groups {
                return None;
            }
            match w.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(next),
                Err(now) => cur = now,
            }
        }
    }
}

impl Drop for ClaimBoard {
    fn drop(&mut self) {
        self.unlink();
    }
}
