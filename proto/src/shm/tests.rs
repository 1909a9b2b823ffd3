//! Tests of the shared-memory link: both ends in one process, threads as the peers.

use super::*;

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("ns-shm-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn request(id: u64, n: usize) -> ComputeRequest {
    ComputeRequest {
        request_id: id,
        step_id: 0,
        layer: 3,
        act_type: 15,
        n_rows: 2,
        n_embd: 8,
        acts: (0..100).map(|i| i as u8).collect(),
        experts: (0..n as u32).map(|e| e * 7).collect(),
        rows: (0..n as u32).map(|e| e % 2).collect(),
        prefetch: None,
        parts: false,
    }
}

/// Distinct outputs for `req`: row i of pair i holds expert * 100 + i * 10 + k.
fn rows_of(req: &ComputeRequest) -> Vec<u8> {
    let e = req.n_embd as usize;
    let rows: Vec<f32> = req
        .experts
        .iter()
        .enumerate()
        .flat_map(|(i, &x)| (0..e).map(move |k| (x * 100 + i as u32 * 10 + k as u32) as f32))
        .collect();
    crate::f32s_to_le_bytes(&rows)
}

#[test]
fn requests_and_answers_cross_between_threads() {
    let d = dir();
    let mut client = ShmClient::create_in(&d, 8192, 8192).unwrap();
    let mut server = ShmServer::open_in(&d, client.path()).unwrap();
    client.unlink();
    assert!(!client.path().exists());
    let node = std::thread::spawn(move || {
        let mut seen = Vec::new();
        while let Ok(m) = server.next(Duration::from_secs(5)) {
            let Some(Incoming::Request(req)) = m else {
                panic!("expected a request, got {m:?}");
            };
            let reply = if req.layer == 99 {
                ShmReply::Error {
                    code: 5,
                    message: "no such layer".into(),
                }
            } else {
                ShmReply::Outputs(rows_of(&req))
            };
            server.reply(req.request_id, &reply);
            seen.push(req);
        }
        seen
    });
    let mut sent = Vec::new();
    for i in 0..50u64 {
        let mut req = request(i, 1 + i as usize % 5);
        if i == 7 {
            req.layer = 99;
        }
        client.post(&req).unwrap();
        let got = client
            .wait(Instant::now() + Duration::from_secs(5), &mut || true)
            .unwrap();
        let want = if i == 7 {
            ShmReply::Error {
                code: 5,
                message: "no such layer".into(),
            }
        } else {
            ShmReply::Outputs(rows_of(&req))
        };
        assert_eq!(got, want, "request {i}");
        sent.push(req);
    }
    drop(client);
    let seen = node.join().unwrap();
    assert_eq!(seen, sent, "the node saw every request exactly as posted");
}

#[test]
fn waits_end_at_the_deadline_at_a_dead_peer_and_at_close() {
    let d = dir();
    let mut client = ShmClient::create_in(&d, 4096, 4096).unwrap();
    let server = ShmServer::open_in(&d, client.path()).unwrap();
    client.post(&request(1, 2)).unwrap();
    let t = Instant::now();
    let r = client.wait(t + Duration::from_millis(60), &mut || true);
    assert!(matches!(r, Err(ShmError::Deadline(_))), "{r:?}");
    assert!(t.elapsed() >= Duration::from_millis(60));
    let r = client.wait(Instant::now() + Duration::from_secs(5), &mut || false);
    assert!(matches!(r, Err(ShmError::PeerGone)), "{r:?}");
    let t = Instant::now();
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        drop(server);
    });
    let r = client.wait(Instant::now() + Duration::from_secs(5), &mut || true);
    assert!(matches!(r, Err(ShmError::Closed)), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(2));
    closer.join().unwrap();
    assert!(matches!(client.post(&request(2, 1)), Err(ShmError::Closed)));
}

