//! Q4_K on the dotprod and i8mm tiers. Q4_K's scales cover 32 elements, so each reference lane
//! (`e % 8`) gets exactly four products per scale group: with weights and activations both in
//! `unpack::PERM32` order, one SDOT lane or one SMMLA output is one reference lane, exactly.
//!
//! The activation side is prepared once per chunk of activation rows (permuted for SDOT, or
//! permuted and masked into SMMLA operands) in a per-thread scratch buffer that only grows, then
//! every weight row (pair) streams past it.

use core::arch::aarch64::*;
use std::cell::RefCell;

use super::driver::{add_lanes, KAcc, Kind, Q8K_BYTES};
use super::unpack::{self, Unpacked};
use super::{dotprod, i8mm, neon, Level};

/// Activation rows prepared per chunk.
const CH: usize = 8;
/// Prepared bytes per Q8_K block: permuted quants (SDOT) or SMMLA operands.
const PERM_BYTES: usize = 256;
const MASK_BYTES: usize = 512;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The block's 256 activation quants in PERM32 order.
fn perm_block(xq: &[u8], dst: &mut [u8]) {
    let xq = &xq[..256];
    let dst = &mut dst[..PERM_BYTES];
    for g in 0..8 {
        // SAFETY: 32 readable bytes at `xq[32g..]` and 32 writable at `dst[32g..]` (both slices
        // are 256 bytes, bounds-checked above).
        unsafe {
            let (p0, p1) = unpack::perm32(
                vld1q_u8(xq.as_ptr().add(32 * g)),
                vld1q_u8(xq.as_ptr().add(32 * g + 16)),
            );
            vst1q_u8(dst.as_mut_ptr().add(32 * g), p0);
            vst1q_u8(dst.as_mut_ptr().add(32 * g + 16), p1);
        }
    }
}

/// SMMLA operands for one block: per group of 32 and slice s (8 bytes of the permuted quants,
/// lanes 2s and 2s+1), `[slice & lane 2s | slice & lane 2s+1]`.
fn mask_block(xq: &[u8], dst: &mut [u8]) {
    let mut p = [0u8; PERM_BYTES];
    perm_block(xq, &mut p);
    let dst = &mut dst[..MASK_BYTES];
    const M: [u8; 16] = [
        255, 255, 255, 255, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255,
    ];
    // SAFETY: `M` is 16 readable bytes; every slice read is 8 bytes inside `p` (256 bytes) and
    // every store 16 bytes inside `dst` (512 bytes): 32 slices of 8 -> 32 operands of 16.
    unsafe {
        let m = vld1q_u8(M.as_ptr());
        for s in 0..32 {
            let slice = vld1_u8(p.as_ptr().add(8 * s));
            vst1q_u8(
                dst.as_mut_ptr().add(16 * s),
                vandq_u8(vcombine_u8(slice, slice), m),
            );
        }
    }
}

/// The float epilogue of one Q4_K block (reference order: lanes first, then the min term).
#[inline(always)]
fn epilogue(acc: &mut KAcc, lanes: (int32x4_t, int32x4_t), u: &Unpacked, xb: &[u8]) {
    let yd = f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]);
    add_lanes(acc, lanes, u.d * yd);
    let sumi = neon::min_corr(&xb[260..292], &u.mins);
    let dmin = u.dmin * yd;
    acc.sumf -= dmin * sumi as f32;
}

/// Q4_K x Q8_K for `rows` weight rows and `n` activation rows (`level` Dotprod or I8mm).
pub(crate) fn gemm(
    level: Level,
    nb: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    n: usize,
    out: &mut [f32],
) {
    const WB: usize = 144;
    let wrow = nb * WB;
    let xrow = nb * Q8K_BYTES;
    let per = if level == Level::I8mm {
        MASK_BYTES
    } else {
        PERM_BYTES
    };
    SCRATCH.with(|s| {
        let mut scratch = s.borrow_mut();
        let need = CH.min(n) * nb * per;
        if scratch.len() < need {
            scratch.resize(need, 0);
        }
        let mut u = [Unpacked::new(), Unpacked::new()];
        for jc in (0..n).step_by(CH) {
            let cnt = CH.min(n - jc);
            for t in 0..cnt {
                for b in 0..nb {
                    let xq = &x[(jc + t) * xrow + b * Q8K_BYTES + 4..][..256];
                    let dst = &mut scratch[(t * nb + b) * per..][..per];
                    if level == Level::I8mm {
                        mask_block(xq, dst);
                    } else {
                        perm_block(xq, dst);
                    }
                }
            }
            let prep = &scratch[..];
            let mut r = 0;
            while r < rows {
                // i8mm: rows in pairs; an odd last row is paired with itself.
                let r1 = if level == Level::I8mm && r + 1 < rows {
                    r + 1
                } else {
                    r
                };
                let mut acc = [[KAcc::zero(); CH]; 2];
                for b in 0..nb {
                    unpack::q4_k_perm(&w[r * wrow + b * WB..][..WB], &mut u[0]);
                    if level == Level::I8mm && r1 != r {
                        unpack::q4_k_perm(&w[r1 * wrow + b * WB..][..WB], &mut u[1]);
                    }
                    for t in 0..cnt {
                        let xb = &x[(jc + t) * xrow + b * Q8K_BYTES..][..Q8K_BYTES];
                        let pb = &prep[(t * nb + b) * per..][..per];
                        if level == Level::I8mm {
                            let u1 = if r1 != r { &u[1] } else { &u[0] };
                            // SAFETY: the I8mm level is only built from a capability that proved SMMLA.
                            let l = unsafe {
                                i8mm::split32_2x1([&u[0].q, &u1.q], pb, [&u[0].scales, &u1.scales])
                            };
                            epilogue(&mut acc[0][t], (l[0], l[1]), &u[0], xb);
                            if r1 != r {
                                epilogue(&mut acc[1][t], (l[2], l[3]), u1, xb);
                            }
                        } else {
                            // SAFETY: the Dotprod level is only built from a capability that proved SDOT.
                            let l = unsafe { dotprod::split32_perm(&u[0].q, pb, &u[0].scales) };
                            epilogue(&mut acc[0][t], l, &u[0], xb);
                        }
                    }
                }
                for t in 0..cnt {
                    out[r * n + jc + t] = acc[0][t].finish(Kind::Q4K);
                    if r1 != r {
                        out[r1 * n + jc + t] = acc[1][t].finish(Kind::Q4K);
                    }
                }
                r = r1 + 1;
            }
        }
    });
}
