//! Run-time choice of the SIMD tier, and the GEMM driver that splits weight rows over a rayon
//! pool and hands each slice of rows to the chosen tier.
//!
//! **Architecture Invariant: this is the only place that asks the CPU what it has.** Features are
//! detected once per process ([`x86_features`], [`aarch64_features`], cached in a `OnceLock`),
//! like memchr's one detection per arch; everything else reads them from here:
//! - a GEMM tier exists only as a capability value (`arch::x86_64::Avx2`, `arch::aarch64::I8mm`,
//!   ...) built from that detection;
//! - the AVX-512 tier's optional instructions (VBMI, GFNI) are fields of [`X86Features`], which
//!   `NIGHTSHIFT_X86_VBMI=off` / `NIGHTSHIFT_X86_GFNI=off` clear;
//! - the f32 kernels (packed F32 router, [`crate::attn`]) run the build [`float_level`] names.
//!
//! `NIGHTSHIFT_KERNEL=scalar|avx2|avx512vnni|neon|dotprod|i8mm` forces a tier (`auto` or unset
//! picks the best) and caps the f32 kernels' build with it (`scalar`: the baseline build);
//! forcing a tier the CPU lacks makes [`crate::gemm`] return an error. A tier whose
//! `gemm_block` has no path for a type returns false and the scalar reference runs instead (on
//! the same [`Tile`]), so
//! every type works on every tier, and every tier gives the scalar reference's bits.

use std::cell::Cell;
use std::sync::OnceLock;

use rayon::prelude::*;

use crate::formats::repack::Layout;
use crate::{scalar, GgmlType, KernelError, QMatrix, Tile};

/// A kernel tier: the scalar reference or one SIMD implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    Scalar,
    Avx2,
    Avx512Vnni,
    Neon,
    Dotprod,
    I8mm,
}

impl Tier {
    /// Every tier, in order of preference within an architecture (later is better).
    pub const ALL: [Tier; 6] = [
        Tier::Scalar,
        Tier::Avx2,
        Tier::Avx512Vnni,
        Tier::Neon,
        Tier::Dotprod,
        Tier::I8mm,
    ];

    /// The name used by `NIGHTSHIFT_KERNEL` and in reports ("scalar", "avx2", ...).
    pub fn name(self) -> &'static str {
        match self {
            Tier::Scalar => "scalar",
            Tier::Avx2 => "avx2",
            Tier::Avx512Vnni => "avx512vnni",
            Tier::Neon => "neon",
            Tier::Dotprod => "dotprod",
            Tier::I8mm => "i8mm",
        }
    }

    /// Parses a tier name (case-insensitive).
    pub fn from_name(s: &str) -> Option<Tier> {
        Tier::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s.trim()))
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The x86-64 features the kernels choose code by, detected once per process. `avx512vbmi` and
/// `gfni` read as absent when `NIGHTSHIFT_X86_VBMI=off` / `NIGHTSHIFT_X86_GFNI=off` withhold
/// them, so the tests also cover the paths without them on a machine that has them.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct X86Features {
    pub avx2: bool,
    pub fma: bool,
    pub f16c: bool,
    pub avx512f: bool,
    pub avx512bw: bool,
    pub avx512vl: bool,
    pub avx512dq: bool,
    pub avx512vnni: bool,
    /// AVX512-VBMI (`vpermb`): the AVX-512 tier's 64-byte Q3_K..Q6_K kernels and Q2_K's table.
    pub avx512vbmi: bool,
    /// GFNI (`vgf2p8affineqb`): byte decoding in the 64-byte K-quant kernels and TQ2_0 (`iq512`).
    pub gfni: bool,
}

