//! The scale searches behind ggml's K-quant reference quantizers (`nearest_int`,
//! `make_qx_quants`, `make_q3_quants`, `make_qkx2_quants`), transcribed operation by operation:
//! every float expression keeps C's left-to-right evaluation and int -> float conversions, and
//! nothing is fused, so the chosen quants and scales are bit-identical to ggml's.

// Index loops mirror ggml's C loops one to one, which keeps the transcription checkable.
#![allow(clippy::needless_range_loop)]
// `min(hi).max(lo)` instead of `clamp`: `nmax` is a parameter and clamp would panic on a
// degenerate range where ggml computes garbage.
#![allow(clippy::manual_clamp)]

/// Rounds to nearest (ties to even) with ggml's 1.5 * 2^23 trick; like ggml it is only meaningful
/// for |x| <= 4194303 (larger or non-finite inputs give garbage, never a panic).
#[inline(always)]
pub fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    let i = val.to_bits() as i32;
    (i & 0x007f_ffff) - 0x0040_0000
}

const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `make_qx_quants` with `rmse_type = 1` semantics for `rmse_type >= 1` and optional
/// weights; `L` receives `q + nmax` in `0..2 * nmax`. Returns the scale.
pub fn make_qx_quants(
    n: usize,
    nmax: i32,
    x: &[f32],
    l_out: &mut [i8],
    rmse_type: i32,
    qw: Option<&[f32]>,
) -> f32 {
    let n = n.min(x.len()).min(l_out.len());
    let x = &x[..n];
    let l_out = &mut l_out[..n];
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let mut iscale = (-nmax) as f32 / max;
    if rmse_type == 0 {
        for (l, &v) in l_out.iter_mut().zip(x) {
            let q = nearest_int(iscale * v);
            *l = (nmax + q.min(nmax - 1).max(-nmax)) as i8;
        }
        return 1.0 / iscale;
    }
    let (rmse_type, return_early) = if rmse_type < 0 {
        (-rmse_type, true)
    } else {
        (rmse_type, false)
    };
    let weight = |i: usize| -> f32 {
        match qw {
            Some(w) => w[i],
            None => match rmse_type {
                1 => x[i] * x[i],
                2 => 1.0,
                3 => x[i].abs(),
                _ => x[i].abs().sqrt(),
            },
        }
    };
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * x[i]).min(nmax - 1).max(-nmax);
        l_out[i] = (q + nmax) as i8;
        let w = weight(i);
        let qf = q as f32;
        sumlx += w * x[i] * qf;
        suml2 += w * qf * qf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            let q = nearest_int(iscale * x[i]).min(nmax - 1).max(-nmax);
            let w = weight(i);
            let qf = q as f32;
            sumlx += w * x[i] * qf;
            suml2 += w * qf * qf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let q = nearest_int(iscale * x[i]);
                l_out[i] = (nmax + q.min(nmax - 1).max(-nmax)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants`; `L` receives `q + nmax`. Returns the scale.
pub fn make_q3_quants(n: usize, nmax: i32, x: &[f32], l_out: &mut [i8], do_rmse: bool) -> f32 {
    let n = n.min(x.len()).min(l_out.len());
    let x = &x[..n];
    let l_out = &mut l_out[..n];
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let iscale = (-nmax) as f32 / max;
    if do_rmse {
        let mut sumlx = 0.0f32;
        let mut suml2 = 0.0f32;
        for i in 0..n {
            let q = nearest_int(iscale * x[i]).min(nmax - 1).max(-nmax);
            l_out[i] = q as i8;
            let w = x[i] * x[i];
            sumlx += w * x[i] * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        for _ in 0..5 {
            let mut n_changed = 0;
            for i in 0..n {
                let w = x[i] * x[i];
                let li = l_out[i] as f32;
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = nearest_int(x[i] * sl2 / slx).min(nmax - 1).max(-nmax);
                    if new_l != l_out[i] as i32 {
                        let nl = new_l as f32;
                        slx += w * x[i] * nl;
                        sl2 += w * nl * nl;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            l_out[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for l in l_out.iter_mut() {
            *l += nmax as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for (l, &v) in l_out.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).min(nmax - 1).max(-nmax);
        *l = (q + nmax) as i8;
    }
    1.0 / iscale
}

/// Parameters of ggml's `make_qkx2_quants` search.
#[derive(Clone, Copy, Debug)]
pub struct Qkx2 {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    pub use_mad: bool,
}

/// ggml's `make_qkx2_quants`: quants `L` in `0..=nmax` with `x ~ scale * L - the_min`. Returns
/// `(scale, the_min)`. Works on the common length of the four slices.
pub fn make_qkx2_quants(
    p: Qkx2,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    l_aux: &mut [u8],
) -> (f32, f32) {
    let n = x.len().min(weights.len()).min(l_out.len()).min(l_aux.len());
    if n == 0 {
        return (0.0, 0.0);
    }
    let nmax = p.nmax;
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).min(nmax).max(0);
        l_out[i] = l as u8;
        let mut diff = scale * l as f32 + min - x[i];
        diff = if p.use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).min(nmax).max(0);
            l_aux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let mut diff = this_scale * l_aux[i] as f32 + this_min - x[i];
                diff = if p.use_mad { diff.abs() } else { diff * diff };
                cur_error += weights[i] * diff;
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&l_aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

#[cfg(test)]
mod tests {
    use super::nearest_int;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        let check = |x: f32, expect: i32| assert_eq!(nearest_int(x), expect, "{x}");
        check(0.5, 0);
        check(1.5, 2);
        check(2.5, 2);
        check(-0.5, 0);
        check(-1.5, -2);
        check(-2.4, -2);
        check(3.7, 4);
        check(127.0, 127);
        check(-4194303.0, -4194303);
    }
}
