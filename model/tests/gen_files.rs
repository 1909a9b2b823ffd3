//! `gen::generate` end to end: a generated tiny model opens with our GGUF reader and has exactly
//! the metadata, tokenizer and tensor table (names, shapes, types) of llama.cpp's fixture files
//! (made by llama.cpp's quantizer from make_models.py's F32 models); files are deterministic; the
//! weights dequantize to the intended distributions; the default mixes quantize output.weight;
//! the committed dense qwen3/llama fixtures are exactly its output.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use nightshift_kernels::{dequantize_row, GgmlType};
use nightshift_model::gen::{generate, Arch, GenSpec, Preset, QuantMix};
use nightshift_model::gguf::{Gguf, Value};

mod fixture_util;
use fixture_util::fixture_path;

fn gen_tiny(dir: &Path, arch: Arch, quant: QuantMix, leave_output: bool, seed: u64) -> PathBuf {
    let mut spec = GenSpec::new(Preset::Tiny, arch, quant);
    spec.leave_output = leave_output;
    spec.seed = seed;
    let path = dir.join(format!(
        "{}-{}-{leave_output}-{seed}.gguf",
        arch.name(),
        quant.name()
    ));
    let mut last = 0;
    generate(&spec, &path, &mut |p| last = p.bytes_done).expect("generate");
    assert!(last > 0, "progress was reported");
    path
}

fn table(g: &Gguf) -> BTreeMap<String, (GgmlType, Vec<u64>)> {
    g.tensors()
        .map(|t| (t.name.clone(), (t.ty, t.dims.clone())))
        .collect()
}

fn metadata(g: &Gguf) -> BTreeMap<String, Value> {
    g.metadata()
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

#[test]
fn tiny_models_match_llama_cpp_fixture_layout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (Arch::Qwen3Moe, QuantMix::Q8_0),
        (Arch::Qwen3Moe, QuantMix::Q4KM),
        (Arch::Qwen3Moe, QuantMix::Q2K),
        (Arch::Qwen3Moe, QuantMix::F16),
        (Arch::Deepseek2, QuantMix::Q4KM),
        (Arch::Deepseek2, QuantMix::Q2K),
    ];
    for (arch, quant) in cases {
        let ours = Gguf::open(&gen_tiny(dir.path(), arch, quant, true, 7)).expect("open generated");
        let fixture = fixture_path(&format!("tiny-{}-{}.gguf", arch.name(), quant.name()));
        let theirs = Gguf::open(&fixture).expect("open fixture");
        assert_eq!(ours.arch().expect("arch"), arch.name());
        assert_eq!(
            table(&ours),
            table(&theirs),
            "{arch:?} {quant:?}: tensor table"
        );
        // every key and value, the tokenizer (tokens, merges, types, ids) and template included
        assert_eq!(
            metadata(&ours),
            metadata(&theirs),
            "{arch:?} {quant:?}: metadata"
        );
        for t in ours.tensors() {
            let row = t.ty.row_bytes(t.dims[0] as usize).expect("row bytes");
            assert_eq!(
                ours.tensor_data(t).len() as u64,
                row as u64 * t.n_elements() / t.dims[0]
            );
        }
    }
}

#[test]
fn default_mixes_quantize_the_output_like_llama_quantize() {
    let dir = tempfile::tempdir().expect("tempdir");
    let check = |arch, quant, expect: GgmlType| {
        let g = Gguf::open(&gen_tiny(dir.path(), arch, quant, false, 7)).expect("open");
        assert_eq!(
            g.tensor("output.weight").expect("output").ty,
            expect,
            "{arch:?} {quant:?}"
        );
    };
    check(Arch::Qwen3Moe, QuantMix::Q4KM, GgmlType::Q6_K);
    check(Arch::Deepseek2, QuantMix::Q2K, GgmlType::Q6_K);
    check(Arch::Qwen3Moe, QuantMix::Q8_0, GgmlType::Q8_0);
    check(Arch::Qwen3Moe, QuantMix::F16, GgmlType::F16);
}

#[test]
fn same_seed_same_bytes_other_seed_other_weights() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = std::fs::read(gen_tiny(
        dir.path(),
        Arch::Deepseek2,
        QuantMix::Q4KM,
        false,
        7,
    ))
    .expect("a");
    let b_path = dir.path().join("again.gguf");
    let mut spec = GenSpec::new(Preset::Tiny, Arch::Deepseek2, QuantMix::Q4KM);
    spec.seed = 7;
    generate(&spec, &b_path, &mut |_| {}).expect("generate again");
    let b = std::fs::read(&b_path).expect("b");
    assert!(a == b, "same spec must give identical files");
    let c = std::fs::read(gen_tiny(
        dir.path(),
        Arch::Deepseek2,
        QuantMix::Q4KM,
        false,
        8,
    ))
    .expect("c");
    assert_eq!(a.len(), c.len());
    assert!(a != c, "another seed must give other weights");
    assert!(!dir.path().join("again.gguf.partial").exists());
}