#[test]
fn sizes_beyond_the_region_are_refused_or_reported() {
    let d = dir();
    let mut client = ShmClient::create_in(&d, 4096, 4096).unwrap();
    let mut server = ShmServer::open_in(&d, client.path()).unwrap();
    assert!(client.fits(4, 2000, 8));
    assert!(!client.fits(4, 4096, 8), "request area");
    assert!(!client.fits(200, 0, 8), "response area");
    assert!(!client.fits(usize::MAX / 2, 0, 8), "overflow");
    let mut big = request(1, 2);
    big.acts = vec![0; 5000];
    assert!(matches!(client.post(&big), Err(ShmError::TooLarge)));
    // A writer that ignores the capacities: the node reports it instead of reading past
    // the region.
    client.post(&request(2, 2)).unwrap();
    client.region.set(OFF_REQ + 8 + 16, u32::MAX); // n_pairs
    match server.next(Duration::from_secs(1)).unwrap() {
        Some(Incoming::Malformed { request_id, reason }) => {
            assert_eq!(request_id, 2);
            assert!(reason.contains("exceed the request area"), "{reason}");
        }
        other => panic!("expected Malformed, got {other:?}"),
    }
    server.reply(
        2,
        &ShmReply::Outputs(vec![0; 5000]), // larger than the response area
    );
    let r = client
        .wait(Instant::now() + Duration::from_secs(1), &mut || true)
        .unwrap();
    assert!(matches!(r, ShmReply::Error { code: 8, .. }), "{r:?}");
}

#[test]
fn the_node_refuses_regions_it_should_not_map() {
    let d = dir();
    let other = d.join("sub");
    std::fs::create_dir_all(&other).unwrap();
    let refused = |p: &Path| match ShmServer::open_in(&d, p) {
        Err(ShmError::Refused { reason, .. }) => reason,
        Err(e) => panic!("{}: expected Refused, got {e}", p.display()),
        Ok(_) => panic!("{}: expected Refused, got a server", p.display()),
    };
    // Outside the directory, or another name.
    let elsewhere = ShmClient::create_in(&other, 4096, 4096).unwrap();
    assert!(refused(elsewhere.path()).contains("directly in"));
    let wrong_name = d.join("other-file");
    std::fs::write(&wrong_name, vec![0u8; 16384]).unwrap();
    assert!(refused(&wrong_name).contains("named"));
    // Missing, garbage, truncated, symlinked.
    assert!(refused(&d.join(format!("{SHM_PREFIX}missing"))).contains("open"));
    let garbage = d.join(format!("{SHM_PREFIX}garbage"));
    std::fs::write(&garbage, vec![0xABu8; 16384]).unwrap();
    assert!(refused(&garbage).contains("bad magic"));
    let tiny = d.join(format!("{SHM_PREFIX}tiny"));
    std::fs::write(&tiny, b"NSSHMv01").unwrap();
    assert!(refused(&tiny).contains("out of range"));
    let good = ShmClient::create_in(&d, 4096, 4096).unwrap();
    let bytes = std::fs::read(good.path()).unwrap();
    let cut = d.join(format!("{SHM_PREFIX}cut"));
    std::fs::write(&cut, &bytes[..bytes.len() - 4096]).unwrap();
    assert!(refused(&cut).contains("header says"));
    #[cfg(unix)]
    {
        let link = d.join(format!("{SHM_PREFIX}link"));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(good.path(), &link).unwrap();
        assert!(refused(&link).contains("open"));
    }
    // A creator that is gone.
    let mut dead = bytes.clone();
    dead[OFF_CLIENT_PID..OFF_CLIENT_PID + 4].copy_from_slice(&(i32::MAX as u32).to_ne_bytes());
    let orphan = d.join(format!("{SHM_PREFIX}orphan"));
    std::fs::write(&orphan, dead).unwrap();
    assert!(refused(&orphan).contains("not running"));
    assert!(ShmServer::open_in(&d, good.path()).is_ok());
}

