//! The public contract: type metadata matches ggml, bad input is a typed error (never a panic or
//! an out-of-bounds read), garbage bytes never panic, the float dot products follow ggml's
//! generic semantics, and `NIGHTSHIFT_KERNEL` forces (or refuses) a tier.

use nightshift_kernels::dispatch::{self, FloatLevel, Tier};
use nightshift_kernels::formats::{self, BlockQ4_K, BlockQ8_K};
use nightshift_kernels::{
    dequantize_row, gemm, quantize_row, vec_dot, GgmlType, KernelError, QMatrix, Tile,
};
use proptest::prelude::*;

#[test]
fn type_table_matches_ggml() {
    // (type, id, name, elements per block, bytes per block, vec_dot type) from ggml.h/ggml-common.h
    let check = |ty: GgmlType, id: u32, name: &str, bl: usize, bb: usize, vd: GgmlType| {
        assert_eq!(ty.id(), id, "{name}");
        assert_eq!(GgmlType::from_id(id), Some(ty));
        assert_eq!(ty.name(), name);
        assert_eq!(GgmlType::from_name(name), Some(ty));
        assert_eq!((ty.block_len(), ty.block_bytes()), (bl, bb), "{name}");
        assert_eq!(ty.vec_dot_type(), vd, "{name}");
    };
    use GgmlType::*;
    check(F32, 0, "F32", 1, 4, F32);
    check(F16, 1, "F16", 1, 2, F16);
    check(Q4_0, 2, "Q4_0", 32, 18, Q8_0);
    check(Q4_1, 3, "Q4_1", 32, 20, Q8_1);
    check(Q5_0, 6, "Q5_0", 32, 22, Q8_0);
    check(Q5_1, 7, "Q5_1", 32, 24, Q8_1);
    check(Q8_0, 8, "Q8_0", 32, 34, Q8_0);
    check(Q8_1, 9, "Q8_1", 32, 36, Q8_1);
    check(Q2_K, 10, "Q2_K", 256, 84, Q8_K);
    check(Q3_K, 11, "Q3_K", 256, 110, Q8_K);
    check(Q4_K, 12, "Q4_K", 256, 144, Q8_K);
    check(Q5_K, 13, "Q5_K", 256, 176, Q8_K);
    check(Q6_K, 14, "Q6_K", 256, 210, Q8_K);
    check(Q8_K, 15, "Q8_K", 256, 292, Q8_K);
    check(IQ2_XXS, 16, "IQ2_XXS", 256, 66, Q8_K);
    check(IQ2_XS, 17, "IQ2_XS", 256, 74, Q8_K);
    check(IQ3_XXS, 18, "IQ3_XXS", 256, 98, Q8_K);
    check(IQ1_S, 19, "IQ1_S", 256, 50, Q8_K);
    check(IQ4_NL, 20, "IQ4_NL", 32, 18, Q8_0);
    check(IQ3_S, 21, "IQ3_S", 256, 110, Q8_K);
    check(IQ2_S, 22, "IQ2_S", 256, 82, Q8_K);
    check(IQ4_XS, 23, "IQ4_XS", 256, 136, Q8_K);
    check(IQ1_M, 29, "IQ1_M", 256, 56, Q8_K);
    check(BF16, 30, "BF16", 1, 2, BF16);
    check(TQ1_0, 34, "TQ1_0", 256, 54, Q8_K);
    check(TQ2_0, 35, "TQ2_0", 256, 66, Q8_K);
    check(MXFP4, 39, "MXFP4", 32, 17, Q8_0);
    check(NVFP4, 40, "NVFP4", 64, 36, Q8_0);
    check(Q1_0, 41, "Q1_0", 128, 18, Q8_0);
    check(Q2_0, 42, "Q2_0", 64, 18, Q8_0);
    assert_eq!(GgmlType::from_id(4), None);
    assert_eq!(GgmlType::from_id(24), None);
    assert_eq!(GgmlType::from_id(36), None);
    assert_eq!(GgmlType::from_id(43), None);
    assert_eq!(Q4_K.row_bytes(512), Ok(288));
    assert_eq!(F16.row_bytes(3), Ok(6));
}

