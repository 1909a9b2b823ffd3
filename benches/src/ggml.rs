//! ggml's CPU kernels, called the way ggml's non-repacked `mul_mat` path calls them: the type's
//! `vec_dot` from `ggml_get_type_traits_cpu`, one weight row × one activation row per call, over
//! 16×16 tiles of (weight rows, activation rows); activations quantized by the trait's
//! `from_float`. The extern items are declared here (they are linked from llama-cpp-sys-2's
//! static ggml-cpu library) so we do not depend on which items its bindgen run exposes.

use std::ffi::{c_int, c_void};

use nightshift_kernels::GgmlType;

// Keep llama-cpp-sys-2 (and its static libraries) in the link.
extern crate llama_cpp_sys_2;

type FromFloat = unsafe extern "C" fn(x: *const f32, y: *mut c_void, k: i64);
type VecDot = unsafe extern "C" fn(
    n: c_int,
    s: *mut f32,
    bs: usize,
    x: *const c_void,
    bx: usize,
    y: *const c_void,
    by: usize,
    nrc: c_int,
);

/// `struct ggml_type_traits_cpu` of ggml-cpu.h.
#[repr(C)]
struct TraitsCpu {
    from_float: Option<FromFloat>,
    vec_dot: Option<VecDot>,
    vec_dot_type: c_int,
    nrows: i64,
}

extern "C" {
    fn ggml_cpu_init();
    fn ggml_get_type_traits_cpu(ty: c_int) -> *const TraitsCpu;
    fn ggml_cpu_has_avx2() -> c_int;
    fn ggml_cpu_has_avx512() -> c_int;
    fn ggml_cpu_has_avx512_vnni() -> c_int;
    fn ggml_cpu_has_fma() -> c_int;
}

/// SIMD features ggml was compiled with, e.g. "AVX2 FMA AVX512 AVX512_VNNI".
pub fn compiled_features() -> String {
    // SAFETY: plain queries of compile-time constants, no arguments.
    let f = unsafe {
        [
            ("AVX2", ggml_cpu_has_avx2()),
            ("FMA", ggml_cpu_has_fma()),
            ("AVX512", ggml_cpu_has_avx512()),
            ("AVX512_VNNI", ggml_cpu_has_avx512_vnni()),
        ]
    };
    let on: Vec<&str> = f.iter().filter(|(_, v)| *v != 0).map(|(n, _)| *n).collect();
    if on.is_empty() {
        "baseline (no AVX2: build through benches/scripts/ggml-env.sh)".into()
    } else {
        on.join(" ")
    }
}

/// ggml's CPU functions for one weight type.
pub struct GgmlKernel {
    ty: GgmlType,
    vec_dot: VecDot,
    from_float: FromFloat,
    act_ty: GgmlType,
}

impl GgmlKernel {
    /// Looks the type up in ggml's CPU trait table (initialising ggml's CPU tables once).
    pub fn new(ty: GgmlType) -> Option<GgmlKernel> {
        // SAFETY: ggml_cpu_init is idempotent and thread-safe (guarded inside ggml); the traits
        // table is a static array indexed by a valid ggml type id, never freed.
        let t = unsafe {
            ggml_cpu_init();
            ggml_get_type_traits_cpu(ty.id() as c_int).as_ref()?
        };
        let act_ty = GgmlType::from_id(t.vec_dot_type as u32)?;
        // SAFETY: same table, looked up by the activation type's id.
        let a = unsafe { ggml_get_type_traits_cpu(act_ty.id() as c_int).as_ref()? };
        Some(GgmlKernel {
            ty,
            vec_dot: t.vec_dot?,
            from_float: a.from_float?,
            act_ty,
        })
    }

    /// Activation type ggml pairs with this weight type (must equal ours).
    pub fn act_type(&self) -> GgmlType {
        self.act_ty
    }

    /// Quantizes `n` activation rows of `k` with ggml's own (SIMD) `from_float`.
    pub fn quantize_acts(&self, x: &[f32], k: usize) -> Vec<u8> {
        let rb = self.act_ty.row_bytes(k).unwrap_or(0);
        let n = x.len() / k;
        let mut out = vec![0u8; n * rb];
        for (src, dst) in x.chunks_exact(k).zip(out.chunks_exact_mut(rb)) {
            // SAFETY: src holds k f32, dst exactly row_bytes(k) bytes of the activation type.
            unsafe { (self.from_float)(src.as_ptr(), dst.as_mut_ptr().cast(), k as i64) };
        }
        out
    }

    /// out[j*m + i] = W[i] . x[j], as ggml's mul_mat_one_chunk walks it (16×16 tiles).
    pub fn gemm(&self, k: usize, w: &[u8], m: usize, x: &[u8], n: usize, out: &mut [f32]) {
        let wrb = self.ty.row_bytes(k).unwrap_or(0);
        let xrb = self.act_ty.row_bytes(k).unwrap_or(0);
        assert!(
            w.len() >= m * wrb && x.len() >= n * xrb && out.len() >= m * n,
            "operand sizes"
        );
        const BLK: usize = 16;
        let mut tmp = [0f32; BLK];
        for j0 in (0..n).step_by(BLK) {
            for i0 in (0..m).step_by(BLK) {
                for j in j0..(j0 + BLK).min(n) {
                    let xr = x[j * xrb..].as_ptr().cast::<c_void>();
                    let i1 = (i0 + BLK).min(m);
                    for i in i0..i1 {
                        let wr = w[i * wrb..].as_ptr().cast::<c_void>();
                        // SAFETY: wr/xr point at whole rows of k elements of the types the
                        // function was looked up for (sizes asserted above); one result, nrc = 1.
                        unsafe { (self.vec_dot)(k as c_int, &mut tmp[i - i0], 0, wr, 0, xr, 0, 1) };
                    }
                    out[j * m + i0..j * m + i1].copy_from_slice(&tmp[..i1 - i0]);
                }
            }
        }
    }
}
