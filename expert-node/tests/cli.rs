//! The node's command line. It authenticates by default: without `--auth-token-file` it refuses
//! to start (before loading anything, saying what to pass) unless `--insecure-no-auth` says the
//! network is trusted; an empty token file is refused too; with a token it starts and listens.
//! It logs "ready" only once it listens: a port already taken fails it without that line. A
//! `--cold-cache` that is neither a size nor `auto` is refused with what it expected, and so is a
//! `--cold-io-depth` outside 1 to 64.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nightshift-expert-node");

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/data/tiny-qwen3moe-Q2_K.gguf")
}

/// A fresh directory per call: the tests run in parallel, and a placement file rewritten while
/// another test's node reads it would fail that node.
fn dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "ns-node-auth-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).expect("tmp dir");
    std::fs::write(
        d.join("placement.toml"),
        "version = 1\nstrategy = \"round-robin\"\n[[node]]\nname = \"node0\"\n",
    )
    .expect("placement");
    d
}

fn free_addr() -> String {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .to_string()
}

fn node(dir: &Path, addr: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--model")
        .arg(fixture())
        .arg("--placement")
        .arg(dir.join("placement.toml"))
        .args(["--node", "node0", "--listen", addr, "--threads", "1"])
        .args(extra)
        .env("RUST_LOG", "warn")
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null());
    c
}

/// Runs a node expected to refuse to start; returns its stderr.
fn refused(dir: &Path, extra: &[&str]) -> String {
    let addr = free_addr();
    let o = node(dir, &addr, extra).output().expect("node runs");
    assert!(!o.status.success(), "{extra:?}: the node started");
    assert!(
        TcpStream::connect(&addr).is_err(),
        "{extra:?}: something listens"
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Starts a node, waits until it listens (or exits), then stops it; returns whether it listened.
/// A node that could not bind its port is tried again on another: the free port can be taken by
/// a parallel test between `free_addr` and the node's bind.
fn listens(dir: &Path, extra: &[&str]) -> bool {
    for _ in 0..5 {
        let addr = free_addr();
        let mut child = node(dir, &addr, extra)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn node");
        let t0 = Instant::now();
        let up = loop {
            if TcpStream::connect(&addr).is_ok() {
                break true;
            }
            if child.try_wait().expect("wait").is_some() || t0.elapsed() > Duration::from_secs(60) {
                break false;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let _ = child.kill();
        let out = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&out.stderr);
        if up || !err.contains(&format!("binding {addr}")) {
            if !up {
                eprintln!("{extra:?}: the node exited: {err}");
            }
            return up;
        }
    }
    false
}

#[test]
fn a_node_without_a_token_refuses_to_start_unless_told_the_network_is_trusted() {
    let d = dir();
    let err = refused(&d, &[]);
    assert!(
        err.contains("--auth-token-file") && err.contains("--insecure-no-auth"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    std::fs::write(d.join("empty-token"), "\n").expect("token");
    let empty = d.join("empty-token");
    let err = refused(&d, &["--auth-token-file", empty.to_str().expect("utf-8")]);
    assert!(err.contains("is empty"), "{err}");

    let missing = d.join("no-such-token");
    let err = refused(&d, &["--auth-token-file", missing.to_str().expect("utf-8")]);
    assert!(err.contains("no-such-token"), "{err}");

    std::fs::write(d.join("token"), "s3cret\n").expect("token");
    let token = d.join("token");
    assert!(listens(
        &d,
        &["--auth-token-file", token.to_str().expect("utf-8")]
    ));
    assert!(listens(&d, &["--insecure-no-auth"]));
}

#[test]
fn ready_is_logged_only_once_the_port_is_bound() {
    let d = dir();
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let o = node(&d, &addr, &["--insecure-no-auth"])
        .env("RUST_LOG", "info")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("node runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains(&format!("binding {addr}")), "{err}");
    assert!(
        !err.contains("node ready"),
        "said ready without listening: {err}"
    );
    assert!(
        !err.contains("Stack backtrace") && !err.contains("panicked"),
        "{err}"
    );
}

#[test]
fn cold_cache_sizes_are_checked_before_anything_is_served() {
    let d = dir();
    for bad in ["lots", "12Q", "-3", "50%%", ""] {
        let arg = format!("--cold-cache={bad}");
        let err = refused(&d, &["--insecure-no-auth", &arg]);
        assert!(
            err.contains("--cold-cache") && err.contains("a size or auto"),
            "{bad:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{bad:?}: {err}");
    }
    for good in ["auto", "0", "64KiB", "10%"] {
        assert!(
            listens(&d, &["--insecure-no-auth", "--cold-cache", good]),
            "--cold-cache {good}"
        );
    }
    assert!(listens(
        &d,
        &[
            "--insecure-no-auth",
            "--memory-budget",
            "50%",
            "--cold-cache",
            "1MiB"
        ]
    ));
    for bad in ["0", "65"] {
        let err = refused(
            &d,
            &[
                "--insecure-no-auth",
                "--cold-cache",
                "1MiB",
                "--cold-io-depth",
                bad,
            ],
        );
        assert!(
            err.contains("--cold-io-depth") && err.contains("expected 1 to 64"),
            "{bad}: {err}"
        );
        assert!(!err.contains("panicked"), "{bad}: {err}");
    }
    assert!(listens(
        &d,
        &[
            "--insecure-no-auth",
            "--cold-cache",
            "1MiB",
            "--cold-io-depth",
            "2"
        ]
    ));
}