/// This CPU's [`X86Features`] (detected on the first call).
#[cfg(target_arch = "x86_64")]
pub fn x86_features() -> X86Features {
    static FEATURES: OnceLock<X86Features> = OnceLock::new();
    *FEATURES.get_or_init(|| {
        let allowed = |var: &str| std::env::var(var).map_or(true, |v| v != "off");
        X86Features {
            avx2: is_x86_feature_detected!("avx2"),
            fma: is_x86_feature_detected!("fma"),
            f16c: is_x86_feature_detected!("f16c"),
            avx512f: is_x86_feature_detected!("avx512f"),
            avx512bw: is_x86_feature_detected!("avx512bw"),
            avx512vl: is_x86_feature_detected!("avx512vl"),
            avx512dq: is_x86_feature_detected!("avx512dq"),
            avx512vnni: is_x86_feature_detected!("avx512vnni"),
            avx512vbmi: is_x86_feature_detected!("avx512vbmi") && allowed("NIGHTSHIFT_X86_VBMI"),
            gfni: is_x86_feature_detected!("gfni") && allowed("NIGHTSHIFT_X86_GFNI"),
        }
    })
}

/// The aarch64 features the kernels choose code by, detected once per process.
#[cfg(target_arch = "aarch64")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Aarch64Features {
    pub neon: bool,
    /// SDOT/UDOT (FEAT_DotProd).
    pub dotprod: bool,
    /// SMMLA (FEAT_I8MM).
    pub i8mm: bool,
}

/// This CPU's [`Aarch64Features`] (detected on the first call).
#[cfg(target_arch = "aarch64")]
pub fn aarch64_features() -> Aarch64Features {
    static FEATURES: OnceLock<Aarch64Features> = OnceLock::new();
    *FEATURES.get_or_init(|| Aarch64Features {
        neon: std::arch::is_aarch64_feature_detected!("neon"),
        dotprod: std::arch::is_aarch64_feature_detected!("dotprod"),
        i8mm: std::arch::is_aarch64_feature_detected!("i8mm"),
    })
}

/// Which build of the f32 kernels runs (the packed F32 router GEMM, [`crate::attn`]): the same
/// operations in the same order compiled for wider vectors, so every level gives the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FloatLevel {
    /// The target's baseline (SSE2 on x86-64, NEON on aarch64).
    Baseline,
    /// x86-64 AVX2.
    Avx2,
    /// x86-64 AVX-512 F and DQ.
    Avx512,
}

/// The widest [`FloatLevel`] this CPU runs.
pub fn float_level_available() -> FloatLevel {
    #[cfg(target_arch = "x86_64")]
    {
        let f = x86_features();
        if f.avx512f && f.avx512dq {
            return FloatLevel::Avx512;
        }
        if f.avx2 {
            return FloatLevel::Avx2;
        }
    }
    FloatLevel::Baseline
}

/// The [`FloatLevel`] the f32 kernels use: the widest available, capped by a tier that
/// `NIGHTSHIFT_KERNEL` forces (`scalar` and the aarch64 tiers: baseline; `avx2`: AVX2;
/// `avx512vnni`: AVX-512). A value naming no usable tier also means baseline (and
/// [`crate::gemm`] reports it).
pub fn float_level() -> FloatLevel {
    static LEVEL: OnceLock<FloatLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let widest = float_level_available();
        let cap = match kernel_env().as_deref().map(str::trim) {
            None => return widest,
            Some(v) if v.is_empty() || v.eq_ignore_ascii_case("auto") => return widest,
            Some(_) => match configured_tier() {
                Ok(Tier::Avx512Vnni) => FloatLevel::Avx512,
                Ok(Tier::Avx2) => FloatLevel::Avx2,
                _ => FloatLevel::Baseline,
            },
        };
        widest.min(cap)
    })
}

/// The value of `NIGHTSHIFT_KERNEL`, if set (`<not utf-8>` when it is not UTF-8).
fn kernel_env() -> Option<String> {
    std::env::var_os("NIGHTSHIFT_KERNEL").map(|v| v.to_str().unwrap_or("<not utf-8>").to_string())
}

/// The capabilities this CPU has, detected once.
#[derive(Default)]
struct Caps {
    #[cfg(target_arch = "x86_64")]
    avx2: Option<crate::arch::x86_64::Avx2>,
    #[cfg(target_arch = "x86_64")]
    avx512vnni: Option<crate::arch::x86_64::Avx512Vnni>,
    #[cfg(target_arch = "aarch64")]
    neon: Option<crate::arch::aarch64::Neon>,
    #[cfg(target_arch = "aarch64")]
    dotprod: Option<crate::arch::aarch64::Dotprod>,
    #[cfg(target_arch = "aarch64")]
    i8mm: Option<crate::arch::aarch64::I8mm>,
}

