//! Checks a golden-vector directory (manifest.json format of `tools/kernel_vectors.py`) against
//! this crate: one line per (type, check) — dequantize, activation and weight quantization,
//! vec_dot, and gemm on every tier this CPU can run — with pass/fail; exits non-zero on any
//! failure.
//!
//!     cargo run -p nightshift-kernels --example golden -- DIR

#[path = "../tests/common/golden.rs"]
mod golden;

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: golden DIR   (a directory with manifest.json)");
        return ExitCode::from(2);
    };
    let kinds = match golden::load(&dir) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let tiers: Vec<_> = nightshift_kernels::dispatch::available_tiers();
    println!(
        "{}: {} types, tiers {}",
        dir.display(),
        kinds.len(),
        tiers
            .iter()
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut failed = 0;
    let mut total = 0;
    for g in &kinds {
        for (check, result) in golden::checks(g) {
            total += 1;
            match result {
                Ok(()) => println!("{:<5} {:<22} pass", g.ty.name(), check),
                Err(e) => {
                    failed += 1;
                    println!("{:<5} {:<22} FAIL {e}", g.ty.name(), check);
                }
            }
        }
    }
    println!("{} of {total} checks passed", total - failed);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