fn dequantized(g: &Gguf, name: &str) -> Vec<f32> {
    let t = g.tensor(name).unwrap_or_else(|| panic!("no {name}"));
    let k = t.dims[0] as usize;
    let data = g.tensor_data(t);
    let rb = t.ty.row_bytes(k).expect("row bytes");
    let mut out = vec![0f32; t.n_elements() as usize];
    for (src, dst) in data.chunks_exact(rb).zip(out.chunks_exact_mut(k)) {
        dequantize_row(t.ty, src, dst).expect("dequantize");
    }
    out
}

fn mean_std(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    let var = v.iter().map(|&x| (f64::from(x) - m).powi(2)).sum::<f64>() / n;
    (m, var.sqrt())
}

#[test]
fn weights_follow_make_models_initialisation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let g = Gguf::open(&gen_tiny(
        dir.path(),
        Arch::Qwen3Moe,
        QuantMix::Q8_0,
        true,
        7,
    ))
    .expect("open");
    // (tensor, expected mean, expected std, tolerance on each)
    let check = |name: &str, mean: f64, std: f64, tol: f64| {
        let (m, s) = mean_std(&dequantized(&g, name));
        assert!(
            (m - mean).abs() < tol && (s - std).abs() < tol * std.max(1.0),
            "{name}: mean {m} std {s}"
        );
    };
    check("token_embd.weight", 0.0, 200.0, 2.0);
    check("blk.0.attn_q.weight", 0.0, 1.0 / 16.0, 0.003); // 1/sqrt(256)
    check("blk.1.ffn_down_exps.weight", 0.0, 1.0 / 16.0, 0.003);
    check("blk.0.ffn_gate_inp.weight", 0.0, 4.0 / 16.0, 0.01);
    check("blk.0.attn_norm.weight", 1.0, 0.1, 0.02);
    check("output.weight", 0.0, 4.0 / 16.0, 0.01);
}

#[test]
fn ensure_cached_generates_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = GenSpec::demo();
    let mut calls = 0;
    let a = nightshift_model::gen::ensure_cached(&spec, dir.path(), &mut |_| calls += 1)
        .expect("first");
    assert!(calls > 0, "first call generates");
    assert_eq!(
        a.file_name().and_then(|n| n.to_str()),
        Some("tiny-qwen3moe-s7-Q4_K_M.gguf")
    );
    let mut again = 0;
    let b = nightshift_model::gen::ensure_cached(&spec, dir.path(), &mut |_| again += 1)
        .expect("second");
    assert_eq!((a, again), (b, 0), "second call reuses the file");
    let mut other = spec.clone();
    other.layers = Some(1);
    assert_eq!(other.file_name(), "tiny-qwen3moe-L1-s7-Q4_K_M.gguf");
}