#[test]
fn board_claims_each_group_once_and_only_under_the_current_tag() {
    let d = dir();
    let board = board::ClaimBoard::create_in(&d).unwrap();
    let node = board::ClaimBoard::open_in(&d, board.path()).unwrap();
    // Nothing is claimable before a call starts, nor under tag 0.
    assert_eq!(node.claim(1, 4), None);
    board.start(1);
    assert_eq!(node.claim(0, 4), None);
    assert_eq!(node.claim(2, 4), None, "another call's tag");
    assert_eq!(
        (0..6).map(|_| node.claim(1, 4)).collect::<Vec<_>>(),
        [Some(0), Some(1), Some(2), Some(3), None, None]
    );
    // The next call starts from its first group; the old tag takes nothing of it.
    board.start(2);
    assert_eq!(node.claim(1, 4), None);
    assert_eq!(node.claim(2, 4), Some(0));
    board.finish();
    assert_eq!(node.claim(2, 4), None);
    // Four threads over two mappings take 10 000 groups: each exactly once.
    board.start(3);
    let node = std::sync::Arc::new(node);
    let board = std::sync::Arc::new(board);
    let takers: Vec<_> = (0..4)
        .map(|i| {
            let b: std::sync::Arc<board::ClaimBoard> = if i % 2 == 0 {
                node.clone()
            } else {
                board.clone()
            };
            std::thread::spawn(move || {
                let mut got = Vec::new();
                while let Some(g) = b.claim(3, 10_000) {
                    got.push(g);
                }
                got
            })
        })
        .collect();
    let mut all: Vec<u32> = takers.into_iter().flat_map(|t| t.join().unwrap()).collect();
    all.sort_unstable();
    assert_eq!(all, (0..10_000).collect::<Vec<u32>>());
}

#[test]
fn the_node_refuses_boards_it_should_not_map() {
    let d = dir();
    let refused = |p: &Path| match board::ClaimBoard::open_in(&d, p) {
        Err(ShmError::Refused { reason, .. }) => reason,
        Err(e) => panic!("{}: expected Refused, got {e}", p.display()),
        Ok(_) => panic!("{}: expected Refused, got a board", p.display()),
    };
    let region = ShmClient::create_in(&d, 4096, 4096).unwrap();
    assert!(
        refused(region.path()).contains("out of range"),
        "a region is no board"
    );
    let garbage = d.join(format!("{SHM_PREFIX}garbage-board"));
    std::fs::write(&garbage, vec![0xABu8; board::BOARD_BYTES]).unwrap();
    assert!(refused(&garbage).contains("bad magic"));
    let good = board::ClaimBoard::create_in(&d).unwrap();
    let mut dead = std::fs::read(good.path()).unwrap();
    dead[8..16].copy_from_slice(&(i32::MAX as u64).to_ne_bytes());
    let orphan = d.join(format!("{SHM_PREFIX}orphan-board"));
    std::fs::write(&orphan, dead).unwrap();
    assert!(refused(&orphan).contains("not running"));
    assert!(refused(&d.join("board")).contains("named"));
    // The creator removes its file when it drops the board; a node's drop does not.
    let path = good.path().to_path_buf();
    drop(board::ClaimBoard::open_in(&d, &path).unwrap());
    assert!(path.exists());
    drop(good);
    assert!(!path.exists());
}

