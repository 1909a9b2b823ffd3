//! The link's framing over real loopback sockets: frames round trip and split where they end,
//! a frame cut by a deadline is kept, one already arrived is taken after it, oversized frames and
//! closed peers are errors, hellos and refusals round trip.

use super::*;
use std::net::TcpListener;

/// A connected pair of plain links.
fn pair() -> (Framed, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let c = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (s, _) = l.accept().expect("accept");
    (Framed::new(Stream::Plain(c)), s)
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

#[test]
fn frames_round_trip_and_back_to_back_frames_split_where_they_end() {
    let (mut a, s) = pair();
    let mut b = Framed::new(Stream::Plain(s));
    a.send(REQUEST, Duration::from_secs(1), |o| {
        o.extend_from_slice(b"abc")
    })
    .expect("send");
    a.send(RESPONSE, Duration::from_secs(1), |_| {})
        .expect("send");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    a.send(REQUEST, Duration::from_secs(1), |o| {
        o.extend_from_slice(&big)
    })
    .expect("send");
    let (k, p) = b.recv(far(), &mut || true).expect("frame");
    assert_eq!((k, p), (REQUEST, &b"abc"[..]));
    let (k, p) = b.recv(far(), &mut || true).expect("frame");
    assert_eq!((k, p.len()), (RESPONSE, 0));
    let (k, p) = b.recv(far(), &mut || true).expect("frame");
    assert_eq!(k, REQUEST);
    assert_eq!(p, &big[..]);
}

#[test]
fn a_frame_cut_by_a_deadline_is_kept_until_its_rest_arrives() {
    let (mut a, mut raw) = pair();
    let mut frame = vec![6, 0, 0, 0, RESPONSE];
    frame.extend_from_slice(b"halves");
    raw.write_all(&frame[..7]).expect("write");
    let soon = Instant::now() + Duration::from_millis(60);
    assert!(matches!(
        a.recv(soon, &mut || true),
        Err(LinkError::TimedOut)
    ));
    raw.write_all(&frame[7..]).expect("write");
    let (k, p) = a.recv(far(), &mut || true).expect("frame");
    assert_eq!((k, p), (RESPONSE, &b"halves"[..]));
}

#[test]
fn a_frame_that_arrived_is_taken_even_after_the_deadline() {
    let (mut a, s) = pair();
    let mut b = Framed::new(Stream::Plain(s));
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 7) as u8).collect();
    a.send(RESPONSE, Duration::from_secs(1), |o| {
        o.extend_from_slice(&big)
    })
    .expect("send");
    std::thread::sleep(Duration::from_millis(50));
    let past = Instant::now() - Duration::from_millis(1);
    let (k, p) = b
        .recv(past, &mut || true)
        .expect("the frame was already there");
    assert_eq!((k, p.len()), (RESPONSE, big.len()));
    assert!(matches!(
        b.recv(past, &mut || true),
        Err(LinkError::TimedOut)
    ));
    // and the link still blocks normally afterwards
    a.send(REQUEST, Duration::from_secs(1), |_| {})
        .expect("send");
    let (k, _) = b.recv(far(), &mut || true).expect("frame");
    assert_eq!(k, REQUEST);
}

#[test]
fn oversized_frames_a_closed_peer_and_a_called_off_wait_are_errors() {
    let (mut a, mut raw) = pair();
    raw.write_all(&(MAX_FRAME as u32 + 1).to_le_bytes())
        .expect("write");
    raw.write_all(&[REQUEST]).expect("write");
    let e = a.recv(far(), &mut || true).expect_err("too long");
    assert!(matches!(e, LinkError::Malformed(_)), "{e}");

    let (mut a, raw) = pair();
    drop(raw);
    assert!(matches!(
        a.recv(far(), &mut || true),
        Err(LinkError::Closed)
    ));

    let (mut a, _raw) = pair();
    let start = Instant::now();
    assert!(matches!(
        a.recv(far(), &mut || false),
        Err(LinkError::Closed)
    ));
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[test]
fn hellos_and_refusals_round_trip_and_short_hellos_are_refused() {
    let h = Hello {
        protocol: 1,
        fingerprint: 0x0123_4567_89ab_cdef,
        token: b"Bearer t0ken".to_vec(),
    };
    let mut b = Vec::new();
    h.encode(&mut b);
    let back = Hello::decode(&b).expect("decode");
    assert_eq!(back, h);
    assert!(back.token_is(b"Bearer t0ken"));
    assert!(!back.token_is(b"Bearer t0kem"));
    assert!(!back.token_is(b"Bearer"));
    assert!(Hello::decode(&b[..11]).is_err());
    let mut r = Vec::new();
    encode_refusal(16, "missing or wrong node auth token", &mut r);
    assert_eq!(
        decode_refusal(&r),
        (16, "missing or wrong node auth token".to_string())
    );
}

#[test]
fn tls_material_that_is_not_pem_is_an_error_not_a_panic() {
    assert!(client_tls(b"not a certificate", None).is_err());
    assert!(server_tls(b"", b"", None).is_err());
}