#[test]
fn bad_lengths_are_errors() {
    let k_not_multiple = |r: Result<(), KernelError>| {
        assert!(matches!(r, Err(KernelError::KNotMultiple { .. })), "{r:?}");
    };
    let length = |r: Result<(), KernelError>| {
        assert!(
            matches!(
                r,
                Err(KernelError::Length { .. } | KernelError::Elements { .. })
            ),
            "{r:?}"
        );
    };
    let mut f = vec![0f32; 300];
    let mut b = vec![0u8; 1000];
    k_not_multiple(dequantize_row(GgmlType::Q4_K, &b[..144], &mut f));
    k_not_multiple(quantize_row(GgmlType::Q8_0, &f[..33], &mut b[..34]));
    length(dequantize_row(GgmlType::Q4_K, &b[..143], &mut f[..256]));
    length(dequantize_row(GgmlType::Q4_K, &b[..288], &mut f[..256]));
    length(quantize_row(GgmlType::Q8_K, &f[..256], &mut b[..291]));
    length(quantize_row(GgmlType::F16, &f[..10], &mut b[..21]));
    length(vec_dot(GgmlType::Q4_K, 256, &b[..144], &b[..291]).map(drop));
    length(vec_dot(GgmlType::Q4_K, 256, &b[..145], &b[..292]).map(drop));
    k_not_multiple(vec_dot(GgmlType::Q4_0, 16, &b[..9], &b[..17]).map(drop));
    for ty in [GgmlType::Q8_K, GgmlType::Q8_1] {
        let r = vec_dot(
            ty,
            256,
            &b[..ty.row_bytes(256).unwrap()],
            &b[..ty.row_bytes(256).unwrap()],
        );
        assert!(matches!(r, Err(KernelError::Unsupported { .. })), "{r:?}");
    }

    fn q4(w: &[u8], m: usize) -> Result<QMatrix<'_>, KernelError> {
        QMatrix::new(GgmlType::Q4_K, m, 256, w)
    }
    // gemm: the matrix is checked when built (weights), gemm checks activations, output and
    // m * n overflow
    let w = vec![0u8; 2 * 144];
    let x = vec![0u8; 3 * 292];
    let mut out = vec![0f32; 6];
    let wm = q4(&w, 2).expect("two rows");
    assert_eq!(gemm(wm, &x, 3, &mut out, None), Ok(()));
    length(q4(&w[..287], 2).map(drop));
    length(q4(&w, 3).map(drop));
    length(gemm(wm, &x[..875], 3, &mut out, None));
    length(gemm(wm, &x, 3, &mut out[..5], None));
    k_not_multiple(QMatrix::new(GgmlType::Q4_K, 2, 255, &w).map(drop));
    let r = QMatrix::new(GgmlType::F32, usize::MAX, 1, &[]);
    assert!(matches!(r, Err(KernelError::Overflow { .. })), "{r:?}");
    let huge = QMatrix::new(GgmlType::F32, usize::MAX, 0, &[]).expect("empty rows");
    let r = gemm(huge, &[], 3, &mut out, None);
    assert!(matches!(r, Err(KernelError::Overflow { .. })), "{r:?}");
    // a tier's tile: its parts are checked against each other when it is built (the tiers'
    // unsafe code relies on that alone)
    let xm = QMatrix::activations(&wm, &x, 3).expect("three Q8_K rows");
    assert_eq!((xm.ty(), xm.rows(), xm.cols()), (GgmlType::Q8_K, 3, 256));
    assert!(Tile::new(wm, xm, &mut out).is_ok());
    length(QMatrix::activations(&wm, &x[..875], 3).map(drop));
    length(QMatrix::activations(&wm, &x, 2).map(drop));
    length(Tile::new(wm, xm, &mut out[..5]).map(drop));
    let operands = |r: Result<Tile<'_>, KernelError>| {
        assert!(matches!(r, Err(KernelError::Operands { .. })), "{r:?}");
    };
    let q8_0 = QMatrix::new(GgmlType::Q8_0, 1, 256, &x[..272]).expect("8 Q8_0 blocks");
    operands(Tile::new(wm, q8_0, &mut out[..2]));
    let long = QMatrix::new(GgmlType::Q8_K, 1, 512, &x[..584]).expect("a 512-element row");
    operands(Tile::new(wm, long, &mut out[..2]));
    let q8k = QMatrix::new(GgmlType::Q8_K, 1, 256, &x[..292]).expect("one Q8_K row");
    let r = Tile::new(q8k, q8k, &mut out[..1]);
    assert!(matches!(r, Err(KernelError::Unsupported { .. })), "{r:?}");
    // a row range is a matrix of its own, inside its parent
    assert_eq!(wm.row_range(1, 1).map(|r| r.bytes().len()), Ok(144));
    for (start, count) in [(1, 2), (3, 0), (usize::MAX, 2)] {
        let r = wm.row_range(start, count);
        assert!(matches!(r, Err(KernelError::Rows { .. })), "{r:?}");
    }
    // empty problems are fine
    assert_eq!(
        gemm(q4(&[], 0).expect("no rows"), &x, 3, &mut [], None),
        Ok(())
    );
    assert_eq!(gemm(wm, &[], 0, &mut [], None), Ok(()));
    let mut o2 = vec![1f32; 2];
    let empty_rows = QMatrix::new(GgmlType::Q4_K, 2, 0, &[]).expect("zero-length rows");
    assert_eq!(gemm(empty_rows, &[], 1, &mut o2, None), Ok(()));
    assert_eq!(o2, [0.0, 0.0]);
}