#[test]
fn shared_calls_answer_the_claimed_pairs() {
    let d = dir();
    let mut client = ShmClient::create_in(&d, 8192, 8192).unwrap();
    let mut server = ShmServer::open_in(&d, client.path()).unwrap();
    // A shared call whose first two expert groups are the node's: it answers pairs 3 and 1 only.
    client.post_tagged(&request(1, 4), 9, 2).unwrap();
    let Ok(Some(Incoming::Request(req))) = server.next(Duration::from_secs(1)) else {
        panic!("expected a request");
    };
    assert_eq!((server.claim_tag(), server.owned_groups()), (9, 2));
    let outputs: Vec<u8> = (0..2 * 8 * 4).map(|i| i as u8).collect();
    server.reply(
        req.request_id,
        &ShmReply::Partial {
            pairs: vec![3, 1],
            outputs: outputs.clone(),
        },
    );
    let got = client.wait(Instant::now() + Duration::from_secs(1), &mut || true);
    assert_eq!(
        got.unwrap(),
        ShmReply::Partial {
            pairs: vec![3, 1],
            outputs
        }
    );
    // An ordinary call carries tag 0; a partial answer to it is malformed.
    client.post(&request(2, 4)).unwrap();
    let Ok(Some(Incoming::Request(req))) = server.next(Duration::from_secs(1)) else {
        panic!("expected a request");
    };
    assert_eq!((server.claim_tag(), server.owned_groups()), (0, 0));
    server.reply(
        req.request_id,
        &ShmReply::Partial {
            pairs: vec![0],
            outputs: vec![0; 32],
        },
    );
    let got = client.wait(Instant::now() + Duration::from_secs(1), &mut || true);
    assert!(
        matches!(&got, Err(ShmError::Malformed(m)) if m.contains("ordinary call")),
        "{got:?}"
    );
    // Answers whose list overruns the pairs, or names a pair twice, are malformed too.
    for (forge, why) in [
        (
            &(|r: &Region| r.set(OFF_RESP + 16, 1000)) as &dyn Fn(&Region),
            "1000 pairs answered",
        ),
        (
            &|r: &Region| {
                r.write(
                    HEADER_BYTES + r.req_cap + 4 * 4 * 8 + 4,
                    &0u32.to_ne_bytes(),
                )
            },
            "pair 0 twice",
        ),
    ] {
        client.post_tagged(&request(3, 4), 10, 0).unwrap();
        let Ok(Some(Incoming::Request(req))) = server.next(Duration::from_secs(1)) else {
            panic!("expected a request");
        };
        server.reply(
            req.request_id,
            &ShmReply::Partial {
                pairs: vec![0, 1],
                outputs: vec![0; 2 * 8 * 4],
            },
        );
        forge(&server.region);
        let got = client.wait(Instant::now() + Duration::from_secs(1), &mut || true);
        assert!(
            matches!(&got, Err(ShmError::Malformed(m)) if m.contains(why)),
            "{why}: {got:?}"
        );
    }
    // Outputs that do not match the request's pairs become an error.
    client.post(&request(4, 4)).unwrap();
    let Ok(Some(Incoming::Request(req))) = server.next(Duration::from_secs(1)) else {
        panic!("expected a request");
    };
    server.reply(req.request_id, &ShmReply::Outputs(vec![0; 3 * 8 * 4]));
    let got = client.wait(Instant::now() + Duration::from_secs(1), &mut || true);
    assert!(
        matches!(&got, Ok(ShmReply::Error { code: 13, .. })),
        "{got:?}"
    );
}

#[test]
fn rows_go_from_the_node_to_the_coordinator_in_place() {
    let d = dir();
    let mut client = ShmClient::create_in(&d, 8192, 8192).unwrap();
    let mut server = ShmServer::open_in(&d, client.path()).unwrap();
    assert!(server.rows_mut().is_none(), "no request yet");
    for (tag, answered) in [(0, None), (5, Some(vec![2u32, 0]))] {
        client.post_tagged(&request(1, 3), tag, 0).unwrap();
        let Ok(Some(Incoming::Request(req))) = server.next(Duration::from_secs(1)) else {
            panic!("expected a request");
        };
        let rows = server.rows_mut().expect("3 rows of 8 fit");
        assert_eq!(rows.len(), 3 * 8);
        for (i, v) in rows.iter_mut().enumerate() {
            *v = i as f32 * 0.5;
        }
        server.reply_rows(req.request_id, answered.as_deref());
        let view = client
            .wait_view(Instant::now() + Duration::from_secs(1), &mut || true)
            .unwrap();
        let want: Vec<f32> = (0..24).map(|i| i as f32 * 0.5).collect();
        assert_eq!(
            view,
            ShmView::Rows {
                rows: &want,
                answered: answered.clone()
            },
            "tag {tag}"
        );
    }
    // Row slots that do not fit the response area (a forged width) are not handed out.
    let mut small = ShmClient::create_in(&d, 4096, 4096).unwrap();
    let mut node = ShmServer::open_in(&d, small.path()).unwrap();
    small.post(&request(9, 1)).unwrap();
    small.region.set(OFF_REQ + 8 + 12, 4096); // n_embd
    assert!(matches!(
        node.next(Duration::from_secs(1)),
        Ok(Some(Incoming::Request(_)))
    ));
    assert!(node.rows_mut().is_none());
    node.reply_rows(9, None);
    let got = small.wait(Instant::now() + Duration::from_secs(1), &mut || true);
    assert!(
        matches!(&got, Ok(ShmReply::Error { code: 8, .. })),
        "{got:?}"
    );
}

