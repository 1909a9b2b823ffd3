//! A model file truncated under a running `nightshift serve` (experts mapped, the default for
//! models larger than half of memory) stops the server cleanly: exit status 74 and a message
//! naming the file and telling to replace models by atomic rename, never a death by SIGBUS.
//! A request sent right after the truncation touches the lost pages (the SIGBUS guard), or the
//! watchdog notices first; either way the same clean exit.

mod support;

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nightshift");

#[test]
fn truncating_the_mapped_model_stops_the_server_with_the_reason() {
    let dir = std::env::temp_dir().join(format!("ns-model-changed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let model = dir.join("model.gguf");
    std::fs::copy(support::fixture("tiny-qwen3moe-Q2_K.gguf"), &model).expect("copy");
    let mut s = support::serve(BIN, |c| {
        c.args(["--threads", "1", "--expert-memory", "mapped", "--model"])
            .arg(&model)
            .stderr(std::process::Stdio::piped())
    });
    let mut stderr = s.child.stderr.take().expect("stderr");
    let len = std::fs::metadata(&model).expect("len").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .expect("open")
        .set_len(len / 4)
        .expect("truncate");
    let addr = s.url.trim_start_matches("http://").to_string();
    std::thread::spawn(move || {
        use std::io::Write;
        let body = r#"{"model":"model","messages":[{"role":"user","content":"Hello there"}],"max_tokens":4}"#;
        if let Ok(mut c) = std::net::TcpStream::connect(&addr) {
            let _ = write!(
                c,
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let mut sink = Vec::new();
            let _ = c.read_to_end(&mut sink);
        }
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().expect("wait") {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the server kept running on a truncated model"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    let _ = stderr.read_to_string(&mut err);
    assert_eq!(status.signal(), None, "killed by a signal: {err}");
    assert_eq!(status.code(), Some(74), "{err}");
    assert!(
        err.contains(&model.display().to_string()) && err.contains("renaming it over the old one"),
        "{err}"
    );
}