#[test]
fn typed_views_check_length_not_alignment() {
    let bytes = vec![7u8; 2 * 292 + 1];
    // any offset works: blocks have alignment 1
    for off in 0..2 {
        let v = formats::blocks::<BlockQ8_K>(&bytes[off..off + 292]).expect("view");
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].qs[0], 7);
    }
    let r = formats::blocks::<BlockQ8_K>(&bytes[..293]);
    assert!(
        matches!(
            r,
            Err(KernelError::Ragged {
                block_bytes: 292,
                found: 293,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(formats::blocks::<BlockQ4_K>(&[]).map(|b| b.len()), Ok(0));
    let mut raw = vec![0u8; 144];
    formats::blocks_mut::<BlockQ4_K>(&mut raw).expect("view")[0].d = [0x00, 0x3c];
    assert_eq!(
        formats::blocks::<BlockQ4_K>(&raw).expect("view")[0].d(),
        1.0
    );
    assert_eq!(
        formats::block_bytes(formats::blocks::<BlockQ4_K>(&raw).expect("view")),
        &raw[..]
    );
}

#[test]
fn float_dots_follow_ggml_generic() {
    // ggml_vec_dot_f32/f16/bf16 (generic): f32 products (after converting both sides to the row
    // type), accumulated in f64, rounded to f32 once.
    let k = 1000;
    let w: Vec<f32> = (0..k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.0123)
        .collect();
    let x: Vec<f32> = (0..k)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.031)
        .collect();
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        let rb = ty.row_bytes(k).expect("row");
        let (mut wb, mut xb) = (vec![0u8; rb], vec![0u8; rb]);
        quantize_row(ty, &w, &mut wb).expect("w");
        quantize_row(ty, &x, &mut xb).expect("x");
        let (mut wf, mut xf) = (vec![0f32; k], vec![0f32; k]);
        dequantize_row(ty, &wb, &mut wf).expect("w back");
        dequantize_row(ty, &xb, &mut xf).expect("x back");
        let mut want = 0f64;
        for (a, b) in wf.iter().zip(&xf) {
            want += (a * b) as f64;
        }
        assert_eq!(
            vec_dot(ty, k, &wb, &xb).expect("dot").to_bits(),
            (want as f32).to_bits(),
            "{ty}"
        );
        let mut out = [0f32; 1];
        let w1 = QMatrix::new(ty, 1, k, &wb).expect("one row");
        gemm(w1, &xb, 1, &mut out, None).expect("gemm");
        assert_eq!(out[0].to_bits(), (want as f32).to_bits(), "{ty}");

        // the GEMM tile (4 rows in lockstep + remainder) equals one vec_dot per pair
        let (m, n) = (7, 3);
        let wm: Vec<u8> = (0..m)
            .flat_map(|r| wb[..rb - 2 * r].iter().chain(&xb[rb - 2 * r..]).copied())
            .collect();
        let xm: Vec<u8> = (0..n)
            .flat_map(|j| xb[2 * j..].iter().chain(&wb[..2 * j]).copied())
            .collect();
        let mut out = vec![0f32; m * n];
        let wq = QMatrix::new(ty, m, k, &wm).expect("m rows");
        gemm(wq, &xm, n, &mut out, None).expect("gemm");
        for i in 0..m {
            for j in 0..n {
                let d = vec_dot(ty, k, &wm[i * rb..(i + 1) * rb], &xm[j * rb..(j + 1) * rb])
                    .expect("dot");
                assert_eq!(
                    out[j * m + i].to_bits(),
                    d.to_bits(),
                    "{ty} row {i} act {j}"
                );
            }
        }
    }
}

#[test]
fn q8_k_all_zero_block_has_zero_scale_and_sums() {
    let mut b = vec![0xffu8; 292];
    quantize_row(GgmlType::Q8_K, &[0.0; 256], &mut b).expect("quantize");
    assert!(b.iter().all(|&v| v == 0));
    // the largest magnitude always maps to -127 (iscale = -127 / max), so the scale takes the
    // opposite sign of that element
    let check = |big: f32, q_big: i8, q_rest: i8, d_positive: bool| {
        let mut x = [0.5f32; 256];
        x[3] = big;
        let mut b = vec![0u8; 292];
        quantize_row(GgmlType::Q8_K, &x, &mut b).expect("quantize");
        let blk = &formats::blocks::<BlockQ8_K>(&b).expect("view")[0];
        assert_eq!((blk.qs[3], blk.qs[0]), (q_big, q_rest), "{big}");
        assert_eq!(blk.d() > 0.0, d_positive, "{big}");
        assert_eq!(blk.bsum(0), q_big as i16 + 15 * q_rest as i16);
        assert_eq!(blk.bsum(1), 16 * q_rest as i16);
    };
    check(-2.0, -127, 32, true);
    check(2.0, -127, -32, false);
}

/// `PROPTEST_CASES` when set (slow emulated runs lower it), else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(64), ..ProptestConfig::default() })]

    /// Arbitrary bytes (NaN/inf scales, any quants) never panic in any row function.
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..1200), k_blocks in 0usize..3) {
        for ty in GgmlType::ALL {
            let k = k_blocks * 256;
            let rb = ty.row_bytes(k).expect("multiple of 256");
            let mut f = vec![0f32; k];
            let _ = dequantize_row(ty, &bytes[..rb.min(bytes.len())], &mut f);
            let xb = ty.vec_dot_type().row_bytes(k).expect("multiple of 256");
            if bytes.len() >= rb && bytes.len() >= xb {
                let _ = vec_dot(ty, k, &bytes[..rb], &bytes[bytes.len() - xb..]);
                let mut out = [0f32; 1];
                let w = QMatrix::new(ty, 1, k, &bytes[..rb]).expect("one row");
                let _ = gemm(w, &bytes[bytes.len() - xb..], 1, &mut out, None);
            }
            let vals: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            let kk = vals.len() / 256 * 256;
            let mut q = vec![0u8; ty.row_bytes(kk).expect("multiple of 256")];
            let _ = quantize_row(ty, &vals[..kk], &mut q);
        }
    }
}

