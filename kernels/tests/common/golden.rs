//! Loader and checks for golden-vector directories in the `manifest.json` format written by
//! `tools/kernel_vectors.py` (ggml's own quantized bytes, dequantized rows and reference dot
//! products). Shared by the golden integration test and `examples/golden.rs`; every check
//! compares bits, never approximately.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use nightshift_kernels::dispatch::{self, Tier};
use nightshift_kernels::{GgmlType, QMatrix};

/// One weight type's arrays.
pub struct Kind {
    pub ty: GgmlType,
    pub act: GgmlType,
    pub k: usize,
    pub rows: usize,
    pub acts: usize,
    pub w_f32: Vec<f32>,
    pub w_q: Vec<u8>,
    pub w_deq: Vec<f32>,
    pub x_f32: Vec<f32>,
    pub x_q: Vec<u8>,
    pub dot_ref: Vec<f32>,
}

fn bytes_to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Reads every kind of a golden directory.
pub fn load(dir: &Path) -> Result<Vec<Kind>, String> {
    let text = std::fs::read_to_string(dir.join("manifest.json"))
        .map_err(|e| format!("reading {}: {e}", dir.join("manifest.json").display()))?;
    let m: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("parsing manifest.json: {e}"))?;
    let num = |key: &str| -> Result<usize, String> {
        m.get(key)
            .and_then(|v| v.as_u64())
            .map(|v| v as usize)
            .ok_or_else(|| format!("manifest.json: expected integer {key:?}"))
    };
    let (k, rows, acts) = (num("k")?, num("rows")?, num("acts")?);
    let kinds = m
        .get("kinds")
        .and_then(|v| v.as_object())
        .ok_or("manifest.json: expected object \"kinds\"")?;
    let mut out = Vec::new();
    for (name, entry) in kinds {
        let ty = GgmlType::from_name(name).ok_or_else(|| format!("unknown type {name:?}"))?;
        let act_name = entry
            .get("activation_type")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        let act = GgmlType::from_name(act_name)
            .ok_or_else(|| format!("{name}: unknown activation type {act_name:?}"))?;
        let arrays = entry
            .get("arrays")
            .and_then(|v| v.as_object())
            .ok_or_else(|| format!("{name}: expected object \"arrays\""))?;
        let mut files: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
        for key in ["w_f32", "w_q", "w_deq", "x_f32", "x_q", "dot_ref"] {
            let file = arrays
                .get(key)
                .and_then(|a| a.get("file"))
                .and_then(|f| f.as_str())
                .ok_or_else(|| format!("{name}: missing array {key}"))?;
            let path: PathBuf = dir.join(file);
            let data =
                std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
            files.insert(key, data);
        }
        let wb = ty.row_bytes(k).map_err(|e| format!("{name}: {e}"))?;
        let xb = act.row_bytes(k).map_err(|e| format!("{name}: {e}"))?;
        for (key, bytes) in [
            ("w_f32", 4 * rows * k),
            ("w_q", rows * wb),
            ("w_deq", 4 * rows * k),
            ("x_f32", 4 * acts * k),
            ("x_q", acts * xb),
            ("dot_ref", 4 * rows * acts),
        ] {
            let found = files.get(key).map_or(0, Vec::len);
            if found != bytes {
                return Err(format!(
                    "{name}.{key}: expected {bytes} bytes, found {found}"
                ));
            }
        }
        let mut take = |key: &str| files.remove(key).unwrap_or_default();
        out.push(Kind {
            ty,
            act,
            k,
            rows,
            acts,
            w_f32: bytes_to_f32(&take("w_f32")),
            w_q: take("w_q"),
            w_deq: bytes_to_f32(&take("w_deq")),
            x_f32: bytes_to_f32(&take("x_f32")),
            x_q: take("x_q"),
            dot_ref: bytes_to_f32(&take("dot_ref")),
        });
    }
    Ok(out)
}

fn first_f32_mismatch(what: &str, got: &[f32], want: &[f32], row_len: usize) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: expected {} values, found {}",
            want.len(),
            got.len()
        ));
    }
    let bad = got
        .iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits());
    match bad {
        None => Ok(()),
        Some(i) => {
            let count = got
                .iter()
                .zip(want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            Err(format!(
                "{what}: {count} values differ; first at row {} col {}: got {:e} ({:#010x}), expected {:e} ({:#010x})",
                i / row_len.max(1),
                i % row_len.max(1),
                got[i],
                got[i].to_bits(),
                want[i],
                want[i].to_bits()
            ))
        }
    }
}

fn first_byte_mismatch(what: &str, got: &[u8], want: &[u8], row_len: usize) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: expected {} bytes, found {}",
            want.len(),
            got.len()
        ));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => {
            let count = got.iter().zip(want).filter(|(a, b)| a != b).count();
            Err(format!(
                "{what}: {count} bytes differ; first at row {} byte {}: got {:#04x}, expected {:#04x}",
                i / row_len.max(1),
                i % row_len.max(1),
                got[i],
                want[i]
            ))
        }
    }
}