#[test]
fn writer_round_trips_every_value_type_and_alignment() {
    use nightshift_model::gen::{GgufWriter, KvValue, TensorDecl};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kv.gguf");
    let kv: Vec<(String, KvValue)> = vec![
        (
            "general.architecture".into(),
            KvValue::Str("qwen3moe".into()),
        ),
        ("t.u8".into(), KvValue::U8(200)),
        ("t.i8".into(), KvValue::I8(-100)),
        ("t.u16".into(), KvValue::U16(60_000)),
        ("t.i16".into(), KvValue::I16(-30_000)),
        ("t.u32".into(), KvValue::U32(4_000_000_000)),
        ("t.i32".into(), KvValue::I32(-2_000_000_000)),
        ("t.u64".into(), KvValue::U64(1 << 40)),
        ("t.i64".into(), KvValue::I64(-(1 << 40))),
        ("t.f32".into(), KvValue::F32(1.5)),
        ("t.f64".into(), KvValue::F64(-2.25)),
        ("t.bool".into(), KvValue::Bool(true)),
        ("t.str".into(), KvValue::Str("héllo".into())),
        (
            "t.arr".into(),
            KvValue::Array(vec![KvValue::I32(1), KvValue::I32(-2)]),
        ),
        (
            "t.nested".into(),
            KvValue::Array(vec![KvValue::strs(&["a", "b"]), KvValue::strs(&["c"])]),
        ),
        ("t.empty".into(), KvValue::Array(vec![])),
    ];
    // odd sizes: 3 f32 (12 bytes) then 1 Q8_0 row (34 bytes) then 5 f32: every offset padded to 32
    let tensors = vec![
        TensorDecl {
            name: "a".into(),
            ty: GgmlType::F32,
            dims: vec![3],
        },
        TensorDecl {
            name: "b".into(),
            ty: GgmlType::Q8_0,
            dims: vec![32, 1],
        },
        TensorDecl {
            name: "c".into(),
            ty: GgmlType::F32,
            dims: vec![5],
        },
    ];
    let file = std::fs::File::create(&path).expect("create");
    let mut w = GgufWriter::new(file, &kv, &tensors).expect("header");
    w.write_data(&[1u8; 12]).expect("a");
    w.write_data(&[2u8; 20]).expect("b, first part");
    w.write_data(&[2u8; 14]).expect("b, rest");
    assert_eq!(w.expecting(), Some("c"));
    w.write_data(&[3u8; 20]).expect("c");
    assert!(
        w.write_data(&[0u8]).is_err(),
        "data past the last tensor is refused"
    );
    w.finish().expect("finish");
    let g = Gguf::open(&path).expect("open");
    let got = metadata(&g);
    let expect = |k: &str, v: Value| assert_eq!(got.get(k), Some(&v), "{k}");
    expect("t.u8", Value::U8(200));
    expect("t.i8", Value::I8(-100));
    expect("t.u16", Value::U16(60_000));
    expect("t.i16", Value::I16(-30_000));
    expect("t.u32", Value::U32(4_000_000_000));
    expect("t.i32", Value::I32(-2_000_000_000));
    expect("t.u64", Value::U64(1 << 40));
    expect("t.i64", Value::I64(-(1 << 40)));
    expect("t.f32", Value::F32(1.5));
    expect("t.f64", Value::F64(-2.25));
    expect("t.bool", Value::Bool(true));
    expect("t.str", Value::Str("héllo".into()));
    expect("t.arr", Value::Array(vec![Value::I32(1), Value::I32(-2)]));
    let s = |x: &str| Value::Str(x.into());
    expect(
        "t.nested",
        Value::Array(vec![
            Value::Array(vec![s("a"), s("b")]),
            Value::Array(vec![s("c")]),
        ]),
    );
    expect("t.empty", Value::Array(vec![]));
    for (name, fill, len) in [("a", 1u8, 12usize), ("b", 2, 34), ("c", 3, 20)] {
        let t = g.tensor(name).expect("tensor");
        assert_eq!(t.offset() % 32, 0, "{name} aligned");
        assert_eq!(g.tensor_data(t), vec![fill; len].as_slice(), "{name} data");
    }
}

#[test]
fn unfinished_stream_is_an_error() {
    use nightshift_model::gen::{GgufWriter, TensorDecl};
    let tensors = vec![TensorDecl {
        name: "a".into(),
        ty: GgmlType::F32,
        dims: vec![4],
    }];
    let mut w = GgufWriter::new(Vec::new(), &[], &tensors).expect("header");
    w.write_data(&[0u8; 8]).expect("half");
    let e = w.finish().expect_err("missing data").to_string();
    assert!(e.contains("expected data for every tensor"), "{e}");
}

