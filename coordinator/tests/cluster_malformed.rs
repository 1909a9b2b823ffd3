//! Malformed input to an expert node, from a client that is not the coordinator: bad compute
//! messages on the gRPC stream, bad shared-memory regions and requests, bad hellos and frames on
//! the data link. Each gets an error naming the problem (or the link closed), never a crash, and
//! the node keeps serving the good requests after them.

mod support;

use support::cluster::{explicit, launch};
use support::fixture as data;

use std::time::{Duration, Instant};

use nightshift_coordinator::cluster::{model_shape, LocalCluster};
use nightshift_model::Model;
use nightshift_proto::shm::{ShmClient, ShmReply};
use nightshift_proto::v1::expert_service_client::ExpertServiceClient;
use nightshift_proto::v1::{compute_response, AttachShmRequest, ComputeRequest, PrefetchHint};
use nightshift_proto::{FINGERPRINT_HEADER, PROTOCOL_HEADER};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Presents the cluster's node token (the nodes refuse every call without it).
#[derive(Clone)]
struct Token(String);

impl tonic::service::Interceptor for Token {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let v = format!("Bearer {}", self.0).parse().expect("header");
        req.metadata_mut().insert(nightshift_proto::AUTH_HEADER, v);
        Ok(req)
    }
}

async fn client(
    cluster: &LocalCluster,
    addr: &str,
) -> ExpertServiceClient<InterceptedService<Channel, Token>> {
    let ch = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    ExpertServiceClient::with_interceptor(ch, Token(cluster.auth_token().to_string()))
}

fn good(model: &Model, layer: u32) -> ComputeRequest {
    let n_embd = model.config().n_embd;
    let ty = model.expert_act_type(layer as usize).expect("moe layer");
    let x: Vec<f32> = (0..n_embd).map(|i| (i as f32 * 0.37).sin()).collect();
    let acts = nightshift_model::ActRows::quantize(ty, &x, n_embd).expect("quantize");
    ComputeRequest {
        request_id: 1,
        step_id: 0,
        layer,
        act_type: ty.id(),
        n_rows: 1,
        n_embd: n_embd as u32,
        acts: acts.data,
        experts: vec![0],
        rows: vec![0],
        prefetch: None,
        parts: false,
    }
}

/// Requests a node must answer with an error status (each a good one with one fault), and
/// the status.
fn bad_requests(model: &Model, layer: u32) -> Vec<(&'static str, ComputeRequest, tonic::Code)> {
    let g = good(model, layer);
    vec![
        (
            "wrong n_embd",
            ComputeRequest {
                n_embd: g.n_embd + 1,
                ..g.clone()
            },
            tonic::Code::InvalidArgument,
        ),
        (
            "unknown act type",
            ComputeRequest {
                act_type: 99,
                ..g.clone()
            },
            tonic::Code::InvalidArgument,
        ),
        (
            "truncated acts",
            ComputeRequest {
                acts: g.acts[..g.acts.len() - 3].to_vec(),
                ..g.clone()
            },
            tonic::Code::InvalidArgument,
        ),
        (
            "row out of range",
            ComputeRequest {
                rows: vec![5],
                ..g.clone()
            },
            tonic::Code::InvalidArgument,
        ),
        (
            "pairs mismatch",
            ComputeRequest {
                rows: vec![0, 0],
                ..g.clone()
            },
            tonic::Code::InvalidArgument,
        ),
        (
            "expert not held",
            ComputeRequest {
                experts: vec![1],
                ..g.clone()
            },
            tonic::Code::NotFound,
        ),
        (
            "no such layer",
            ComputeRequest {
                layer: 999,
                ..g.clone()
            },
            tonic::Code::NotFound,
        ),
        (
            "wrong act type for layer",
            ComputeRequest {
                act_type: 8,
                acts: vec![0; 34 * (g.n_embd as usize / 32)],
                ..g.clone()
            },
            tonic::Code::InvalidArgument,
        ),
        (
            "huge n_rows",
            ComputeRequest {
                n_rows: u32::MAX,
                ..g.clone()
            },
            tonic::Code::InvalidArgument,
        ),
    ]
}