/// ggml's dequantization of the weight rows.
pub fn check_dequantize(g: &Kind) -> Result<(), String> {
    let mut got = vec![0f32; g.rows * g.k];
    let rb = g.ty.row_bytes(g.k).map_err(|e| e.to_string())?;
    for (src, dst) in g.w_q.chunks(rb).zip(got.chunks_mut(g.k)) {
        nightshift_kernels::dequantize_row(g.ty, src, dst).map_err(|e| e.to_string())?;
    }
    first_f32_mismatch("dequantize", &got, &g.w_deq, g.k)
}

fn quantize_rows(ty: GgmlType, k: usize, x: &[f32]) -> Result<Vec<u8>, String> {
    let rb = ty.row_bytes(k).map_err(|e| e.to_string())?;
    let mut got = vec![0u8; x.len() / k * rb];
    for (src, dst) in x.chunks(k).zip(got.chunks_mut(rb)) {
        nightshift_kernels::quantize_row(ty, src, dst).map_err(|e| e.to_string())?;
    }
    Ok(got)
}

/// ggml's reference quantization of the activations (Q8_K, Q8_0 or Q8_1).
pub fn check_quantize_activations(g: &Kind) -> Result<(), String> {
    let got = quantize_rows(g.act, g.k, &g.x_f32)?;
    let rb = g.act.row_bytes(g.k).map_err(|e| e.to_string())?;
    first_byte_mismatch(&format!("quantize {}", g.act), &got, &g.x_q, rb)
}

/// ggml's reference quantization of the weights (no importance matrix).
pub fn check_quantize_weights(g: &Kind) -> Result<(), String> {
    let got = quantize_rows(g.ty, g.k, &g.w_f32)?;
    let rb = g.ty.row_bytes(g.k).map_err(|e| e.to_string())?;
    first_byte_mismatch(&format!("quantize {}", g.ty), &got, &g.w_q, rb)
}

/// ggml's generic dot products, one `vec_dot` at a time (`dot_ref` is rows x acts).
pub fn check_vec_dot(g: &Kind) -> Result<(), String> {
    let wb = g.ty.row_bytes(g.k).map_err(|e| e.to_string())?;
    let xb = g.act.row_bytes(g.k).map_err(|e| e.to_string())?;
    let mut got = Vec::with_capacity(g.rows * g.acts);
    for w in g.w_q.chunks(wb) {
        for x in g.x_q.chunks(xb) {
            got.push(nightshift_kernels::vec_dot(g.ty, g.k, w, x).map_err(|e| e.to_string())?);
        }
    }
    first_f32_mismatch("vec_dot", &got, &g.dot_ref, g.acts)
}

/// The same dot products through `gemm_with` on one tier, on the calling thread and on a pool.
pub fn check_gemm(g: &Kind, tier: Tier, pool: Option<&rayon::ThreadPool>) -> Result<(), String> {
    let (m, n) = (g.rows, g.acts);
    let mut out = vec![f32::NAN; m * n];
    let w = QMatrix::new(g.ty, m, g.k, &g.w_q).map_err(|e| e.to_string())?;
    dispatch::gemm_with(tier, w, &g.x_q, n, &mut out, pool).map_err(|e| e.to_string())?;
    // gemm writes out[j * m + i]; dot_ref is [i][j].
    let mut want = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            want[j * m + i] = g.dot_ref[i * n + j];
        }
    }
    first_f32_mismatch(&format!("gemm on {tier}"), &out, &want, m)
}

/// `check_gemm` on every tier this CPU has, on the calling thread and split over a 3-thread pool.
pub fn check_gemm_every_tier(g: &Kind) -> Result<(), String> {
    static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    let pool = POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("pool")
    });
    for tier in dispatch::available_tiers() {
        check_gemm(g, tier, None)?;
        check_gemm(g, tier, Some(pool)).map_err(|e| format!("{e} (pool)"))?;
    }
    Ok(())
}

/// Runs one check over every kind and reports all failures at once.
pub fn run_all(kinds: &[Kind], name: &str, check: impl Fn(&Kind) -> Result<(), String>) {
    let failures: Vec<String> = kinds
        .iter()
        .filter_map(|g| check(g).err().map(|e| format!("{}: {e}", g.ty)))
        .collect();
    assert!(
        failures.is_empty(),
        "{name} failed:\n{}",
        failures.join("\n")
    );
}

/// Which checks apply: weight quantization is a target only for the types this crate has
/// ggml's reference quantizer for (not the i-quants and ternary types).
pub fn checks(g: &Kind) -> Vec<(String, Result<(), String>)> {
    let mut v = vec![
        ("dequantize".to_string(), check_dequantize(g)),
        (format!("quantize {}", g.act), check_quantize_activations(g)),
    ];
    if g.ty.has_quantizer() {
        v.push((format!("quantize {}", g.ty), check_quantize_weights(g)));
    }
    v.push(("vec_dot".to_string(), check_vec_dot(g)));
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().ok();
    for tier in dispatch::available_tiers() {
        v.push((format!("gemm {tier}"), check_gemm(g, tier, None)));
        if let Some(p) = &pool {
            v.push((format!("gemm {tier} pool"), check_gemm(g, tier, Some(p))));
        }
    }
    v
}
