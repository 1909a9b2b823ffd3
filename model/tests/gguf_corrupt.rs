//! Corrupt GGUF files: a table of mutations of small files built here and of a real fixture,
//! each with the error kind it must produce. Never a panic, never an out-of-bounds read.

mod gguf_util;

use std::path::Path;

use gguf_util::{set_u32, set_u64, Builder, Layout};
use nightshift_model::gguf::{check_image, Gguf, GgufError, Value};

/// A small valid file: a few kvs of different types and two F32 tensors.
fn base() -> Builder {
    Builder::new()
        .kv("general.architecture", Value::Str("test".into()))
        .kv("test.count", Value::U32(7))
        .kv(
            "test.names",
            Value::Array(vec![Value::Str("a".into()), Value::Str("bc".into())]),
        )
        .f32_tensor("a", &[4, 2])
        .f32_tensor("b", &[8])
}

fn built(b: Builder) -> (Vec<u8>, Layout) {
    b.build()
}

/// Parses `bytes`; `expect` is the FormatError code, or "ok".
fn check(name: &str, bytes: &[u8], expect: &str) {
    let got = match check_image(bytes) {
        Ok(_) => "ok".to_string(),
        Err(GgufError::Format { kind, .. }) => kind.code().to_string(),
        Err(e) => format!("other error: {e}"),
    };
    assert_eq!(got, expect, "case {name}");
}

#[test]
fn base_file_is_valid() {
    let (bytes, _) = built(base());
    let (md, tensors) = check_image(&bytes).unwrap();
    assert_eq!(md.get_u32("test.count").unwrap(), Some(7));
    assert_eq!(
        md.get_str_array("test.names").unwrap(),
        Some(vec!["a", "bc"])
    );
    assert_eq!(tensors.len(), 2);
    assert_eq!(tensors[1].dims, vec![8]);
    assert_eq!(tensors[1].size(), 32);
}

#[test]
fn every_value_type_and_nested_arrays() {
    let nested = Value::Array(vec![
        Value::Array(vec![Value::I16(-3), Value::I16(4)]),
        Value::Array(vec![Value::Array(vec![Value::Str("deep".into())])]),
    ]);
    let all = [
        ("u8", Value::U8(200)),
        ("i8", Value::I8(-5)),
        ("u16", Value::U16(60000)),
        ("i16", Value::I16(-300)),
        ("u32", Value::U32(4_000_000_000)),
        ("i32", Value::I32(-7)),
        ("u64", Value::U64(1 << 40)),
        ("i64", Value::I64(-(1 << 40))),
        ("f32", Value::F32(0.25)),
        ("f64", Value::F64(1e300)),
        ("bool", Value::Bool(true)),
        ("str", Value::Str("héllo".into())),
        ("empty", Value::Array(vec![])),
        ("ints", Value::Array(vec![Value::U8(1), Value::U8(2)])),
        (
            "floats",
            Value::Array(vec![Value::F64(0.5), Value::F64(1.5)]),
        ),
        ("nested", nested.clone()),
    ];
    let mut b = Builder::new();
    b.version = 2;
    for (k, v) in &all {
        b = b.kv(k, v.clone());
    }
    let (bytes, _) = b.build();
    let (md, tensors) = check_image(&bytes).unwrap();
    assert!(tensors.is_empty());
    for (k, v) in &all {
        assert_eq!(md.get(k), Some(v), "{k}");
    }
    let keys: Vec<_> = md.iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        all.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        "file order kept"
    );
    // Integer getters accept any integer type whose value fits, refuse the others.
    assert_eq!(md.get_u32("u8").unwrap(), Some(200));
    assert_eq!(md.get_u32("u16").unwrap(), Some(60000));
    assert!(md.get_u32("i8").is_err());
    assert!(md.get_u32("u64").is_err());
    assert_eq!(md.get_u64("u64").unwrap(), Some(1 << 40));
    assert_eq!(md.get_i64("i64").unwrap(), Some(-(1 << 40)));
    assert_eq!(md.get_f32("f64").unwrap(), Some(f32::INFINITY));
    assert_eq!(md.get_f32("f32").unwrap(), Some(0.25));
    assert!(md.get_f32("u8").is_err());
    assert_eq!(md.get_bool("bool").unwrap(), Some(true));
    assert_eq!(md.get_str("str").unwrap(), Some("héllo"));
    assert_eq!(md.get_i32_array("ints").unwrap(), Some(vec![1, 2]));
    assert_eq!(md.get_i32_array("empty").unwrap(), Some(vec![]));
    assert_eq!(md.get_f32_array("floats").unwrap(), Some(vec![0.5, 1.5]));
    assert!(md.get_str_array("ints").is_err());
    assert!(md.get_i32_array("nested").is_err());
}

