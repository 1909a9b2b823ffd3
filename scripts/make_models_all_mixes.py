"""Run shared/tools/make_models.py with every llama.cpp quant mix allowed in --quants.

make_models.py names only the mixes its shipped fixtures use (FTYPES: Q8_0, Q2_K, Q3_K_M, Q4_K_M,
Q5_K_M, Q6_K, F16); llama.cpp's quantizer takes every llama_ftype. This adds the others by their
gguf.LlamaFileType name (Q4_0, Q4_1, Q5_0, Q5_1, Q3_K_S, Q3_K_L, Q4_K_S, Q5_K_S, BF16, ...) and
runs make_models.main with the same arguments, so parity-sweep.sh can generate any mix without a
copy of the fixture-maker. It also teaches ggml_ref (the --expert-type path) ggml's types 39-42
(MXFP4, NVFP4, Q1_0, Q2_0: ggml_quantize_chunk writes them) and names llama.cpp's MOSTLY_Q2_0
(41), which gguf 0.19 lacks. Usage: python make_models_all_mixes.py SHARED_TOOLS_DIR <make_models args>
"""
import sys

import gguf

sys.path.insert(0, sys.argv.pop(1))
import ggml_ref  # noqa: E402  (from SHARED_TOOLS_DIR)
import make_models  # noqa: E402

for name, tid, block in (("MXFP4", 39, (32, 17)), ("NVFP4", 40, (64, 36)), ("Q1_0", 41, (128, 18)),
                         ("Q2_0", 42, (64, 18))):
    ggml_ref.TYPES.setdefault(name, tid)
    ggml_ref.BLOCK.setdefault(name, block)
    ggml_ref.VEC_DOT_TYPE.setdefault(name, "Q8_0")
make_models.FTYPES.setdefault("Q2_0", 41)

for ftype in gguf.LlamaFileType:
    if ftype.name.startswith("MOSTLY_") and ftype.name != "MOSTLY_F32":
        make_models.FTYPES.setdefault(ftype.name[len("MOSTLY_"):], int(ftype))

if __name__ == "__main__":
    make_models.main()
