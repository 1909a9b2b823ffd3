"""Run shared/tools/make_models.py with every llama.cpp quant mix allowed in --quants.

make_models.py names only the mixes its shipped fixtures use (FTYPES: Q8_0, Q2_K, Q3_K_M, Q4_K_M,
Q5_K_M, Q6_K, F16); llama.cpp's quantizer takes every llama_ftype. This adds the others by their
gguf.LlamaFileType name (Q4_0, Q4_1, Q5_0, Q5_1, Q3_K_S, Q3_K_L, Q4_K_S, Q5_K_S, BF16, ...) and
runs make_models.main with the same arguments, so parity-sweep.sh can generate any mix without a
copy of the fixture-maker. Usage: python make_models_all_mixes.py SHARED_TOOLS_DIR <make_models args>
"""
import sys

import gguf

sys.path.insert(0, sys.argv.pop(1))
import make_models  # noqa: E402  (from SHARED_TOOLS_DIR)

for ftype in gguf.LlamaFileType:
    if ftype.name.startswith("MOSTLY_") and ftype.name != "MOSTLY_F32":
        make_models.FTYPES.setdefault(ftype.name[len("MOSTLY_"):], int(ftype))

if __name__ == "__main__":
    make_models.main()
