//! ggml's golden vectors (tests/golden, made by ggml's generic C code without FMA) through each
//! aarch64 tier directly, bit for bit: the full 8 x 4 product and sub-tiles with odd row and
//! activation counts and offsets (so every i8mm remainder path meets real data).
#![cfg(target_arch = "aarch64")]

use std::path::PathBuf;

mod common;

use common::tile::tile;
use nightshift_kernels::arch::aarch64::{Dotprod, I8mm, Neon};
use nightshift_kernels::GgmlType;

const TYPES: [GgmlType; 10] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
];

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn read(name: &str) -> Vec<u8> {
    let p = golden_dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// (k, weight rows, activation rows) from manifest.json.
fn shape() -> (usize, usize, usize) {
    let text = String::from_utf8(read("manifest.json")).expect("manifest.json is utf-8");
    let m: serde_json::Value = serde_json::from_str(&text).expect("manifest.json parses");
    let num = |key: &str| {
        m[key]
            .as_u64()
            .unwrap_or_else(|| panic!("manifest.json: expected integer {key:?}")) as usize
    };
    (num("k"), num("rows"), num("acts"))
}

type Gemm = fn(GgmlType, usize, &[u8], usize, &[u8], usize, &mut [f32]) -> Option<bool>;

fn tiers() -> [(&'static str, Gemm); 3] {
    [
        ("neon", |ty, k, w, r, x, n, o| {
            Neon::new().map(|t| t.gemm_block(&mut tile(ty, k, w, r, x, n, o)))
        }),
        ("dotprod", |ty, k, w, r, x, n, o| {
            Dotprod::new().map(|t| t.gemm_block(&mut tile(ty, k, w, r, x, n, o)))
        }),
        ("i8mm", |ty, k, w, r, x, n, o| {
            I8mm::new().map(|t| t.gemm_block(&mut tile(ty, k, w, r, x, n, o)))
        }),
    ]
}

#[test]
fn every_tier_reproduces_ggml_generic_dots() {
    let (k, rows, acts) = shape();
    // (first weight row, weight rows, first activation row, activation rows)
    let tiles = [
        (0, rows, 0, acts),
        (0, rows - 1, 0, acts - 1),
        (1, rows - 3, 1, acts - 1),
        (3, 1, 2, 1),
    ];
    let mut failures = Vec::new();
    let mut checked = 0;
    for ty in TYPES {
        let w = read(&format!("{}.w_q.bin", ty.name()));
        let x = read(&format!("{}.x_q.bin", ty.name()));
        let dot: Vec<u32> = read(&format!("{}.dot_ref.bin", ty.name()))
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let wrow = ty.row_bytes(k).expect("k fits the weight type");
        let xrow = ty
            .vec_dot_type()
            .row_bytes(k)
            .expect("k fits the activation type");
        assert_eq!(
            (w.len(), x.len(), dot.len()),
            (rows * wrow, acts * xrow, rows * acts),
            "{} fixture sizes",
            ty.name()
        );
        for (name, gemm) in tiers() {
            for (r0, nr, j0, na) in tiles {
                let mut out = vec![f32::NAN; nr * na];
                let ws = &w[r0 * wrow..(r0 + nr) * wrow];
                let xs = &x[j0 * xrow..(j0 + na) * xrow];
                match gemm(ty, k, ws, nr, xs, na, &mut out) {
                    None => continue,
                    Some(false) => failures.push(format!("{name} {}: no path", ty.name())),
                    Some(true) => {
                        checked += 1;
                        for r in 0..nr {
                            for j in 0..na {
                                let (got, want) =
                                    (out[r * na + j].to_bits(), dot[(r0 + r) * acts + j0 + j]);
                                if got != want {
                                    failures.push(format!(
                                        "{name} {} tile {:?}: row {} act {}: {:e} ({got:#010x}), ggml {:e} ({want:#010x})",
                                        ty.name(),
                                        (r0, nr, j0, na),
                                        r0 + r,
                                        j0 + j,
                                        f32::from_bits(got),
                                        f32::from_bits(want)
                                    ));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        checked >= TYPES.len() * 4,
        "neon must always run ({checked} tiles checked)"
    );
}
