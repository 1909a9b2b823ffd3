"""Golden vectors from ggml for MXFP4, NVFP4, Q1_0 and Q2_0 (the files of ../golden-iq, same
manifest.json format), through ctypes into a llama-cpp-python wheel's libggml.

    GGML_LIB_DIR=<no-FMA, no-SIMD build>/llama_cpp/lib python gen.py OUT_DIR
    GGML_LIB_DIR=<native build>/llama_cpp/lib python gen.py OUT_DIR --native-pass

The first pass writes the float rows, ggml's quantized weights (ggml_quantize_chunk, no importance
matrix: all four reference quantizers ignore it), ggml's dequantized rows, the Q8_0 activations
(quantize_row_q8_0_ref) and `dot_ref`, ggml's generic dot products. Where the wheel exports no
`_generic` symbol (Q2_0 has no SIMD version on x86, so ggml names its generic function without the
suffix) the plain symbol is used, which is why the first pass must load a build without SIMD or
FMA; the manifest records which symbol gave each array. The second pass adds `dot_ggml_native`,
what a native build's SIMD functions give for the same bytes.
"""
import argparse
import ctypes
import json
import os
import pathlib

import numpy as np

KINDS = {  # name: (ggml type id, elements per block, bytes per block)
    "MXFP4": (39, 32, 17),
    "NVFP4": (40, 64, 36),
    "Q1_0": (41, 128, 18),
    "Q2_0": (42, 64, 18),
}
Q8_0 = (8, 32, 34)


class _Traits(ctypes.Structure):  # struct ggml_type_traits (ggml.h)
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


class _TraitsCpu(ctypes.Structure):  # struct ggml_type_traits_cpu (ggml-cpu.h)
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


def _open(d, name):
    # the wheel has name and name.0 as two copies; libllama loads the .0 (its soname)
    p = d / (name + ".0")
    return ctypes.CDLL(str(p if p.exists() else d / name), mode=ctypes.RTLD_GLOBAL)