#[test]
fn nightshift_kernel_values_resolve() {
    let best = *dispatch::available_tiers().last().expect("scalar at least");
    assert!(
        dispatch::describe().contains("scalar"),
        "{}",
        dispatch::describe()
    );
    assert_eq!(dispatch::resolve_tier(None), Ok(best));
    assert_eq!(dispatch::resolve_tier(Some("")), Ok(best));
    assert_eq!(dispatch::resolve_tier(Some("auto")), Ok(best));
    assert_eq!(dispatch::resolve_tier(Some("scalar")), Ok(Tier::Scalar));
    assert_eq!(dispatch::resolve_tier(Some(" Scalar ")), Ok(Tier::Scalar));
    let r = dispatch::resolve_tier(Some("sse9"));
    assert!(
        matches!(&r, Err(KernelError::UnknownTier { found }) if found == "sse9"),
        "{r:?}"
    );
    for t in Tier::ALL {
        let r = dispatch::resolve_tier(Some(t.name()));
        if dispatch::is_available(t) {
            assert_eq!(r, Ok(t));
        } else {
            assert!(
                matches!(r, Err(KernelError::TierUnavailable { .. })),
                "{r:?}"
            );
            let mut out = [0f32; 1];
            let w = QMatrix::new(GgmlType::F32, 1, 1, &[0; 4]).expect("one float");
            let g = dispatch::gemm_with(t, w, &[0; 4], 1, &mut out, None);
            assert!(
                matches!(g, Err(KernelError::TierUnavailable { .. })),
                "{g:?}"
            );
        }
    }
}