#[test]
fn bad_messages_get_error_statuses() {
    let path = data("tiny-qwen3moe-Q2_K.gguf");
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    // node0 holds only the even experts.
    let cluster = launch(&path, explicit(&shape, 2, |e| vec![e % 2]));
    let addr = cluster.placement().nodes[0].addr.clone().expect("addr");
    let layer = shape.moe_layers[0] as u32;
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let mut client = client(&cluster, &addr).await;
        // No handshake metadata: refused.
        let (_tx, rx) = tokio::sync::mpsc::channel::<ComputeRequest>(1);
        let err = client
            .compute(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect_err("no handshake");
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        // Wrong fingerprint: refused.
        let (_tx, rx) = tokio::sync::mpsc::channel::<ComputeRequest>(1);
        let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        req.metadata_mut()
            .insert(PROTOCOL_HEADER, "1".parse().unwrap());
        req.metadata_mut()
            .insert(FINGERPRINT_HEADER, "0123456789abcdef".parse().unwrap());
        let err = client.compute(req).await.expect_err("wrong model");
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(err.message().contains("fingerprint"), "{}", err.message());

        // A proper stream: each bad request gets an error response, the stream stays usable.
        let (tx, rx) = tokio::sync::mpsc::channel::<ComputeRequest>(16);
        let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        req.metadata_mut()
            .insert(PROTOCOL_HEADER, "1".parse().unwrap());
        req.metadata_mut().insert(
            FINGERPRINT_HEADER,
            format!("{:016x}", model.gguf().fingerprint())
                .parse()
                .unwrap(),
        );
        let mut inbound = client.compute(req).await.expect("stream").into_inner();
        let cases = bad_requests(&model, layer);
        for (i, (what, mut bad, code)) in cases.into_iter().enumerate() {
            bad.request_id = 100 + i as u64;
            tx.send(bad).await.expect("send");
            let resp = inbound
                .message()
                .await
                .expect("response")
                .expect("stream open");
            assert_eq!(resp.request_id, 100 + i as u64, "{what}");
            match resp.result {
                Some(compute_response::Result::Error(e)) => {
                    assert_eq!(e.code, code as i32, "{what}: {}", e.message)
                }
                other => panic!("{what}: expected an error, got {other:?}"),
            }
        }
        tx.send(good(&model, layer)).await.expect("send");
        let resp = inbound.message().await.expect("response").expect("open");
        let plain = match resp.result {
            Some(compute_response::Result::Outputs(b)) => {
                assert_eq!(b.len(), model.config().n_embd * 4);
                b
            }
            other => panic!("good request failed after bad ones: {other:?}"),
        };
        // Prefetch hints naming experts the node does not hold (another layer, ids out of
        // range) are ignored: alone, a hint gets no answer; with a request, it changes
        // nothing in the answer.
        let bogus = PrefetchHint {
            layer: 999,
            experts: vec![u32::MAX, 1],
        };
        let alone = ComputeRequest {
            request_id: 200,
            n_rows: 0,
            acts: Vec::new(),
            experts: Vec::new(),
            rows: Vec::new(),
            prefetch: Some(bogus.clone()),
            ..good(&model, layer)
        };
        let riding = ComputeRequest {
            request_id: 201,
            prefetch: Some(PrefetchHint { layer, ..bogus }),
            ..good(&model, layer)
        };
        tx.send(alone).await.expect("send");
        tx.send(riding).await.expect("send");
        let resp = inbound.message().await.expect("response").expect("open");
        assert_eq!(resp.request_id, 201, "a hint alone is not answered");
        match resp.result {
            Some(compute_response::Result::Outputs(b)) => {
                assert_eq!(b, plain, "a hint changed the answer")
            }
            other => panic!("a request with a bad hint failed: {other:?}"),
        }
    });
}
/// Opens a data link to `addr`'s node on `port` and sends `hello`; the node's first frame.
fn link_hello(
    addr: &str,
    port: u16,
    hello: &nightshift_proto::link::Hello,
) -> (nightshift_proto::link::Framed, u8, Vec<u8>) {
    use nightshift_proto::link::{Framed, Stream, HELLO};
    let host = addr.rsplit_once(':').expect("host:port").0;
    let sock = std::net::TcpStream::connect((host, port)).expect("dial the data link");
    let mut f = Framed::new(Stream::Plain(sock));
    f.send(HELLO, Duration::from_secs(5), |o| hello.encode(o))
        .expect("send the hello");
    let far = Instant::now() + Duration::from_secs(10);
    let (kind, payload) = f.recv(far, &mut || true).expect("the node answers");
    let payload = payload.to_vec();
    f.opened();
    (f, kind, payload)
}

