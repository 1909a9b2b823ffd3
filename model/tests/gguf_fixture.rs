//! The GGUF reader on llama.cpp-made fixtures: metadata of both architectures, tensor shapes and
//! sizes, zero-copy data, and a model re-written as a split set reading back identically.

mod gguf_util;

use std::path::{Path, PathBuf};

use gguf_util::Builder;
use nightshift_model::gguf::{Gguf, GgufError, SplitError, Value};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

#[test]
fn qwen3moe_metadata_and_tensors() {
    let g = Gguf::open(&data("tiny-qwen3moe-Q2_K.gguf")).expect("open");
    assert_eq!(g.arch().unwrap(), "qwen3moe");
    assert_eq!(g.version(), 3);
    let md = g.metadata();
    assert_eq!(md.get_u32("qwen3moe.embedding_length").unwrap(), Some(256));
    assert_eq!(md.get_u32("qwen3moe.block_count").unwrap(), Some(2));
    assert_eq!(md.get_u32("qwen3moe.expert_count").unwrap(), Some(16));
    assert_eq!(md.get_f32("qwen3moe.rope.freq_base").unwrap(), Some(1e6));
    assert_eq!(md.get_str("tokenizer.ggml.model").unwrap(), Some("gpt2"));
    assert_eq!(md.get_str("tokenizer.ggml.pre").unwrap(), Some("qwen2"));
    assert_eq!(
        md.get_bool("tokenizer.ggml.add_bos_token").unwrap(),
        Some(false)
    );
    let tokens = md.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 587);
    assert_eq!(tokens[586], "<|im_end|>");
    let types = md
        .get_i32_array("tokenizer.ggml.token_type")
        .unwrap()
        .unwrap();
    assert_eq!(types.len(), 587);
    assert_eq!(types[586], 3);
    // Wrong-type access is an error naming the key, not a panic.
    let e = md.get_str("qwen3moe.block_count").unwrap_err();
    assert!(matches!(e, GgufError::WrongType { .. }), "{e}");
    assert!(e.to_string().contains("qwen3moe.block_count"), "{e}");
    assert_eq!(md.get_u32("no.such.key").unwrap(), None);

    let emb = g.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.dims, vec![256, 587]);
    let exps = g.tensor("blk.1.ffn_down_exps.weight").unwrap();
    assert_eq!(exps.dims, vec![256, 256, 16]);
    for t in g.tensors() {
        let layout = nightshift_model::gguf::type_layout(t.ty.id()).unwrap();
        let want = t.n_elements() / layout.block_len * layout.block_bytes;
        assert_eq!(t.size(), want, "{}", t.name);
        assert_eq!(g.tensor_data(t).len() as u64, want, "{}", t.name);
        assert_eq!(t.offset() % g.alignment(), 0, "{}", t.name);
    }
    assert_eq!(g.n_tensors(), 1 + 2 * 12 + 2);
    // The output tensor was left F32: its first value read straight from the map.
    let out = g.tensor("output.weight").unwrap();
    assert_eq!(out.ty.name(), "F32");
    let bytes = g.tensor_data(out);
    let first = f32::from_le_bytes(bytes[..4].try_into().unwrap());
    assert!(first.is_finite() && first != 0.0);
}

#[test]
fn deepseek2_metadata() {
    let g = Gguf::open(&data("tiny-deepseek2-Q4_K_M.gguf")).expect("open");
    assert_eq!(g.arch().unwrap(), "deepseek2");
    let md = g.metadata();
    assert_eq!(md.get_str("tokenizer.ggml.pre").unwrap(), Some("kimi-k2"));
    assert_eq!(
        md.get_bool("tokenizer.ggml.add_bos_token").unwrap(),
        Some(true)
    );
    assert_eq!(
        md.get_u32("deepseek2.leading_dense_block_count").unwrap(),
        Some(1)
    );
    assert_eq!(
        md.get_f32("deepseek2.expert_weights_scale").unwrap(),
        Some(2.827)
    );
    assert!(g.tensor("blk.1.exp_probs_b.bias").is_some());
    assert!(g.tensor("blk.0.ffn_gate_inp.weight").is_none());
}

#[test]
fn fingerprint_tracks_the_header() {
    let a = Gguf::open(&data("tiny-qwen3moe-Q2_K.gguf")).unwrap();
    let b = Gguf::open(&data("tiny-qwen3moe-Q2_K.gguf")).unwrap();
    let c = Gguf::open(&data("tiny-qwen3moe-Q4_K_M.gguf")).unwrap();
    assert_eq!(a.fingerprint(), b.fingerprint());
    assert_ne!(a.fingerprint(), c.fingerprint());
}

/// Re-writes `g` as `n` split files named like gguf-split does; returns their paths.
fn write_split(g: &Gguf, dir: &Path, prefix: &str, n: usize) -> Vec<PathBuf> {
    let tensors: Vec<_> = g.tensors().collect();
    let per = tensors.len().div_ceil(n);
    let mut paths = Vec::new();
    for (i, chunk) in tensors.chunks(per).enumerate() {
        let mut b = Builder::new();
        if i == 0 {
            for (k, v) in g.metadata().iter() {
                b = b.kv(k, v.clone());
            }
        }
        b = b
            .kv("split.no", Value::U16(i as u16))
            .kv("split.count", Value::U16(n as u16))
            .kv("split.tensors.count", Value::I32(tensors.len() as i32));
        for t in chunk {
            b = b.tensor(&t.name, &t.dims, t.ty.id(), g.tensor_data(t).to_vec());
        }
        let p = dir.join(format!("{prefix}-{:05}-of-{n:05}.gguf", i + 1));
        std::fs::write(&p, b.build().0).unwrap();
        paths.push(p);
    }
    assert_eq!(paths.len(), n);
    paths
}

