//! The Rust side of the Arm static-analysis report (`benches/arm/run.sh`): one GEMM of this
//! crate on a forced aarch64 tier, bracketed by two marker functions so that a `qemu-aarch64`
//! execution trace can cut out exactly the instructions of that call (the trace is then counted
//! and fed to `llvm-mca`). Prints the two markers' addresses on stdout for the trace parser.
//!
//!     arm_trace TYPE TIER K ROWS BATCH      e.g. arm_trace q4_k i8mm 1024 8 4
//!
//! The weights and activations are real quantized blocks (of a fixed pseudo-random signal) so
//! that every value-dependent step takes its ordinary path. The i-quants and ternary types have
//! no quantizer here (`GgmlType::has_quantizer`): their weights are pseudo-random bytes with
//! every f16 scale kept finite, as `benches/arm/ggml_trace.c` makes ggml's (their kernels have
//! no value-dependent branches beyond selects). The GEMM runs once untraced first,
//! so that per-thread scratch buffers are already grown when the traced call runs. The weights
//! are in the layout resident copies get for the tier (`dispatch::resident_layout_for`), as
//! the expert arenas hold them.

use std::hint::black_box;
use std::process::ExitCode;

use nightshift_kernels::dispatch::{gemm_with, resident_layout_for, Tier};
use nightshift_kernels::formats::repack::repack;
use nightshift_kernels::{quantize_row, GgmlType, QMatrix};

/// The trace starts after this function is executed.
#[inline(never)]
fn trace_begin() {
    black_box(0x5EED_0001u32);
}

/// The trace ends when this function is entered.
#[inline(never)]
fn trace_end() {
    black_box(0x5EED_0002u32);
}

/// A deterministic signal in about [-1, 1] (xorshift), the same for every run.
fn signal(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Pseudo-random blocks: xorshift bytes with the top exponent bits of every odd byte cleared,
/// so that each f16 (at an even offset: every such block's size is even) is finite and small.
fn random_blocks(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..len)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let b = (s >> 32) as u8;
            if i % 2 == 1 {
                b & 0x3b
            } else {
                b
            }
        })
        .collect()
}

fn quantized(ty: GgmlType, rows: usize, k: usize, seed: u64) -> Result<Vec<u8>, String> {
    let rb = ty.row_bytes(k).map_err(|e| e.to_string())?;
    if !ty.has_quantizer() {
        return Ok(random_blocks(rows * rb, seed));
    }
    let mut out = vec![0u8; rows * rb];
    let src = signal(rows * k, seed);
    for r in 0..rows {
        quantize_row(ty, &src[r * k..(r + 1) * k], &mut out[r * rb..(r + 1) * rb])
            .map_err(|e| e.to_string())?;
    }
    Ok(out)
}

fn run(args: &[String]) -> Result<(), String> {
    let [ty, tier, k, rows, batch] = args else {
        return Err("usage: arm_trace TYPE TIER K ROWS BATCH".into());
    };
    let ty = GgmlType::from_name(ty).ok_or_else(|| format!("unknown type {ty:?}"))?;
    let tier = Tier::from_name(tier).ok_or_else(|| format!("unknown tier {tier:?}"))?;
    let num = |s: &str| s.parse::<usize>().map_err(|e| format!("{s:?}: {e}"));
    let (k, rows, batch) = (num(k)?, num(rows)?, num(batch)?);
    let w = quantized(ty, rows, k, 0x9E37_79B9)?;
    let x = quantized(ty.vec_dot_type(), batch, k, 0x7F4A_7C15)?;
    let mut out = vec![0f32; rows * batch];
    let wq = QMatrix::new(ty, rows, k, &w).map_err(|e| e.to_string())?;
    // The weights as resident copies hold them for this tier (`NIGHTSHIFT_REPACK=off`: the
    // file's order).
    let mut packed = vec![0u8; w.len()];
    let layout = resident_layout_for(tier, ty, rows);
    let wq = repack(&wq, layout, &mut packed).map_err(|e| e.to_string())?;
    gemm_with(tier, wq, &x, batch, &mut out, None).map_err(|e| e.to_string())?;
    println!(
        "trace_begin={:#x} trace_end={:#x}",
        trace_begin as *const () as usize, trace_end as *const () as usize
    );
    trace_begin();
    let r = gemm_with(tier, wq, &x, batch, &mut out, None);
    trace_end();
    r.map_err(|e| e.to_string())?;
    println!("checksum={}", black_box(&out).iter().sum::<f32>());
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