#[test]
fn generated_models_run_in_the_engine() {
    use nightshift_model::{build_pool, BatchToken, Engine, EngineOptions, LocalExperts, Model};
    use std::sync::Arc;
    let dir = tempfile::tempdir().expect("tempdir");
    for (arch, quant) in [
        (Arch::Qwen3Moe, QuantMix::Q4KM),
        (Arch::Deepseek2, QuantMix::Q4KM),
        (Arch::Deepseek2, QuantMix::UdIq1S),
        (Arch::Qwen3Moe, QuantMix::UdIq2Xxs),
    ] {
        let path = gen_tiny(dir.path(), arch, quant, false, 7);
        if let Some((experts, down)) = nightshift_model::gen::iq_mix::expert_types(quant) {
            let g = Gguf::open(&path).expect("open");
            let t = table(&g);
            let last = t
                .keys()
                .filter(|n| n.ends_with("ffn_up_exps.weight"))
                .max()
                .expect("experts");
            let layer = last.trim_end_matches("ffn_up_exps.weight");
            // (type, ggml dims) of one of this layer's tensors
            let get = |n: &str| t.get(&format!("{layer}{n}")).cloned().expect("tensor");
            // rows that are not whole 256-element blocks fall back to IQ4_NL
            let want = |n: &str, ty: GgmlType| {
                let (got, dims) = get(n);
                let expect = if dims[0] % 256 == 0 {
                    ty
                } else {
                    GgmlType::IQ4_NL
                };
                assert_eq!(got, expect, "{arch:?} {quant:?} {layer}{n}");
            };
            want("ffn_up_exps.weight", experts);
            want("ffn_gate_exps.weight", experts);
            want("ffn_down_exps.weight", down);
            assert_eq!(get("ffn_gate_inp.weight").0, GgmlType::F32);
        }
        let model = Model::load(&path).expect("load");
        let n_vocab = model.tokenizer().vocab_size();
        let pool = build_pool(1).expect("pool");
        let backend = Arc::new(LocalExperts::new(model.clone(), Some(pool.clone())));
        let opts = EngineOptions {
            threads: 1,
            pool: Some(pool),
            max_seqs: 1,
            kv_budget_tokens: 64,
            max_seq_len: 64,
            ..Default::default()
        };
        let mut eng = Engine::new(model, backend, opts).expect("engine");
        let seq = eng.add_sequence().expect("sequence");
        let prompt = [100u32, 200, 300];
        let batch: Vec<BatchToken> = prompt
            .iter()
            .enumerate()
            .map(|(i, &token)| BatchToken {
                seq,
                token,
                pos: i as u32,
                want_logits: i == 2,
            })
            .collect();
        let mut logits = eng.forward(&batch).expect("prefill");
        for pos in 3..6u32 {
            let row = logits.pop().expect("logits");
            assert_eq!(row.len(), n_vocab, "{arch:?} {quant:?}");
            assert!(
                row.iter().all(|x| x.is_finite()),
                "{arch:?} {quant:?}: finite logits"
            );
            let next = row
                .iter()
                .enumerate()
                .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
                .0;
            logits = eng
                .forward(&[BatchToken {
                    seq,
                    token: next as u32,
                    pos,
                    want_logits: true,
                }])
                .expect("decode");
        }
    }
}

#[test]
fn padded_vocab_keeps_greedy_tokens_on_real_ones() {
    use nightshift_model::{BatchToken, Engine, EngineOptions, LocalExperts, Model};
    use std::sync::Arc;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = GenSpec::new(Preset::Tiny, Arch::Qwen3Moe, QuantMix::Q4KM);
    spec.vocab = Some(8192);
    let path = dir.path().join("padded.gguf");
    generate(&spec, &path, &mut |_| {}).expect("generate");
    let g = Gguf::open(&path).expect("open");
    let types = g
        .metadata()
        .get_i32_array("tokenizer.ggml.token_type")
        .expect("types")
        .expect("token types");
    // the fillers come last, marked UNUSED (5)
    let live = types.iter().position(|&t| t == 5).expect("fillers");
    assert!(
        live < 1000 && types[live..].iter().all(|&t| t == 5),
        "live {live}"
    );
    let head = dequantized(&g, "output.weight");
    let k = g.tensor("output.weight").expect("head").dims[0] as usize;
    assert!(
        head[live * k..].iter().all(|&v| v == 0.0),
        "filler rows are zero"
    );
    let (_, std) = mean_std(&head[..live * k]);
    assert!(
        (std - 4.0 / 16.0).abs() < 0.02,
        "real rows keep the gain: std {std}"
    );

    let model = Model::load(&path).expect("load");
    let backend = Arc::new(LocalExperts::new(model.clone(), None));
    let mut eng = Engine::new(model.clone(), backend, EngineOptions::default()).expect("engine");
    let seq = eng.add_sequence().expect("sequence");
    let mut token = 100u32;
    for pos in 0..8u32 {
        let row = eng
            .forward(&[BatchToken {
                seq,
                token,
                pos,
                want_logits: true,
            }])
            .expect("step")
            .pop()
            .expect("logits");
        token = row
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
            .0 as u32;
        assert!(
            (token as usize) < live,
            "step {pos}: greedy picked filler {token}"
        );
        assert!(!model.tokenizer().token_bytes(token).is_empty());
    }
}

/// The committed dense fixtures are `gen-model --preset tiny --arch qwen3|llama
/// --leave-output-tensor` output, byte for byte: regenerating them gives the same files, so
/// their llama.cpp expectations describe what the generator writes today.
#[test]
fn dense_fixtures_are_what_gen_model_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    for arch in [Arch::Qwen3, Arch::Llama] {
        for quant in [QuantMix::Q8_0, QuantMix::Q4KM] {
            let ours = std::fs::read(gen_tiny(dir.path(), arch, quant, true, 7)).expect("ours");
            let name = format!("tiny-{}-{}.gguf", arch.name(), quant.name());
            let theirs = std::fs::read(fixture_path(&name)).expect("fixture");
            assert!(ours == theirs, "{name} differs from what gen-model writes");
        }
    }
}