#[test]
fn split_files_read_as_one_model() {
    let whole = Gguf::open(&data("tiny-deepseek2-Q2_K.gguf")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let paths = write_split(&whole, dir.path(), "kimi", 3);
    for p in &paths {
        // Any split opens the whole set.
        let g = Gguf::open(p).unwrap();
        assert_eq!(g.paths().count(), 3);
        assert_eq!(g.arch().unwrap(), "deepseek2");
        assert_eq!(g.n_tensors(), whole.n_tensors());
        for t in whole.tensors() {
            let s = g.tensor(&t.name).unwrap();
            assert_eq!((&s.dims, s.ty), (&t.dims, t.ty), "{}", t.name);
            assert_eq!(g.tensor_data(s), whole.tensor_data(t), "{}", t.name);
        }
        assert_eq!(
            g.metadata().get_str_array("tokenizer.ggml.tokens").unwrap(),
            whole
                .metadata()
                .get_str_array("tokenizer.ggml.tokens")
                .unwrap()
        );
    }
    assert_eq!(paths.iter().map(|p| p.exists()).filter(|&e| e).count(), 3);
    // A missing split is an i/o error naming the missing file.
    std::fs::remove_file(&paths[1]).unwrap();
    let e = Gguf::open(&paths[0]).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }), "{e}");
    assert!(e.to_string().contains("kimi-00002-of-00003.gguf"), "{e}");
}

#[test]
fn split_inconsistencies_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let base = |no: u16, count: u16, total: i32, name: &str| {
        Builder::new()
            .kv("split.no", Value::U16(no))
            .kv("split.count", Value::U16(count))
            .kv("split.tensors.count", Value::I32(total))
            .f32_tensor(name, &[8])
            .build()
            .0
    };
    let check = |files: &[(&str, Vec<u8>)], open: &str, expect: &str| {
        let sub = dir.path().join(format!("case-{expect}"));
        std::fs::create_dir_all(&sub).unwrap();
        for (n, b) in files {
            std::fs::write(sub.join(n), b).unwrap();
        }
        let e = Gguf::open(&sub.join(open)).unwrap_err();
        match &e {
            GgufError::Split { kind, .. } => assert_eq!(kind.code(), expect, "{e}"),
            other => panic!("expected {expect}, got {other}"),
        }
    };
    check(&[("m.gguf", base(0, 2, 2, "a"))], "m.gguf", "unnamed_split");
    check(
        &[
            ("m-00001-of-00002.gguf", base(0, 2, 2, "a")),
            ("m-00002-of-00002.gguf", base(0, 2, 2, "b")),
        ],
        "m-00001-of-00002.gguf",
        "split_number_mismatch",
    );
    check(
        &[
            ("m-00001-of-00002.gguf", base(0, 2, 2, "a")),
            ("m-00002-of-00002.gguf", base(1, 3, 2, "b")),
        ],
        "m-00001-of-00002.gguf",
        "split_count_mismatch",
    );
    check(
        &[
            ("m-00001-of-00002.gguf", base(0, 2, 3, "a")),
            ("m-00002-of-00002.gguf", base(1, 2, 3, "b")),
        ],
        "m-00002-of-00002.gguf",
        "split_tensor_count_mismatch",
    );
    check(
        &[
            ("m-00001-of-00002.gguf", base(0, 2, 2, "a")),
            ("m-00002-of-00002.gguf", base(1, 2, 2, "a")),
        ],
        "m-00001-of-00002.gguf",
        "split_duplicate_tensor",
    );
    check(
        &[("m-00001-of-00003.gguf", base(0, 2, 2, "a"))],
        "m-00001-of-00003.gguf",
        "split_count_mismatch",
    );
    let _ = SplitError::BadCount(0);
}

/// `release_mapped` drops only whole pages inside the slice, ignores slices that are not part
/// of the map, and the bytes read the same afterwards (they refault from the file).
#[test]
fn release_mapped_keeps_the_bytes() {
    let g = Gguf::open(&data("tiny-qwen3moe-Q2_K.gguf")).expect("open");
    let t = g
        .tensors()
        .max_by_key(|t| t.size())
        .expect("a tensor")
        .clone();
    let bytes = g.tensor_data(&t);
    assert!(
        bytes.len() > 2 * 4096,
        "fixture tensor spans pages: {}",
        bytes.len()
    );
    let before = bytes.to_vec();
    let released = g.release_mapped(bytes);
    assert!(
        released > 0 && released <= bytes.len(),
        "released {released} of {}",
        bytes.len()
    );
    assert_eq!(released % 4096, 0, "whole pages only");
    assert!(bytes == &before[..], "bytes change after release");
    assert_eq!(
        g.release_mapped(&before),
        0,
        "a copy is not part of the map"
    );
    assert_eq!(
        g.release_mapped(&bytes[..10]),
        0,
        "no whole page inside 10 bytes"
    );
}