fn caps() -> &'static Caps {
    static CAPS: OnceLock<Caps> = OnceLock::new();
    CAPS.get_or_init(|| Caps {
        #[cfg(target_arch = "x86_64")]
        avx2: crate::arch::x86_64::Avx2::new(),
        #[cfg(target_arch = "x86_64")]
        avx512vnni: crate::arch::x86_64::Avx512Vnni::new(),
        #[cfg(target_arch = "aarch64")]
        neon: crate::arch::aarch64::Neon::new(),
        #[cfg(target_arch = "aarch64")]
        dotprod: crate::arch::aarch64::Dotprod::new(),
        #[cfg(target_arch = "aarch64")]
        i8mm: crate::arch::aarch64::I8mm::new(),
    })
}

/// True when this CPU (and build) can run `tier`.
pub fn is_available(tier: Tier) -> bool {
    let c = caps();
    match tier {
        Tier::Scalar => true,
        #[cfg(target_arch = "x86_64")]
        Tier::Avx2 => c.avx2.is_some(),
        #[cfg(target_arch = "x86_64")]
        Tier::Avx512Vnni => c.avx512vnni.is_some(),
        #[cfg(target_arch = "aarch64")]
        Tier::Neon => c.neon.is_some(),
        #[cfg(target_arch = "aarch64")]
        Tier::Dotprod => c.dotprod.is_some(),
        #[cfg(target_arch = "aarch64")]
        Tier::I8mm => c.i8mm.is_some(),
        #[allow(unreachable_patterns)]
        _ => {
            let _ = c;
            false
        }
    }
}

/// The tiers this CPU can run, scalar first, best last.
pub fn available_tiers() -> Vec<Tier> {
    Tier::ALL.into_iter().filter(|&t| is_available(t)).collect()
}

fn unavailable(tier: Tier) -> KernelError {
    let available: Vec<&str> = available_tiers().into_iter().map(Tier::name).collect();
    KernelError::TierUnavailable {
        tier: tier.name(),
        available: available.join(", "),
    }
}

/// Resolves a `NIGHTSHIFT_KERNEL` value: `None`, empty or `auto` -> the best available tier; a
/// tier name -> that tier if this CPU can run it; anything else -> an error saying why.
pub fn resolve_tier(value: Option<&str>) -> Result<Tier, KernelError> {
    let best = available_tiers().last().copied().unwrap_or(Tier::Scalar);
    match value.map(str::trim) {
        None => Ok(best),
        Some(v) if v.is_empty() || v.eq_ignore_ascii_case("auto") => Ok(best),
        Some(v) => match Tier::from_name(v) {
            None => Err(KernelError::UnknownTier {
                found: v.to_string(),
            }),
            Some(t) if is_available(t) => Ok(t),
            Some(t) => Err(unavailable(t)),
        },
    }
}

/// The tier `NIGHTSHIFT_KERNEL` asks for (see [`resolve_tier`]), read and checked once, then
/// cached. Binaries should call this at startup to report a misconfiguration early.
pub fn configured_tier() -> Result<Tier, KernelError> {
    static CONFIGURED: OnceLock<Result<Tier, KernelError>> = OnceLock::new();
    CONFIGURED
        .get_or_init(|| resolve_tier(kernel_env().as_deref()))
        .clone()
}

/// The tier [`crate::gemm`] uses: [`configured_tier`], or `Scalar` when the forced tier is
/// unusable (in which case `gemm` itself returns the error, so a misconfiguration is never
/// silently ignored).
pub fn active_tier() -> Tier {
    configured_tier().unwrap_or(Tier::Scalar)
}

/// The layout resident weights of type `ty` (`rows` rows) should be repacked into for the
/// tier [`crate::gemm`] uses ([`active_tier`]): [`Layout::Rows4`] for Q8_0, Q4_0, Q3_K,
/// Q4_K, Q5_K and Q6_K on the aarch64 SDOT and SMMLA tiers (`formats::repack`), GGUF order otherwise or when
/// `NIGHTSHIFT_REPACK=off` (for A/B runs). Read by the code that makes resident copies
/// (`model::resident`); mapped weights always stay in file order.
pub fn resident_layout(ty: GgmlType, rows: usize) -> Layout {
    resident_layout_for(active_tier(), ty, rows)
}

