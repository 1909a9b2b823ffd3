//! The futex wait and wake both ends of the shared-memory link sleep on: the region's request
//! and response counters are the futex words (shared mappings, so not process-private). Other
//! systems poll the word every 50 us instead.

use std::sync::atomic::AtomicU32;
#[cfg(not(target_os = "linux"))]
use std::sync::atomic::Ordering;
use std::time::Duration;
#[cfg(not(target_os = "linux"))]
use std::time::Instant;

/// Sleeps until `word` may differ from `expected` (or `timeout`).
#[cfg(target_os = "linux")]
pub(super) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned u32 in a shared mapping (hence no FUTEX_PRIVATE_FLAG);
    // the kernel only reads it. Spurious returns are handled by the callers' loops.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every waiter on `word`.
#[cfg(target_os = "linux")]
pub(super) fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let end = Instant::now() + timeout;
    while word.load(Ordering::Acquire) == expected && Instant::now() < end {
        std::thread::sleep(Duration::from_micros(50));
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn futex_wake(_word: &AtomicU32) {}