#[test]
fn corruption_table() {
    let (good, lay) = built(base());
    let kv_type_at = |i: usize, keylen: usize| lay.kv_at[i] + 8 + keylen;
    let mutate = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        b
    };

    check("valid", &good, "ok");
    check("empty", &[], "bad_magic");
    check("three bytes", b"GGU", "bad_magic");
    check("magic", &mutate(&|b| b[3] = b'X'), "bad_magic");
    check(
        "version 1",
        &mutate(&|b| set_u32(b, 4, 1)),
        "unsupported_version",
    );
    check(
        "version 4",
        &mutate(&|b| set_u32(b, 4, 4)),
        "unsupported_version",
    );
    check(
        "big-endian version",
        &mutate(&|b| set_u32(b, 4, 3u32.swap_bytes())),
        "unsupported_version",
    );
    check("cut in counts", &good[..12], "truncated");
    check(
        "huge tensor count",
        &mutate(&|b| set_u64(b, 8, u64::MAX)),
        "count_too_large",
    );
    check(
        "huge kv count",
        &mutate(&|b| set_u64(b, 16, 1 << 40)),
        "count_too_large",
    );
    check(
        "kv count one too many",
        &mutate(&|b| set_u64(b, 16, 4)),
        "truncated",
    );
    check(
        "huge key length",
        &mutate(&|b| set_u64(b, lay.kv_at[0], u64::MAX)),
        "truncated",
    );
    check(
        "key not utf-8",
        &mutate(&|b| b[lay.kv_at[1] + 8] = 0xff),
        "invalid_utf8",
    );
    check(
        "value type 13",
        &mutate(&|b| set_u32(b, kv_type_at(1, 10), 13)),
        "bad_value_type",
    );
    check(
        "value type u32 -> u64 misframes",
        &mutate(&|b| set_u32(b, kv_type_at(1, 10), 10)),
        "truncated",
    );
    // test.names: type(4) elem type(4) count(8) at kv_at[2] + 8 + 10.
    let arr = lay.kv_at[2] + 8 + 10 + 4;
    check(
        "array elem type",
        &mutate(&|b| set_u32(b, arr, 77)),
        "bad_value_type",
    );
    check(
        "array count huge",
        &mutate(&|b| set_u64(b, arr + 4, u64::MAX / 2)),
        "count_too_large",
    );
    check(
        "array string length",
        &mutate(&|b| set_u64(b, arr + 12, 1 << 60)),
        "truncated",
    );
    check("cut in kvs", &good[..lay.kv_at[2] + 3], "truncated");
    check(
        "cut in tensor infos",
        &good[..lay.tensor_at[1] + 5],
        "truncated",
    );
    check(
        "n_dims 5",
        &mutate(&|b| set_u32(b, lay.n_dims_at[0], 5)),
        "too_many_dims",
    );
    check(
        "dim huge",
        &mutate(&|b| set_u64(b, lay.n_dims_at[0] + 4, u64::MAX)),
        "dim_too_large",
    );
    check(
        "shape overflow",
        &mutate(&|b| {
            set_u64(b, lay.n_dims_at[0] + 4, 1 << 40);
            set_u64(b, lay.n_dims_at[0] + 12, 1 << 40);
        }),
        "shape_overflow",
    );
    check(
        "removed type 4",
        &mutate(&|b| set_u32(b, lay.type_at[0], 4)),
        "unknown_tensor_type",
    );
    check(
        "type 43 (GGML_TYPE_COUNT)",
        &mutate(&|b| set_u32(b, lay.type_at[0], 43)),
        "unknown_tensor_type",
    );
    check(
        "type 1000",
        &mutate(&|b| set_u32(b, lay.type_at[0], 1000)),
        "unknown_tensor_type",
    );
    // Types ggml defines and the kernels do not compute (the integer types and F64; the
    // i-quants, MXFP4, NVFP4, Q1_0 and Q2_0 are supported) are named in the error.
    for (id, name) in [(24, "I8"), (26, "I32"), (28, "F64")] {
        match check_image(&mutate(&|b| set_u32(b, lay.type_at[0], id))) {
            Err(e @ GgufError::Format { .. }) => {
                let (code, text) = (e.format_kind().map(|k| k.code()), e.to_string());
                assert_eq!(code, Some("unsupported_tensor_type"), "type {id}: {text}");
                assert!(
                    text.contains(&format!("type {name} is not supported")),
                    "type {id}: {text}"
                );
            }
            other => panic!("type {id}: {other:?}"),
        }
    }
    check(
        "q8_0 row of 4",
        &mutate(&|b| set_u32(b, lay.type_at[0], 8)),
        "row_not_block_multiple",
    );
    check(
        "f16 instead of f32",
        &mutate(&|b| set_u32(b, lay.type_at[0], 1)),
        "ok",
    );
    check(
        "misaligned",
        &mutate(&|b| set_u64(b, lay.offset_at[1], 36)),
        "misaligned_tensor",
    );
    check(
        "offset past end",
        &mutate(&|b| set_u64(b, lay.offset_at[1], 1 << 20)),
        "tensor_out_of_bounds",
    );
    check(
        "offset overflows",
        &mutate(&|b| set_u64(b, lay.offset_at[1], u64::MAX - 31)),
        "tensor_out_of_bounds",
    );
    check(
        "overlap",
        &mutate(&|b| set_u64(b, lay.offset_at[1], 0)),
        "tensor_overlap",
    );
    check(
        "overlap partial",
        &mutate(&|b| set_u64(b, lay.offset_at[0], 32)),
        "tensor_overlap",
    );
    check(
        "cut in data",
        &good[..good.len() - 1],
        "tensor_out_of_bounds",
    );
    check(
        "duplicate tensor",
        &mutate(&|b| b[lay.tensor_at[1] + 8] = b'a'),
        "duplicate_tensor",
    );
    check(
        "duplicate key",
        &mutate(&|b| b[lay.kv_at[1] + 8..lay.kv_at[1] + 18].copy_from_slice(b"test.names")),
        "duplicate_key",
    );
}