/// [`resident_layout`] for weights that `tier` will read (benchmarks that force a tier).
pub fn resident_layout_for(tier: Tier, ty: GgmlType, rows: usize) -> Layout {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    let enabled =
        *ENABLED.get_or_init(|| std::env::var("NIGHTSHIFT_REPACK").map_or(true, |v| v != "off"));
    let reads = match tier {
        #[cfg(target_arch = "aarch64")]
        Tier::Dotprod => {
            crate::arch::aarch64::reads_repacked(crate::arch::aarch64::Level::Dotprod, ty)
        }
        #[cfg(target_arch = "aarch64")]
        Tier::I8mm => crate::arch::aarch64::reads_repacked(crate::arch::aarch64::Level::I8mm, ty),
        _ => false,
    };
    if enabled && reads && Layout::Rows4.fits(ty, rows) {
        Layout::Rows4
    } else {
        Layout::Gguf
    }
}

/// A one-line description for startup logs, e.g.
/// `kernel tier avx512vnni (available: scalar, avx2, avx512vnni)`, or the configuration error.
pub fn describe() -> String {
    let available: Vec<&str> = available_tiers().into_iter().map(Tier::name).collect();
    match configured_tier() {
        Ok(t) => format!("kernel tier {t} (available: {})", available.join(", ")),
        Err(e) => e.to_string(),
    }
}

/// One tile on `tier`, falling back to the scalar reference when the tier has no path.
fn run_block(tier: Tier, tile: &mut Tile<'_>) -> Result<(), KernelError> {
    let c = caps();
    let handled = match tier {
        Tier::Scalar => false,
        #[cfg(target_arch = "x86_64")]
        Tier::Avx2 => c.avx2.is_some_and(|t| t.gemm_block(tile)),
        #[cfg(target_arch = "x86_64")]
        Tier::Avx512Vnni => c.avx512vnni.is_some_and(|t| t.gemm_block(tile)),
        #[cfg(target_arch = "aarch64")]
        Tier::Neon => c.neon.is_some_and(|t| t.gemm_block(tile)),
        #[cfg(target_arch = "aarch64")]
        Tier::Dotprod => c.dotprod.is_some_and(|t| t.gemm_block(tile)),
        #[cfg(target_arch = "aarch64")]
        Tier::I8mm => c.i8mm.is_some_and(|t| t.gemm_block(tile)),
        #[allow(unreachable_patterns)]
        _ => {
            let _ = c;
            false
        }
    };
    if handled {
        Ok(())
    } else {
        scalar::gemm_block(tile)
    }
}

