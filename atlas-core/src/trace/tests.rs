//! Trace tests: the recorder counts what it is fed (all-time, window rotation, pairs, nodes), the
//! atlas file round-trips, and every kind of damage to a file is reported as its own error.

use super::*;
use crate::placement::ModelShape;

fn shape() -> ModelShape {
    ModelShape {
        moe_layers: vec![1, 3],
        n_experts: 6,
        expert_bytes: 1000,
    }
}

fn recorder(window: u64) -> Recorder {
    let mut cfg = RecorderConfig::new("test-model", 2);
    cfg.window_tokens = window;
    cfg.pairs_per_layer = 3;
    cfg.pair_sample_every = 1;
    cfg.nodes = vec!["n0".into(), "n1".into()];
    Recorder::new(shape(), cfg)
}

#[test]
fn recorder_counts_activations_weights_pairs_and_nodes() {
    let mut r = recorder(0);
    // two rows on layer 1: (0,1) and (1,2); one row on layer 3: (5,4)
    r.record(1, &[0, 1, 2, 1], &[0.75, 0.25, 0.5, 0.5]).unwrap();
    r.record(3, &[5, 4], &[0.6, 0.4]).unwrap();
    r.record(1, &[1, 0], &[1.0, 0.0]).unwrap();
    r.record_node(1, 7).unwrap();
    let a = r.snapshot();
    assert_eq!(
        a.all_time.tokens, 3,
        "tokens counted at the first MoE layer"
    );
    assert_eq!(
        a.all_time.activations,
        vec![vec![2, 3, 1, 0, 0, 0], vec![0, 0, 0, 0, 1, 1]]
    );
    assert_eq!(
        a.all_time.weight_sums[0],
        vec![0.75, 1.75, 0.5, 0.0, 0.0, 0.0]
    );
    assert_eq!(
        a.pairs[0],
        LayerPairs {
            layer: 1,
            pairs: vec![(0, 1, 2), (1, 2, 1)]
        }
    );
    assert_eq!(
        a.pairs[1],
        LayerPairs {
            layer: 3,
            pairs: vec![(4, 5, 1)]
        }
    );
    assert_eq!(
        a.nodes,
        vec![
            NodeLoad {
                name: "n0".into(),
                rows: 0
            },
            NodeLoad {
                name: "n1".into(),
                rows: 7
            }
        ]
    );
    assert_eq!(a.window.tokens, 0);
    a.check().unwrap();
}

#[test]
fn recorder_rejects_bad_calls_without_counting() {
    let mut r = recorder(16);
    let rows: Vec<(usize, Vec<usize>, Vec<f32>, RecordError)> = vec![
        (
            0,
            vec![0, 1],
            vec![0.5, 0.5],
            RecordError::NotMoeLayer { layer: 0 },
        ),
        (
            9,
            vec![0, 1],
            vec![0.5, 0.5],
            RecordError::NotMoeLayer { layer: 9 },
        ),
        (
            1,
            vec![0, 6],
            vec![0.5, 0.5],
            RecordError::ExpertOutOfRange {
                expert: 6,
                n_experts: 6,
            },
        ),
        (
            1,
            vec![0, 1, 2],
            vec![0.5, 0.5, 0.1],
            RecordError::Shape {
                experts: 3,
                weights: 3,
                top_k: 2,
            },
        ),
        (
            1,
            vec![0, 1],
            vec![0.5],
            RecordError::Shape {
                experts: 2,
                weights: 1,
                top_k: 2,
            },
        ),
    ];
    for (layer, e, w, expect) in rows {
        assert_eq!(r.record(layer, &e, &w), Err(expect));
    }
    assert_eq!(
        r.record_node(2, 1),
        Err(RecordError::NodeOutOfRange {
            node: 2,
            n_nodes: 2
        })
    );
    let a = r.snapshot();
    assert_eq!(a.all_time.total_activations(), 0);
    assert_eq!(a.all_time.tokens, 0);
    assert_eq!(a.window.tokens, 0);
}