#[test]
fn bad_hellos_and_bad_frames_on_the_data_link_get_errors() {
    use nightshift_proto::link::{self, Hello, LinkError};
    use prost::Message;
    let path = data("tiny-qwen3moe-Q2_K.gguf");
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    let cluster = launch(&path, explicit(&shape, 2, |e| vec![e % 2]));
    let addr = cluster.placement().nodes[0].addr.clone().expect("addr");
    let layer = shape.moe_layers[0] as u32;
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let info = rt.block_on(async {
        let mut c = client(&cluster, &addr).await;
        c.info(nightshift_proto::v1::InfoRequest {})
            .await
            .expect("info")
            .into_inner()
    });
    let port = u16::try_from(info.link_port).expect("a port");
    assert!(port > 0, "the node reports its data link: {info:?}");
    let good_hello = Hello {
        protocol: nightshift_proto::PROTOCOL_VERSION,
        fingerprint: model.gguf().fingerprint(),
        token: format!("Bearer {}", cluster.auth_token()).into_bytes(),
    };
    let far = || Instant::now() + Duration::from_secs(10);
    // Refused hellos: the reason comes back, then the node closes the link.
    let refused = [
        (
            "wrong token",
            Hello {
                token: b"Bearer nope".to_vec(),
                ..good_hello.clone()
            },
            tonic::Code::Unauthenticated,
        ),
        (
            "no token",
            Hello {
                token: Vec::new(),
                ..good_hello.clone()
            },
            tonic::Code::Unauthenticated,
        ),
        (
            "another model",
            Hello {
                fingerprint: 0x0123_4567_89ab_cdef,
                ..good_hello.clone()
            },
            tonic::Code::FailedPrecondition,
        ),
        (
            "another protocol",
            Hello {
                protocol: 99,
                ..good_hello.clone()
            },
            tonic::Code::FailedPrecondition,
        ),
    ];
    for (what, hello, code) in refused {
        let (mut f, kind, payload) = link_hello(&addr, port, &hello);
        assert_eq!(kind, link::REFUSED, "{what}");
        let (got, reason) = link::decode_refusal(&payload);
        assert_eq!(got, code as u32, "{what}: {reason}");
        let after = f.recv(far(), &mut || true).map(|(k, _)| k);
        assert!(matches!(after, Err(LinkError::Closed)), "{what}: {after:?}");
    }
    // A link that starts with anything but a hello, or with a short one, is refused too.
    let host = addr.rsplit_once(':').expect("host:port").0;
    for (what, kind, body) in [
        ("a request first", link::REQUEST, vec![1u8; 40]),
        ("a short hello", link::HELLO, vec![1u8; 5]),
    ] {
        let sock = std::net::TcpStream::connect((host, port)).expect("dial");
        let mut f = link::Framed::new(link::Stream::Plain(sock));
        f.send(kind, Duration::from_secs(5), |o| o.extend_from_slice(&body))
            .expect("send");
        let got = f.recv(far(), &mut || true).map(|(k, _)| k);
        assert!(matches!(got, Ok(link::REFUSED)), "{what}: {got:?}");
    }
    // A hello frame claiming more than a hello may be (256 MiB, its bytes never sent) is
    // refused from its header at once: the node neither waits for nor reserves what it claims.
    {
        use std::io::Write;
        let sock = std::net::TcpStream::connect((host, port)).expect("dial");
        let mut raw = sock.try_clone().expect("clone");
        let mut f = link::Framed::new(link::Stream::Plain(sock));
        raw.write_all(&(256u32 << 20).to_le_bytes()).expect("w");
        raw.write_all(&[link::HELLO]).expect("w");
        let start = Instant::now();
        let (kind, payload) = f
            .recv(Instant::now() + Duration::from_secs(3), &mut || true)
            .expect("a refusal before the open timeout");
        assert_eq!(kind, link::REFUSED);
        let (code, reason) = link::decode_refusal(payload);
        assert_eq!(code, tonic::Code::InvalidArgument as u32, "{reason}");
        assert!(reason.contains("before the hello"), "{reason}");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }
    // An open link: every bad request gets its error answer and the link goes on.
    let (mut f, kind, _) = link_hello(&addr, port, &good_hello);
    assert_eq!(kind, link::WELCOME);
    let ask = |f: &mut link::Framed, body: Vec<u8>| {
        f.send(link::REQUEST, Duration::from_secs(5), |o| {
            o.extend_from_slice(&body)
        })
        .expect("send");
        let (kind, payload) = f.recv(far(), &mut || true).expect("an answer");
        assert_eq!(kind, link::RESPONSE);
        nightshift_proto::v1::ComputeResponse::decode(payload).expect("a response")
    };
    for (i, (what, mut bad, code)) in bad_requests(&model, layer).into_iter().enumerate() {
        bad.request_id = 100 + i as u64;
        let resp = ask(&mut f, bad.encode_to_vec());
        assert_eq!(resp.request_id, 100 + i as u64, "{what}");
        match resp.result {
            Some(compute_response::Result::Error(e)) => {
                assert_eq!(e.code, code as i32, "{what}: {}", e.message)
            }
            other => panic!("{what}: expected an error, got {other:?}"),
        }
    }
    let resp = ask(&mut f, vec![0xff; 64]);
    match resp.result {
        Some(compute_response::Result::Error(e)) => {
            assert_eq!(e.code, tonic::Code::InvalidArgument as i32, "{}", e.message)
        }
        other => panic!("undecodable request: expected an error, got {other:?}"),
    }
    let resp = ask(&mut f, good(&model, layer).encode_to_vec());
    match resp.result {
        Some(compute_response::Result::Outputs(b)) => {
            assert_eq!(b.len(), model.config().n_embd * 4)
        }
        other => panic!("good request failed after bad ones: {other:?}"),
    }
    assert!(resp.received_ns > 0 && resp.started_ns <= resp.ended_ns);
    // A frame longer than the link allows ends the link; the node serves on.
    let sock = std::net::TcpStream::connect((host, port)).expect("dial");
    let mut raw = sock.try_clone().expect("clone");
    let mut f2 = link::Framed::new(link::Stream::Plain(sock));
    let mut hello = Vec::new();
    good_hello.encode(&mut hello);
    use std::io::Write;
    raw.write_all(&(hello.len() as u32).to_le_bytes())
        .expect("w");
    raw.write_all(&[link::HELLO]).expect("w");
    raw.write_all(&hello).expect("w");
    let (kind, _) = f2.recv(far(), &mut || true).expect("welcome");
    assert_eq!(kind, link::WELCOME);
    f2.opened();
    raw.write_all(&u32::MAX.to_le_bytes()).expect("w");
    raw.write_all(&[link::REQUEST]).expect("w");
    let got = f2.recv(far(), &mut || true).map(|(k, _)| k);
    assert!(matches!(got, Err(LinkError::Closed)), "{got:?}");
    let resp = ask(&mut f, good(&model, layer).encode_to_vec());
    assert!(
        matches!(resp.result, Some(compute_response::Result::Outputs(_))),
        "the first link still serves"
    );
}

