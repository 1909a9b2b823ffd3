//! A model file changed under its mapping: detected and reported, never a bare SIGBUS.
//!
//! Reading a page of a mapped file beyond its current end raises SIGBUS, so a model file
//! truncated or rewritten in place (instead of replaced by an atomic rename, which leaves the
//! mapped inode intact) used to kill the process without a word. Each mapped GGUF file is
//! registered here with its address range and a ready-made message; a SIGBUS handler installed
//! once per process looks the faulting address up, writes that message (which file, what to do)
//! with async-signal-safe `write(2)` and exits with [`CHANGED_EXIT_CODE`]. A fault outside every
//! registered range is not ours: the handler restores the default action and lets the fault
//! kill the process as before. [`check_files`] does the same check without a fault (the file
//! behind the kept descriptor got shorter) for callers that poll.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The exit status of a process whose model file changed under it (EX_IOERR of sysexits.h).
pub const CHANGED_EXIT_CODE: i32 = 74;

/// Most files mapped at once (a split model has one per shard).
const SLOTS: usize = 256;

/// One registered mapping; `len == 0` means the slot is free. The handler reads the fields with
/// atomic loads only.
struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    msg: AtomicPtr<u8>,
    msg_len: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    msg: AtomicPtr::new(std::ptr::null_mut()),
    msg_len: AtomicUsize::new(0),
};

static REGISTRY: [Slot; SLOTS] = [FREE; SLOTS];
/// Serialises registration (the handler never takes it).
static REGISTER: Mutex<()> = Mutex::new(());
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// What a mapped file was when it was opened, to tell later whether it changed.
#[derive(Debug)]
pub(super) struct Watched {
    pub(super) path: PathBuf,
    /// Kept open: its size is the size of the inode we mapped, whatever the path names now.
    file: std::fs::File,
    size: u64,
    slot: Option<usize>,
}

impl Watched {
    /// Registers the mapping `[start, start + len)` of `file` (opened at `path`).
    pub(super) fn new(
        path: &Path,
        file: std::fs::File,
        size: u64,
        start: usize,
        len: usize,
    ) -> Watched {
        install_handler();
        let slot = register(path, start, len);
        Watched {
            path: path.to_path_buf(),
            file,
            size,
            slot,
        }
    }

    /// The open file.
    pub(super) fn file(&self) -> &std::fs::File {
        &self.file
    }

    /// Why the file no longer matches its mapping, if it does not.
    fn changed(&self) -> Option<String> {
        match self.file.metadata() {
            Ok(m) if m.size() < self.size => Some(format!(
                "{} was truncated from {} to {} bytes while mapped",
                self.path.display(),
                self.size,
                m.size()
            )),
            Ok(_) => None,
            Err(e) => Some(format!(
                "{}: cannot stat the mapped file: {e}",
                self.path.display()
            )),
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            let _guard = REGISTER.lock().unwrap_or_else(|p| p.into_inner());
            // The message stays allocated (the handler may be reading it); the slot is reused.
            REGISTRY[i].len.store(0, Ordering::Release);
        }
    }
}

/// Checks every watched file; returns the first problem.
pub(super) fn check_files<'a>(files: impl IntoIterator<Item = &'a Watched>) -> Option<String> {
    files.into_iter().find_map(Watched::changed)
}

fn register(path: &Path, start: usize, len: usize) -> Option<usize> {
    if len == 0 {
        return None;
    }
    let msg = format!(
        "\nfatal: the model file {} changed while it was mapped (truncated or rewritten in place); \
         replace model files by writing a new file and renaming it over the old one. exiting\n",
        path.display()
    )
    .into_bytes()
    .into_boxed_slice();
    let _guard = REGISTER.lock().unwrap_or_else(|p| p.into_inner());
    let i = REGISTRY
        .iter()
        .position(|s| s.len.load(Ordering::Acquire) == 0)?;
    let s = &REGISTRY[i];
    let msg_len = msg.len();
    // Leaked on purpose: a handler running on another thread may still hold the old pointer.
    let ptr = Box::leak(msg).as_mut_ptr();
    s.start.store(start, Ordering::Relaxed);
    s.msg.store(ptr, Ordering::Relaxed);
    s.msg_len.store(msg_len, Ordering::Relaxed);
    s.len.store(len, Ordering::Release);
    Some(i)
}

fn install_handler() {
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; we set the handler,
    // SA_SIGINFO (so it receives the faulting address) and SA_ONSTACK, then install it for
    // SIGBUS only. `on_sigbus` is async-signal-safe (atomic loads, write(2), _exit(2)).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            on_sigbus;
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) != 0 {
            INSTALLED.store(false, Ordering::Release);
        }
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler; si_addr is the
    // faulting address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &REGISTRY {
        let len = s.len.load(Ordering::Acquire);
        let start = s.start.load(Ordering::Relaxed);
        if len > 0 && addr >= start && addr - start < len {
            let (ptr, n) = (
                s.msg.load(Ordering::Relaxed),
                s.msg_len.load(Ordering::Relaxed),
            );
            // SAFETY: ptr/n describe a leaked, never-freed buffer written before `len` was
            // published (release/acquire); write(2) and _exit(2) are async-signal-safe.
            unsafe {
                libc::write(2, ptr as *const libc::c_void, n);
                libc::_exit(CHANGED_EXIT_CODE);
            }
        }
    }
    // Not a model mapping: fall back to the default action, which kills the process when the
    // faulting instruction runs again.
    // SAFETY: signal(2) with SIG_DFL is async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
    }
}

/// Starts a thread ("model-watch") that runs `check` every `every` and, when a mapped model file
/// changed (`Gguf::check_unchanged`), prints why to stderr and exits with
/// [`CHANGED_EXIT_CODE`]: before a request faults on a lost page. `check` returns None once the
/// model is gone, which ends the thread.
pub fn spawn_watchdog(
    every: std::time::Duration,
    check: impl Fn() -> Option<Result<(), super::GgufError>> + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("model-watch".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            match check() {
                None => return,
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    eprintln!("\nfatal: {e}. exiting");
                    std::process::exit(CHANGED_EXIT_CODE);
                }
            }
        })
        .map(|_| ())
}
