//! The files behind the shared-memory link: how regions and boards are named and created
//! (private, pages reserved), the checks a node makes before mapping one, and the sweep that
//! removes files left behind by coordinators that died before unlinking them.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapRaw;

use super::{ShmError, SHM_PREFIX};

static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

/// Creates `dir/SHM_PREFIX<pid>-<kind><n>-<nanos>` (mode 0600, new) of `size` bytes with its
/// pages reserved: a store into a tmpfs page that cannot be allocated later (a full or small
/// /dev/shm, as containers often have) would be a SIGBUS, not an error. Removed again on error.
pub(super) fn create_file(
    dir: &Path,
    kind: &str,
    size: usize,
) -> Result<(File, PathBuf), ShmError> {
    let n = NEXT_FILE.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let path = dir.join(format!(
        "{SHM_PREFIX}{}-{kind}{n}-{nanos:08x}",
        std::process::id()
    ));
    let io = |what: &str| {
        let what = format!("{what} {}", path.display());
        move |source| ShmError::Io { what, source }
    };
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let file = opts.open(&path).map_err(io("creating"))?;
    let cleanup = |e: ShmError| {
        let _ = std::fs::remove_file(&path);
        e
    };
    file.set_len(size as u64)
        .map_err(io("sizing"))
        .map_err(cleanup)?;
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: a valid open descriptor and a range inside the file's length.
        let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size as libc::off_t) };
        if r != 0 {
            return Err(cleanup(ShmError::Io {
                what: format!("reserving {size} bytes for {}", path.display()),
                source: std::io::Error::from_raw_os_error(r),
            }));
        }
    }
    Ok((file, path))
}

/// Maps the file at `path` after checking it is a regular file named `SHM_PREFIX*` directly in
/// `dir` (not followed through a link) whose size is in `sizes`. Returns the map and the size.
pub(super) fn open_checked(
    dir: &Path,
    path: &Path,
    sizes: std::ops::RangeInclusive<usize>,
) -> Result<(MmapRaw, usize), ShmError> {
    let refuse = |reason: String| ShmError::Refused {
        path: path.display().to_string(),
        reason,
    };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| refuse("no file name".into()))?;
    if path.parent() != Some(dir) || !name.starts_with(SHM_PREFIX) {
        return Err(refuse(format!(
            "regions live directly in {} and are named {SHM_PREFIX}*",
            dir.display()
        )));
    }
    let mut opts = OpenOptions::new();
    opts.read(true).write(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW);
    }
    let file: File = opts.open(path).map_err(|e| refuse(format!("open: {e}")))?;
    let meta = file.metadata().map_err(|e| refuse(format!("stat: {e}")))?;
    if !meta.is_file() {
        return Err(refuse("not a regular file".into()));
    }
    let size = meta.len() as usize;
    if !sizes.contains(&size) {
        return Err(refuse(format!("size {size} is out of range")));
    }
    let map = MmapRaw::map_raw(&file).map_err(|e| refuse(format!("map: {e}")))?;
    Ok((map, size))
}

/// Whether process `pid` runs on this machine (in this PID namespace).
pub(super) fn process_alive(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // SAFETY: signal 0 only checks that the process exists.
        let r = unsafe { libc::kill(pid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// Removes the files in `dir` named `SHM_PREFIX<pid>-*` whose creating process no longer runs
/// and that belong to this user: regions and boards of coordinators that died between creating
/// and unlinking them (a board lives as long as its coordinator). Returns how many it removed.
pub fn sweep_stale(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    #[cfg(unix)]
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(SHM_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            if meta.uid() != me {
                continue;
            }
        }
        if meta.is_file() && !process_alive(pid) && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}
