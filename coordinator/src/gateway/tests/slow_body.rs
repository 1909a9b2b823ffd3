//! A client that sends a request head and then trickles (or stops sending) its body gets a 408
//! in the API's error shape once `body_timeout` has passed, and the server answers others
//! meanwhile.

use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn a_body_that_does_not_arrive_is_a_408() {
    let s = start(Opts {
        body_timeout_ms: Some(400),
        ..Opts::default()
    })
    .await;
    let addr = s.url.trim_start_matches("http://").to_string();
    let mut slow = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    slow.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\"",
    )
    .await
    .expect("head");
    let started = std::time::Instant::now();
    // one more byte now and then, never the whole body
    let trickle = async {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if slow.write_all(b" ").await.is_err() {
                break;
            }
        }
    };
    // others are answered meanwhile
    let others = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (st, v) = post(&s, "/v1/chat/completions", chat_body("hi", 4)).await;
        assert_eq!(st, 200, "{v}");
    };
    tokio::join!(trickle, others);
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        text.contains("\"type\":\"invalid_request_error\""),
        "{text}"
    );
    assert!(text.contains("did not arrive within 0.4 s"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(5));
}