class Ggml:
    def __init__(self):
        d = os.environ.get("GGML_LIB_DIR")
        if not d:
            raise SystemExit("set GGML_LIB_DIR to the llama_cpp/lib directory of a wheel")
        d = pathlib.Path(d)
        self.base = _open(d, "libggml-base.so")
        self.cpu = _open(d, "libggml-cpu.so")
        self.cpu.ggml_cpu_init()
        self.base.ggml_get_type_traits.restype = ctypes.POINTER(_Traits)
        self.cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_TraitsCpu)
        self.base.ggml_quantize_chunk.restype = ctypes.c_size_t
        self.base.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                                  ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                                  ctypes.c_void_p]
        self.base.ggml_validate_row_data.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        self.base.ggml_validate_row_data.restype = ctypes.c_bool

    def check(self, kind):
        tid, bl, bb = KINDS[kind]
        t = self.base.ggml_get_type_traits(tid).contents
        c = self.cpu.ggml_get_type_traits_cpu(tid).contents
        got = (t.type_name.decode(), t.blck_size, t.type_size, c.vec_dot_type)
        if got != (kind.lower(), bl, bb, Q8_0[0]):
            raise SystemExit("the library disagrees about %s: %s" % (kind, got))

    def _rowfn(self, lib, name):
        f = getattr(lib, name)
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        f.restype = None
        return f

    def quantize(self, kind, rows):
        tid, bl, bb = KINDS[kind]
        n, k = rows.shape
        out = np.zeros((n, k // bl * bb), dtype=np.uint8)
        self.base.ggml_quantize_chunk(tid, rows.ctypes.data, out.ctypes.data, 0, n, k, None)
        if not self.base.ggml_validate_row_data(tid, out.ctypes.data, out.nbytes):
            raise SystemExit("ggml_validate_row_data rejects the %s rows ggml wrote" % kind)
        return out

    def dequantize(self, kind, q, k):
        f = self._rowfn(self.base, "dequantize_row_" + kind.lower())
        out = np.zeros((q.shape[0], k), dtype=np.float32)
        for i in range(q.shape[0]):
            f(q[i].ctypes.data, out[i].ctypes.data, k)
        return out

    def quantize_q8_0(self, rows):
        f = self._rowfn(self.base, "quantize_row_q8_0_ref")
        n, k = rows.shape
        out = np.zeros((n, k // 32 * 34), dtype=np.uint8)
        for i in range(n):
            f(rows[i].ctypes.data, out[i].ctypes.data, k)
        return out

    def vec_dot(self, kind, wq, xq, k, generic):
        """One float per (weight row, activation row) and the symbol that computed it."""
        name = "ggml_vec_dot_%s_q8_0" % kind.lower()
        if generic and hasattr(self.cpu, name + "_generic"):
            name += "_generic"
        f = getattr(self.cpu, name)
        f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                      ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        f.restype = None
        out = np.zeros((wq.shape[0], xq.shape[0]), dtype=np.float32)
        s = np.zeros(1, dtype=np.float32)
        for i in range(wq.shape[0]):
            for j in range(xq.shape[0]):
                f(k, s.ctypes.data, 0, wq[i].ctypes.data, 0, xq[j].ctypes.data, 0, 1)
                out[i, j] = s[0]
        return out, name


def weight_rows(rng, rows, k):
    """Plain, tiny, outliers, zeros, uniform, constant, one-signed, large; row 8 on: subnormal
    and huge blocks (E8M0 and UE4M3 at their ends)."""
    out = np.empty((rows, k), dtype=np.float32)
    for i in range(rows):
        kind = i % 10
        if kind == 0:
            r = rng.standard_normal(k)
        elif kind == 1:
            r = rng.standard_normal(k) * 1e-3
        elif kind == 2:
            r = rng.standard_normal(k) * 0.02
            r[rng.choice(k, size=k // 64, replace=False)] *= 200.0
        elif kind == 3:
            r = np.zeros(k)
        elif kind == 4:
            r = rng.uniform(-1, 1, k)
        elif kind == 5:
            r = np.full(k, 0.37)
        elif kind == 6:
            r = np.abs(rng.standard_normal(k))
        elif kind == 7:
            r = rng.standard_normal(k) * 30.0
        elif kind == 8:
            r = rng.standard_normal(k) * 1e-6
        else:
            r = rng.standard_normal(k) * 500.0
        out[i] = r
    return out


def act_rows(rng, acts, k):
    out = rng.standard_normal((acts, k)).astype(np.float32)
    if acts > 1:
        out[1] *= 1e-2
    if acts > 2:
        out[2, : k // 2] = 0.0
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("--rows", type=int, default=10)
    p.add_argument("--acts", type=int, default=4)
    p.add_argument("--native-pass", action="store_true")
    p.add_argument("--build", default=os.environ.get("GGML_BUILD", ""), help="text for the manifest")
    a = p.parse_args()
    g = Ggml()
    out = pathlib.Path(a.out)
    for kind in KINDS:
        g.check(kind)
    if a.native_pass:
        m = json.loads((out / "manifest.json").read_text())
        m["ggml_native_build"] = a.build
        for kind, entry in m["kinds"].items():
            arr = entry["arrays"]
            wq = np.fromfile(out / arr["w_q"]["file"], dtype=np.uint8).reshape(arr["w_q"]["shape"])
            xq = np.fromfile(out / arr["x_q"]["file"], dtype=np.uint8).reshape(arr["x_q"]["shape"])
            dot, name = g.vec_dot(kind, wq, xq, m["k"], generic=False)
            fn = "%s.dot_ggml_native.bin" % kind
            dot.tofile(out / fn)
            arr["dot_ggml_native"] = {"file": fn, "dtype": "float32", "shape": list(dot.shape)}
            entry["vec_dot_native"] = name
        (out / "manifest.json").write_text(json.dumps(m, indent=1) + "\n")
        return
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    w, x = weight_rows(rng, a.rows, a.k), act_rows(rng, a.acts, a.k)
    m = {"k": a.k, "rows": a.rows, "acts": a.acts, "seed": a.seed, "ggml_build": a.build,
         "shared_inputs": True, "kinds": {}}
    files = {}

    def put(fn, arr):
        np.ascontiguousarray(arr).tofile(out / fn)
        files[fn] = {"file": fn, "dtype": str(arr.dtype), "shape": list(arr.shape)}
        return files[fn]

    wf, xf = put("w_f32.bin", w), put("x_f32.bin", x)
    xq = g.quantize_q8_0(x)
    xqf = put("x_q8_0.bin", xq)
    for kind, (_, bl, bb) in KINDS.items():
        wq = g.quantize(kind, w)
        dot, name = g.vec_dot(kind, wq, xq, a.k, generic=True)
        m["kinds"][kind] = {
            "activation_type": "Q8_0", "block_elements": bl, "block_bytes": bb,
            "activation_block_bytes": Q8_0[2], "quantized_with_imatrix": False, "vec_dot": name,
            "arrays": {"w_f32": wf, "w_q": put("%s.w_q.bin" % kind, wq),
                       "w_deq": put("%s.w_deq.bin" % kind, g.dequantize(kind, wq, a.k)),
                       "x_f32": xf, "x_q": xqf, "dot_ref": put("%s.dot_ref.bin" % kind, dot)},
        }
    (out / "manifest.json").write_text(json.dumps(m, indent=1) + "\n")


if __name__ == "__main__":
    main()