/// Runs only as a child of `forced_tier_reaches_gemm` (with NIGHTSHIFT_KERNEL set).
#[test]
#[ignore = "child process of forced_tier_reaches_gemm"]
fn child_reports_forced_tier() {
    let want = std::env::var("EXPECT_TIER").expect("EXPECT_TIER set by the parent");
    match want.as_str() {
        "error" => {
            assert_eq!(dispatch::active_tier(), Tier::Scalar);
            let mut out = [0f32; 1];
            let w = QMatrix::new(GgmlType::F32, 1, 1, &[0; 4]).expect("one float");
            let r = gemm(w, &[0; 4], 1, &mut out, None);
            assert!(r.is_err(), "{r:?}");
            eprintln!(
                "gemm refused: {}",
                r.err().map(|e| e.to_string()).unwrap_or_default()
            );
        }
        name => assert_eq!(dispatch::active_tier().name(), name),
    }
    // the f32 kernels' build follows the forced tier: none wider than it, baseline for scalar
    // (and for a tier that cannot run)
    let cap = match want.as_str() {
        "avx512vnni" => FloatLevel::Avx512,
        "avx2" => FloatLevel::Avx2,
        _ => FloatLevel::Baseline,
    };
    assert_eq!(
        dispatch::float_level(),
        cap.min(dispatch::float_level_available())
    );
}

#[test]
fn forced_tier_reaches_gemm() {
    let exe = std::env::current_exe().expect("test binary path");
    let run = |value: &str, expect: &str| {
        let outp = std::process::Command::new(&exe)
            .args([
                "--exact",
                "child_reports_forced_tier",
                "--ignored",
                "--nocapture",
            ])
            .env("NIGHTSHIFT_KERNEL", value)
            .env("EXPECT_TIER", expect)
            .output()
            .expect("spawn child test");
        assert!(
            outp.status.success(),
            "NIGHTSHIFT_KERNEL={value}: {}{}",
            String::from_utf8_lossy(&outp.stdout),
            String::from_utf8_lossy(&outp.stderr)
        );
        assert!(
            String::from_utf8_lossy(&outp.stdout).contains("1 passed"),
            "child did not run"
        );
    };
    run("scalar", "scalar");
    run("bogus", "error");
    for t in Tier::ALL {
        run(
            t.name(),
            if dispatch::is_available(t) {
                t.name()
            } else {
                "error"
            },
        );
    }
}

#[test]
fn f16_fields_are_ggmls_offsets() {
    // ggml-common.h: Q2_K ends in d, dmin after 16 scale and 64 quant bytes; Q3_K's d follows
    // 32 + 64 + 12 bytes, Q6_K's 128 + 64 + 16; the ternary types keep d last
    assert_eq!(GgmlType::Q2_K.f16_fields(), &[80, 82]);
    assert_eq!(GgmlType::Q3_K.f16_fields(), &[108]);
    assert_eq!(GgmlType::Q4_K.f16_fields(), &[0, 2]);
    assert_eq!(GgmlType::Q6_K.f16_fields(), &[208]);
    assert_eq!(GgmlType::Q8_1.f16_fields(), &[0, 2]);
    assert_eq!(GgmlType::TQ1_0.f16_fields(), &[52]);
    assert_eq!(GgmlType::TQ2_0.f16_fields(), &[64]);
    assert_eq!(GgmlType::Q1_0.f16_fields(), &[0]);
    assert_eq!(GgmlType::Q2_0.f16_fields(), &[0]);
    assert_eq!(GgmlType::MXFP4.f16_fields(), &[] as &[usize]);
    for ty in GgmlType::ALL {
        for &at in ty.f16_fields() {
            assert!(at + 2 <= ty.block_bytes(), "{}: field at {at}", ty.name());
        }
    }
}