#[test]
fn the_sweep_removes_only_files_of_dead_creators() {
    let d = std::env::temp_dir().join(format!("ns-shm-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let dead = d.join(format!("{SHM_PREFIX}{}-board0-1", i32::MAX));
    let dead_region = d.join(format!("{SHM_PREFIX}{}-3-2", i32::MAX));
    let other = d.join(format!("other-{}-1", i32::MAX));
    let no_pid = d.join(format!("{SHM_PREFIX}test-garbage"));
    for f in [&dead, &dead_region, &other, &no_pid] {
        std::fs::write(f, b"x").unwrap();
    }
    let live = ShmClient::create_in(&d, 4096, 4096).unwrap();
    let board = board::ClaimBoard::create_in(&d).unwrap();
    assert_eq!(sweep_stale(&d), 2);
    assert!(!dead.exists() && !dead_region.exists());
    assert!(other.exists() && no_pid.exists());
    assert!(live.path().exists() && board.path().exists());
    assert_eq!(sweep_stale(&d.join("missing")), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn prefetch_hints_ride_with_requests_and_bad_counts_are_no_hint() {
    let d = dir();
    let mut client = ShmClient::create_in(&d, 8192, 8192).unwrap();
    let mut server = ShmServer::open_in(&d, client.path()).unwrap();
    client.unlink();
    let hint = |experts: Vec<u32>| PrefetchHint { layer: 4, experts };
    let long: Vec<u32> = (0..MAX_HINT_EXPERTS as u32 + 10).collect();
    // (hint posted, hint the node sees)
    let cases = [
        (Some(hint(vec![9, 2, 5])), Some(hint(vec![9, 2, 5]))),
        // the last request's hint is not left behind for one without
        (None, None),
        (
            Some(hint(long.clone())),
            Some(hint(long[..MAX_HINT_EXPERTS].to_vec())),
        ),
        (Some(hint(Vec::new())), None),
    ];
    for (i, (sent, want)) in cases.into_iter().enumerate() {
        let mut req = request(i as u64, 2);
        req.prefetch = sent;
        client.post(&req).unwrap();
        let Ok(Some(Incoming::Request(got))) = server.next(Duration::from_secs(5)) else {
            panic!("case {i}: expected a request");
        };
        assert_eq!(got.prefetch, want, "case {i}");
        assert_eq!(
            (&got.experts, &got.acts),
            (&req.experts, &req.acts),
            "case {i}"
        );
        server.reply(got.request_id, &ShmReply::Outputs(rows_of(&req)));
        client
            .wait(Instant::now() + Duration::from_secs(5), &mut || true)
            .unwrap();
    }
    // a count beyond the header (a region written by something else) is no hint, not an error
    let mut req = request(9, 1);
    req.prefetch = Some(hint(vec![1]));
    client.post(&req).unwrap();
    client.region.set(OFF_HINT + 4, u32::MAX);
    let Ok(Some(Incoming::Request(got))) = server.next(Duration::from_secs(5)) else {
        panic!("expected a request");
    };
    assert_eq!(got.prefetch, None);
}