#[test]
fn window_forgets_old_buckets() {
    // window 16 tokens = 8 buckets of 2 tokens
    let mut r = recorder(16);
    for _ in 0..16 {
        r.record(1, &[0, 1], &[0.5, 0.5]).unwrap();
    }
    let a = r.snapshot();
    assert_eq!((a.window.tokens, a.window.activations[0][0]), (16, 16));
    // 16 more tokens on other experts push every old bucket out but the current one's age
    for _ in 0..16 {
        r.record(1, &[2, 3], &[0.5, 0.5]).unwrap();
    }
    let a = r.snapshot();
    assert_eq!(a.all_time.tokens, 32);
    assert_eq!(a.all_time.activations[0][..4], [16, 16, 16, 16]);
    assert_eq!(a.window.tokens, 16);
    assert_eq!(a.window.activations[0][..4], [0, 0, 16, 16]);
    assert_eq!(a.window.weight_sums[0][2], 8.0);
}

#[test]
fn pair_sketch_keeps_the_frequent_pairs() {
    for every in [1, 4] {
        pair_sketch_case(every);
    }
}

fn pair_sketch_case(every: u32) {
    // 15 experts -> 105 possible pairs in a 64-cell sketch: the hot pairs must survive the noise.
    let shape = ModelShape {
        moe_layers: vec![0],
        n_experts: 15,
        expert_bytes: 1,
    };
    let mut cfg = RecorderConfig::new("m", 2);
    cfg.pair_capacity = 64;
    cfg.pairs_per_layer = 2;
    cfg.pair_sample_every = every;
    let mut r = Recorder::new(shape, cfg);
    let mut state = 1u64;
    for t in 0..20_000u64 {
        let (a, b) = match t % 4 {
            0 => (3, 7),
            1 => (10, 2),
            _ => {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let a = (state >> 33) as usize % 15;
                let b = (a + 1 + (state >> 45) as usize % 14) % 15;
                (a, b)
            }
        };
        r.record(0, &[a, b], &[0.5, 0.5]).unwrap();
    }
    let pairs: Vec<(u32, u32)> = r.snapshot().pairs[0]
        .pairs
        .iter()
        .map(|p| (p.0, p.1))
        .collect();
    assert_eq!(pairs, vec![(3, 7), (2, 10)], "sampling 1 row in {every}");
}

#[test]
fn atlas_file_round_trips() {
    let mut r = recorder(16);
    r.record(1, &[0, 1, 2, 3], &[0.125, 0.875, 0.5, 0.5])
        .unwrap();
    r.record(3, &[4, 5, 0, 5], &[0.5, 0.5, 0.3, 0.7]).unwrap();
    let a = r.snapshot();
    let back = Atlas::from_bytes(&a.to_bytes()).unwrap();
    assert_eq!(a, back);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.atlas");
    a.save_atomic(&path).unwrap();
    assert_eq!(Atlas::load(&path).unwrap(), a);
    // The bare JSON body, as `curl .../v1/atlas` saves it, is read with the same checks.
    let json = serde_json::to_vec_pretty(&a).unwrap();
    assert_eq!(Atlas::from_bytes(&json).unwrap(), a);
    let mut bad = a.clone();
    bad.top_k = 99;
    let e = Atlas::from_bytes(&serde_json::to_vec(&bad).unwrap()).unwrap_err();
    assert!(e.to_string().contains("top_k"), "{e}");
}

