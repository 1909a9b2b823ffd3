//! The link's framing over real loopback sockets: frames round trip and split where they end,
//! a frame cut by a deadline is kept, one already arrived is taken after it, oversized frames (a
//! lower limit before the hello is answered) and closed peers are errors, a frame far larger
//! than a read arrives whole, hellos and refusals round trip.

use super::*;
use std::net::TcpListener;

/// A connected pair of plain links: an open framed one and its raw peer.
fn pair() -> (Framed, TcpStream) {
    let (c, s) = sockets();
    (open(Stream::Plain(c)), s)
}

/// Two connected loopback sockets.
fn sockets() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let c = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (s, _) = l.accept().expect("accept");
    (c, s)
}

/// A framed link past its hello.
fn open(io: Stream) -> Framed {
    let mut f = Framed::new(io);
    f.opened();
    f
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

#[test]
fn frames_round_trip_and_back_to_back_frames_split_where_they_end() {
    let (mut a, s) = pair();
    let mut b = open(Stream::Plain(s));
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
    let mut b = open(Stream::Plain(s));
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

    // Before the hello is answered a frame may not exceed HELLO_MAX: refused from its header,
    // without waiting for (or reserving room for) what it claims.
    let (mut raw, s) = sockets();
    let mut fresh = Framed::new(Stream::Plain(s));
    raw.write_all(&(HELLO_MAX as u32 + 1).to_le_bytes())
        .expect("write");
    raw.write_all(&[HELLO]).expect("write");
    let start = Instant::now();
    let e = fresh.recv(far(), &mut || true).expect_err("too long");
    assert!(
        matches!(&e, LinkError::Malformed(m) if m.contains("before the hello")),
        "{e}"
    );
    assert!(start.elapsed() < Duration::from_secs(1));
    assert!(
        fresh.buf.len() <= HEADER + (64 << 10),
        "{}",
        fresh.buf.len()
    );

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
fn a_frame_far_larger_than_a_read_arrives_whole_and_its_buffer_grows_with_it() {
    let (mut a, s) = pair();
    let mut b = open(Stream::Plain(s));
    let big: Vec<u8> = (0..(3 * GROW + 12_345) as u32)
        .map(|i| (i % 253) as u8)
        .collect();
    let sender = std::thread::spawn(move || {
        a.send(RESPONSE, Duration::from_secs(10), |o| {
            o.extend_from_slice(&big)
        })
        .expect("send");
        big
    });
    let (k, p) = b.recv(far(), &mut || true).expect("frame");
    let (k, p) = (k, p.to_vec());
    let big = sender.join().expect("sender");
    assert_eq!(k, RESPONSE);
    assert!(p == big, "the payload differs");
    // A header claiming more than has arrived reserves at most GROW ahead of the bytes.
    let (mut a, mut raw) = pair();
    raw.write_all(&(400u32 << 20).to_le_bytes()).expect("write");
    raw.write_all(&[RESPONSE]).expect("write");
    raw.write_all(&[7; 1000]).expect("write");
    let soon = Instant::now() + Duration::from_millis(60);
    assert!(matches!(
        a.recv(soon, &mut || true),
        Err(LinkError::TimedOut)
    ));
    assert!(a.buf.len() <= GROW + 1005, "{}", a.buf.len());
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

#[test]
fn parts_round_trip_and_every_wrong_length_is_an_error() {
    let rows: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    let mut b = Vec::new();
    encode_part(77, &[4, 1], &rows, &mut b);
    let p = decode_part(&b, 3).expect("decode");
    assert_eq!((p.request_id, p.idx.clone()), (77, vec![4, 1]));
    let mut back = vec![0f32; 6];
    crate::le_bytes_to_f32s(p.rows, &mut back);
    assert_eq!(back, rows);
    // rows of another width, a cut payload, a trailing byte, a count that overflows
    assert!(decode_part(&b, 2).is_err());
    assert!(decode_part(&b[..b.len() - 1], 3).is_err());
    b.push(0);
    assert!(decode_part(&b, 3).is_err());
    assert!(decode_part(&b[..11], 3).is_err());
    let mut huge = 9u64.to_le_bytes().to_vec();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(decode_part(&huge, usize::MAX / 8).is_err());
}