thread_local! {
    /// Reusable row-major result matrix for `gemm_with` (see there).
    static SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Rows per parallel task: about four tasks per thread, a multiple of 4 rows (so that 2- and
/// 4-row tiles stay whole), at least 4.
fn chunk_rows(m: usize, threads: usize) -> usize {
    let per = m.div_ceil(threads.max(1) * 4);
    per.div_ceil(4).max(1) * 4
}

/// [`crate::gemm`] on an explicit tier (for tests and benchmarks): `out[j * m + i] = W[i] . x[j]`.
/// Errors when the tier cannot run on this CPU, when the weight type has no dot product, or on
/// any length mismatch; never panics on bad input.
pub fn gemm_with(
    tier: Tier,
    w: QMatrix<'_>,
    x: &[u8],
    n: usize,
    out: &mut [f32],
    pool: Option<&rayon::ThreadPool>,
) -> Result<(), KernelError> {
    if !is_available(tier) {
        return Err(unavailable(tier));
    }
    let (ty, k, m) = (w.ty(), w.cols(), w.rows());
    if !ty.has_vec_dot() {
        return Err(KernelError::Unsupported {
            op: "gemm",
            ty: ty.name(),
        });
    }
    let x = QMatrix::activations(&w, x, n)?;
    let cells = m.checked_mul(n).ok_or_else(|| KernelError::Overflow {
        what: "gemm output",
        detail: format!("{m} x {n}"),
    })?;
    if out.len() != cells {
        return Err(KernelError::Elements {
            what: "gemm output",
            expected: cells,
            found: out.len(),
        });
    }
    if cells == 0 {
        return Ok(());
    }
    if k == 0 {
        // empty rows: every dot product is an empty sum (tiers never see k = 0)
        out.fill(0.0);
        return Ok(());
    }

    // Tiers write row-major tiles `tile[r * n + j]`; with one activation row that is already the
    // output layout, otherwise compute into a scratch matrix and transpose once at the end.
    // The scratch matrix comes from a per-thread cache and goes back afterwards, so steady-state
    // calls do not allocate (a nested call on the same thread just finds the cache empty).
    let mut scratch = if n == 1 {
        Vec::new()
    } else {
        SCRATCH.with(Cell::take)
    };
    scratch.clear();
    scratch.resize(if n == 1 { 0 } else { cells }, 0.0);
    let tiles: &mut [f32] = if n == 1 { out } else { &mut scratch };
    let rows_per = match pool {
        Some(p) => chunk_rows(m, p.current_num_threads()),
        None => m,
    };
    let work = |(ci, out): (usize, &mut [f32])| -> Result<(), KernelError> {
        let rows = w.row_range(ci * rows_per, out.len() / n)?;
        run_block(tier, &mut Tile::new(rows, x, out)?)
    };
    match pool {
        Some(p) if m > rows_per => p.install(|| {
            tiles
                .par_chunks_mut(rows_per * n)
                .enumerate()
                .try_for_each(work)
        })?,
        _ => tiles
            .chunks_mut(rows_per * n)
            .enumerate()
            .try_for_each(work)?,
    }
    if n != 1 {
        // output rows (activations) in tasks of whole 16-row blocks, like the GEMM's, once
        // there is enough to share
        let per = match pool {
            Some(p) if cells >= TRANSPOSE_SPLIT => n.div_ceil(p.current_num_threads() * 2),
            _ => n,
        }
        .div_ceil(TRANSPOSE_BLOCK)
            * TRANSPOSE_BLOCK;
        let task = |(t, dst): (usize, &mut [f32])| transpose_cols(&scratch, m, n, t * per, dst);
        match pool {
            Some(p) if n > per => {
                p.install(|| out.par_chunks_mut(per * m).enumerate().for_each(task))
            }
            _ => out.chunks_mut(per * m).enumerate().for_each(task),
        }
        SCRATCH.with(|c| c.set(scratch));
    }
    Ok(())
}

/// Side of the square blocks [`transpose_cols`] moves: 16 floats are one cache line, so each
/// block reads 16 whole source lines and writes 16 whole destination lines (a plain column
/// walk writes `n` lines `4 m` bytes apart per source row: with `m` a multiple of 1024 they
/// all fall into one L1 set).
const TRANSPOSE_BLOCK: usize = 16;
/// Output cells from which the transpose is shared across the pool.
const TRANSPOSE_SPLIT: usize = 1 << 16;

/// Columns `j0 ..` of the row-major `m x n` matrix `src`, transposed: `dst[jj * m + i] =
/// src[i * n + j0 + jj]` for the `dst.len() / m` columns from `j0`, in square blocks.
fn transpose_cols(src: &[f32], m: usize, n: usize, j0: usize, dst: &mut [f32]) {
    const B: usize = TRANSPOSE_BLOCK;
    let cols = dst.len() / m;
    for jb in (0..cols).step_by(B) {
        let jw = (cols - jb).min(B);
        for ib in (0..m).step_by(B) {
            let iw = (m - ib).min(B);
            let mut tile = [[0f32; B]; B];
            for (ii, t) in tile[..iw].iter_mut().enumerate() {
                t[..jw].copy_from_slice(&src[(ib + ii) * n + j0 + jb..][..jw]);
            }
            for jj in 0..jw {
                let d = &mut dst[(jb + jj) * m + ib..][..iw];
                for (ii, o) in d.iter_mut().enumerate() {
                    *o = tile[ii][jj];
                }
            }
        }
    }
}