#[test]
fn damaged_files_are_rejected_with_their_own_error() {
    let mut r = recorder(16);
    r.record(1, &[0, 1], &[0.5, 0.5]).unwrap();
    let good = r.snapshot().to_bytes();
    let nl = good.iter().position(|&b| b == b'\n').unwrap();
    let header = String::from_utf8(good[..nl].to_vec()).unwrap();
    let body = good[nl + 1..].to_vec();
    let crc = crc32fast::hash(&body);
    let with_body = |b: &[u8]| {
        let mut v = format!(
            "NSATLAS 1 len={} crc32={:08x}\n",
            b.len(),
            crc32fast::hash(b)
        )
        .into_bytes();
        v.extend_from_slice(b);
        v
    };
    let body_str = String::from_utf8(body.clone()).unwrap();
    let mut flipped = good.clone();
    let last = flipped.len() - 10;
    flipped[last] ^= 0x01;
    let rows: Vec<(&str, Vec<u8>, String)> = vec![
        ("empty", vec![], "not an atlas file: expected a header line starting with \"NSATLAS \", found \"\"".into()),
        ("toml", b"version = 1\n".to_vec(), "not an atlas file: expected a header line starting with \"NSATLAS \", found \"version = 1\"".into()),
        ("no newline", b"NSATLAS 1 len=3 crc32=00000000".to_vec(),
         "malformed atlas header: expected \"NSATLAS <version> len=<n> crc32=<8 hex>\", found \"NSATLAS 1 len=3 crc32=00000000\"".into()),
        ("version", [b"NSATLAS 2".as_slice(), &good[9..]].concat(), "unsupported atlas format version: expected 1, found 2".into()),
        ("bad crc field", [format!("NSATLAS 1 len={} crc32=xyz\n", body.len()).as_bytes(), &body].concat(),
         format!("malformed atlas header: expected \"NSATLAS <version> len=<n> crc32=<8 hex>\", found \"NSATLAS 1 len={} crc32=xyz\"", body.len())),
        ("truncated", good[..good.len() - 5].to_vec(), format!("atlas body truncated or padded: header says {} bytes, found {}", body.len(), body.len() - 5)),
        ("bit flip", flipped.clone(), format!("atlas body corrupt: header crc32 {crc:08x}, body crc32 {:08x}", crc32fast::hash(&flipped[nl + 1..]))),
        ("not json", with_body(b"{\"format_version\":1,"), "atlas body is not valid json at line 1, column 20: EOF while parsing a value".into()),
        ("short layer", with_body(body_str.replacen("[1,1,0,0,0,0]", "[1,1,0,0,0]", 1).as_bytes()),
         "inconsistent atlas: all_time.activations[0]: expected 6 experts, found 5".into()),
        ("top_k", with_body(body_str.replace("\"top_k\":2", "\"top_k\":7").as_bytes()), "inconsistent atlas: top_k: expected 1..=6, found 7".into()),
        ("negative weight", with_body(body_str.replacen("[0.5,0.5,0.0", "[-0.5,0.5,0.0", 1).as_bytes()),
         "inconsistent atlas: all_time.weight_sums[0]: expected finite non-negative sums, found -0.5".into()),
        ("bad pair", with_body(body_str.replace("[0,1,1]", "[1,0,1]").as_bytes()), "inconsistent atlas: pairs[0]: expected a < b < 6, found (1, 0)".into()),
        ("counts overflow", with_body(body_str.replacen("[1,1,0,0,0,0]", "[18446744073709551615,18446744073709551615,0,0,0,0]", 1).as_bytes()),
         "inconsistent atlas: all_time.activations[0]: expected counts whose sum over the atlas fits in 64 bits, found a sum that overflows".into()),
        ("counts overflow across layers", with_body(body_str.replacen("[[1,1,0,0,0,0],[0,0,0,0,0,0]]", "[[18446744073709551615,0,0,0,0,0],[1,0,0,0,0,0]]", 1).as_bytes()),
         "inconsistent atlas: all_time.activations[1]: expected counts whose sum over the atlas fits in 64 bits, found a sum that overflows".into()),
    ];
    assert!(header.starts_with("NSATLAS 1 len="));
    let mut failures = Vec::new();
    for (name, bytes, expect) in rows {
        let got = match Atlas::from_bytes(&bytes) {
            Ok(_) => "ok".to_string(),
            Err(e) => e.to_string(),
        };
        if got != expect {
            failures.push(format!("{name}:\n  expected: {expect}\n  found:    {got}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn temporal_tracker_counts_previous_and_window_overlap() {
    let mut t = TemporalTracker::new(2, 2);
    // slot 0, one sequence: {0,1} {1,2} {3,4} then 8 more tokens of {0,5}
    t.observe(0, &[0, 1, 1, 2]);
    t.observe(0, &[3, 4]);
    for _ in 0..8 {
        t.observe(0, &[0, 5]);
    }
    let c = t.snapshot();
    // lag 1: {1,2} shares 1, {3,4} 0, {0,5} 0, then 7 x 2
    assert_eq!((c.lag1_tokens[0], c.lag1_shared[0]), (10, 1 + 14));
    // the 9th token onwards has 8 predecessors: tokens 9, 10 and 11 (all {0,5}, 5 seen before)
    assert_eq!((c.window_tokens[0], c.window_shared[0]), (3, 6));
    assert_eq!(c.lag1(0, 2), Some(15.0 / 20.0));
    assert_eq!(c.lag1(1, 2), None);
    // a new sequence has no predecessor
    t.reset();
    t.observe(0, &[0, 5]);
    assert_eq!(t.snapshot().lag1_tokens[0], 10);
    // malformed rows are ignored
    t.observe(0, &[1]);
    t.observe(7, &[1, 2]);
    assert_eq!(t.snapshot().lag1_tokens[0], 10);
}

#[test]
fn temporal_section_round_trips_and_is_checked() {
    let mut rec = recorder(0);
    rec.record(1, &[0, 1], &[0.5, 0.5]).unwrap();
    let mut atlas = rec.snapshot();
    let mut t = TemporalTracker::new(2, 2);
    t.observe(1, &[0, 1, 0, 2]);
    atlas.temporal = Some(t.snapshot());
    let back = Atlas::from_bytes(&atlas.to_bytes()).unwrap();
    assert_eq!(back, atlas);
    // an atlas without the section still reads
    atlas.temporal = None;
    let text = String::from_utf8(atlas.to_bytes()).unwrap();
    assert!(!text.contains("temporal"));
    assert_eq!(Atlas::from_bytes(text.as_bytes()).unwrap().temporal, None);
    // more shared experts than top_k x tokens is inconsistent
    let mut bad = t.snapshot();
    bad.lag1_shared[1] = 3;
    atlas.temporal = Some(bad);
    let err = Atlas::from_bytes(&atlas.to_bytes())
        .unwrap_err()
        .to_string();
    assert!(err.contains("temporal.lag1_shared[1]"), "{err}");
    let mut short = t.snapshot();
    short.window_tokens.pop();
    atlas.temporal = Some(short);
    assert!(Atlas::from_bytes(&atlas.to_bytes()).is_err());
}

#[test]
fn temporal_trace_keeps_decode_rows_in_order_up_to_its_cap_and_is_checked() {
    let mut t = TemporalTracker::new(2, 2);
    // a prefill step of two rows is not traced; decode steps of one row are, in every slot
    t.observe(0, &[0, 1, 2, 3]);
    t.observe(1, &[4, 5, 0, 1]);
    t.observe(0, &[1, 2]);
    t.observe(1, &[3, 4]);
    t.observe(0, &[5, 0]);
    t.observe(1, &[1, 2]);
    let s = t.snapshot();
    assert_eq!(s.trace, vec![vec![1, 2, 5, 0], vec![3, 4, 1, 2]]);
    assert_eq!(s.trace_tokens(2), 2);
    // the first TRACE_TOKENS tokens are kept
    for i in 0..TRACE_TOKENS {
        t.observe(0, &[i % 6, (i + 1) % 6]);
        t.observe(1, &[0, 1]);
    }
    let s = t.snapshot();
    assert_eq!(s.trace_tokens(2), TRACE_TOKENS);
    assert_eq!(s.trace[0].len(), s.trace[1].len());
    assert_eq!(&s.trace[0][..4], &[1, 2, 5, 0]);

    let mut rec = recorder(0);
    rec.record(1, &[0, 1], &[0.5, 0.5]).unwrap();
    let mut atlas = rec.snapshot();
    let mut small = TemporalTracker::new(2, 2);
    small.observe(0, &[1, 2]);
    small.observe(1, &[3, 4]);
    atlas.temporal = Some(small.snapshot());
    let back = Atlas::from_bytes(&atlas.to_bytes()).unwrap();
    assert_eq!(back, atlas);
    // layers that disagree on the tokens, a partial token, an expert past the shape's
    for (bad, field) in [
        (vec![vec![1u16, 2], vec![3, 4, 5, 0]], "temporal.trace[1]"),
        (vec![vec![1u16, 2, 3], vec![3, 4, 5]], "temporal.trace[0]"),
        (vec![vec![1u16, 2], vec![3, 6]], "temporal.trace[1]"),
        (vec![vec![1u16, 2]], "temporal.trace"),
    ] {
        let mut tmp = small.snapshot();
        tmp.trace = bad;
        atlas.temporal = Some(tmp);
        let err = Atlas::from_bytes(&atlas.to_bytes())
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
    // an atlas without a trace still reads
    let mut none = small.snapshot();
    none.trace = Vec::new();
    atlas.temporal = Some(none);
    let text = String::from_utf8(atlas.to_bytes()).unwrap();
    assert!(!text.contains("\"trace\""));
    assert!(Atlas::from_bytes(text.as_bytes()).is_ok());
}
