//! Slow and silent clients cannot lock the gateway (`gateway/conn.rs`): under `ulimit -n 256`,
//! 300 connections that never send a byte leave a normal request answered at once (the cap
//! stays below the descriptor limit, the oldest idle connection makes room, and the cap is
//! logged); a connection that sends nothing, half a head, or stays idle after a response is
//! closed after `--header-timeout`.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nightshift");

/// `nightshift serve --mock` with `extra` flags under a soft descriptor limit of `nofile`;
/// returns the server and its stderr as it is written.
fn serve_limited(nofile: u64, extra: &[&str]) -> (support::Server, Arc<Mutex<String>>) {
    let mut s = support::serve(BIN, |c| {
        c.arg("--mock")
            .args(extra)
            .env("RUST_LOG", "info")
            .stderr(std::process::Stdio::piped());
        // SAFETY: runs in the forked child before exec and only calls setrlimit(2), which is
        // async-signal-safe and touches only the struct on this stack frame.
        unsafe {
            c.pre_exec(move || {
                let rl = libc::rlimit {
                    rlim_cur: nofile,
                    rlim_max: nofile,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        }
    });
    let log = Arc::new(Mutex::new(String::new()));
    let stderr = s.child.stderr.take().expect("stderr piped");
    let sink = log.clone();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let mut l = sink.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    (s, log)
}

fn addr(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

/// A plain HTTP/1.1 GET on a fresh connection; the status line, or why there is none.
fn get(addr: &str, path: &str, timeout: Duration) -> Result<String, String> {
    let mut c = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    c.read_to_end(&mut buf).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf);
    Ok(text.lines().next().unwrap_or("").to_string())
}

/// Whether the server closes `c` within `within` (reads until EOF or an error).
fn closed_within(c: &mut TcpStream, within: Duration) -> bool {
    c.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}

#[test]
fn silent_connections_do_not_lock_out_a_normal_request() {
    let (s, log) = serve_limited(256, &[]);
    let a = addr(&s.url);
    let silent: Vec<TcpStream> = (0..300)
        .map(|i| TcpStream::connect(&a).unwrap_or_else(|e| panic!("connection {i}: {e}")))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // Generous bound for a loaded 2-core VM; without the cap it is never answered.
    let t0 = Instant::now();
    let status = get(&a, "/health", Duration::from_secs(5));
    assert_eq!(
        status.as_deref(),
        Ok("HTTP/1.1 200 OK"),
        "after {:?}",
        t0.elapsed()
    );
    let again = get(&a, "/v1/models", Duration::from_secs(5));
    assert_eq!(again.as_deref(), Ok("HTTP/1.1 200 OK"));
    drop(silent);
    let text = log.lock().unwrap().clone();
    assert!(text.contains("connection cap reached"), "{text}");
    assert!(!text.contains("Too many open files"), "{text}");
}

#[test]
fn silent_half_sent_and_idle_connections_are_closed_after_the_header_timeout() {
    let (s, _log) = serve_limited(1024, &["--header-timeout", "1"]);
    let a = addr(&s.url);
    let mut silent = TcpStream::connect(&a).expect("connect");
    let mut half = TcpStream::connect(&a).expect("connect");
    half.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        .expect("half a head");
    let mut idle = TcpStream::connect(&a).expect("connect");
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("request");
    let mut first = [0u8; 12];
    idle.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    idle.read_exact(&mut first).expect("a response");
    assert_eq!(&first, b"HTTP/1.1 200");
    for (what, c) in [
        ("silent", &mut silent),
        ("half a head", &mut half),
        ("idle keep-alive", &mut idle),
    ] {
        assert!(
            closed_within(c, Duration::from_secs(8)),
            "{what} connection left open"
        );
    }
}