#[test]
fn built_corruptions() {
    let case = |name: &str, b: Builder, expect: &str| check(name, &b.build().0, expect);
    let mut deep = Value::Str("x".into());
    for _ in 0..9 {
        deep = Value::Array(vec![deep]);
    }
    case("nested 9 deep", base().kv("deep", deep), "nesting_too_deep");
    let mut ok_deep = Value::U8(1);
    for _ in 0..8 {
        ok_deep = Value::Array(vec![ok_deep]);
    }
    case("nested 8 deep", base().kv("deep", ok_deep), "ok");
    case(
        "alignment 0",
        base().kv("general.alignment", Value::U32(0)),
        "bad_alignment",
    );
    case(
        "alignment 48",
        base().kv("general.alignment", Value::U32(48)),
        "bad_alignment",
    );
    case(
        "alignment string",
        base().kv("general.alignment", Value::Str("32".into())),
        "alignment_type",
    );
    case(
        "alignment negative",
        base().kv("general.alignment", Value::I32(-32)),
        "bad_alignment",
    );
    let mut b64 = base().kv("general.alignment", Value::U32(64));
    b64.alignment = 64;
    case("alignment 64", b64, "ok");
    let mut wrong = base().kv("general.alignment", Value::U32(64));
    wrong.alignment = 32;
    case("alignment 64 but data at 32", wrong, "misaligned_tensor");
    case(
        "zero-sized tensor",
        base().tensor("z", &[0, 3], 0, vec![]),
        "ok",
    );
    case("0-d tensor", base().tensor("s", &[], 0, vec![0; 4]), "ok");
    case(
        "q8_0 tensor",
        base().tensor("q", &[64], 8, vec![0; 68]),
        "ok",
    );
    case(
        "q2_k row of 128",
        base().tensor("q", &[128], 10, vec![0; 42]),
        "row_not_block_multiple",
    );
}

#[test]
fn fixture_corruptions() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-qwen3moe-Q2_K.gguf");
    let good = std::fs::read(&path).unwrap();
    check("fixture", &good, "ok");
    check(
        "fixture half",
        &good[..good.len() / 2],
        "tensor_out_of_bounds",
    );
    check("fixture cut in header", &good[..5_000], "truncated");
    let mut b = good.clone();
    set_u64(&mut b, 8, 1 << 50);
    check("fixture tensor count", &b, "count_too_large");

    // Through Gguf::open: the error names the file.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("broken.gguf");
    std::fs::write(&p, &good[..good.len() / 2]).unwrap();
    let e = Gguf::open(&p).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("broken.gguf") && msg.contains("outside the file"),
        "{msg}"
    );
    assert_eq!(
        e.format_kind().map(|k| k.code()),
        Some("tensor_out_of_bounds")
    );
    std::fs::write(&p, b"").unwrap();
    let e = Gguf::open(&p).unwrap_err();
    assert!(e.to_string().contains("broken.gguf"), "{e}");
    let e = Gguf::open(&dir.path().join("missing.gguf")).unwrap_err();
    assert!(
        matches!(e, GgufError::Io { .. }) && e.to_string().contains("missing.gguf"),
        "{e}"
    );
}