#[test]
fn bad_regions_and_bad_shared_memory_requests_get_errors() {
    let path = data("tiny-qwen3moe-Q2_K.gguf");
    let model = Model::load(&path).expect("model");
    let shape = model_shape(&model).expect("shape");
    let cluster = launch(&path, explicit(&shape, 2, |e| vec![e % 2]));
    let addr = cluster.placement().nodes[0].addr.clone().expect("addr");
    let layer = shape.moe_layers[0] as u32;
    let fingerprint = format!("{:016x}", model.gguf().fingerprint());
    let attach_with = |path: &str, board: &str, handshake: bool| {
        let mut req = tonic::Request::new(AttachShmRequest {
            path: path.into(),
            board: board.into(),
        });
        if handshake {
            req.metadata_mut()
                .insert(PROTOCOL_HEADER, "1".parse().unwrap());
            req.metadata_mut()
                .insert(FINGERPRINT_HEADER, fingerprint.parse().unwrap());
        }
        req
    };
    let attach = |path: &str, handshake: bool| attach_with(path, "", handshake);
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let mut region = ShmClient::create(1 << 16, 1 << 16).expect("region");
    let garbage = std::path::Path::new(nightshift_proto::shm::SHM_DIR)
        .join(format!("nightshift-test-garbage-{}", std::process::id()));
    std::fs::write(&garbage, vec![0x5Au8; 1 << 16]).expect("garbage region");
    rt.block_on(async {
        let mut client = client(&cluster, &addr).await;
        let good_path = region.path().display().to_string();
        let err = client
            .attach_shm(attach(&good_path, false))
            .await
            .expect_err("no handshake");
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        for (bad, why) in [
            ("/etc/passwd", "directly in"),
            ("/dev/shm/../etc/passwd", "directly in"),
            ("/dev/shm/nightshift-does-not-exist", "open"),
            (garbage.to_str().unwrap(), "bad magic"),
        ] {
            let err = client.attach_shm(attach(bad, true)).await.expect_err(bad);
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad}");
            assert!(err.message().contains(why), "{bad}: {}", err.message());
        }
        // A good region with a bad claim board is refused as a whole.
        for (bad, why) in [
            ("/etc/passwd", "directly in"),
            (garbage.to_str().unwrap(), "out of range"),
            (good_path.as_str(), "out of range"),
        ] {
            let err = client
                .attach_shm(attach_with(&good_path, bad, true))
                .await
                .expect_err(bad);
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad}");
            let m = err.message();
            assert!(m.contains("claim board") && m.contains(why), "{bad}: {m}");
        }
        client
            .attach_shm(attach(&good_path, true))
            .await
            .expect("attach");
    });
    let _ = std::fs::remove_file(&garbage);
    region.unlink();
    let g = good(&model, layer);
    let mut cases = bad_requests(&model, layer);
    // The client refuses to post this one: it never reaches the node.
    let uneven = cases.remove(cases.iter().position(|c| c.0 == "pairs mismatch").unwrap());
    assert!(region.post(&uneven.1).is_err());
    let deadline = || Instant::now() + Duration::from_secs(10);
    for (i, (what, mut bad, code)) in cases.into_iter().enumerate() {
        bad.request_id = 200 + i as u64;
        region.post(&bad).expect("post");
        match region.wait(deadline(), &mut || true).expect(what) {
            ShmReply::Error { code: c, message } => {
                assert_eq!(c, code as i32, "{what}: {message}")
            }
            other => panic!("{what}: expected an error, got {other:?}"),
        }
    }
    // A shared call needs the claim board this link was not given.
    region.post_tagged(&g, 7, 0).expect("post");
    match region.wait(deadline(), &mut || true).expect("shared") {
        ShmReply::Error { code, message } => {
            assert_eq!(code, tonic::Code::FailedPrecondition as i32, "{message}");
            assert!(message.contains("no claim board"), "{message}");
        }
        other => panic!("shared call without a board: expected an error, got {other:?}"),
    }
    // The link still serves, with the same bits as the stream.
    region.post(&g).expect("post");
    let ShmReply::Outputs(via_shm) = region.wait(deadline(), &mut || true).expect("good") else {
        panic!("good request failed after bad ones");
    };
    assert_eq!(via_shm.len(), model.config().n_embd * 4);
    let via_stream = rt.block_on(async {
        let mut client = client(&cluster, &addr).await;
        let (tx, rx) = tokio::sync::mpsc::channel::<ComputeRequest>(1);
        let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        req.metadata_mut()
            .insert(PROTOCOL_HEADER, "1".parse().unwrap());
        req.metadata_mut()
            .insert(FINGERPRINT_HEADER, fingerprint.parse().unwrap());
        let mut inbound = client.compute(req).await.expect("stream").into_inner();
        tx.send(g.clone()).await.expect("send");
        match inbound
            .message()
            .await
            .expect("response")
            .expect("open")
            .result
        {
            Some(compute_response::Result::Outputs(b)) => b,
            other => panic!("stream: {other:?}"),
        }
    });
    assert_eq!(via_shm, via_stream);
}
