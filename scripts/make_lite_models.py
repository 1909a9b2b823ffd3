"""Tiny deepseek2 models shaped like DeepSeek-V2-Lite, with llama.cpp's expectations.

make_models.py writes deepseek2 as DeepSeek-V3 / Kimi K2 (q_lora, sigmoid routing with
exp_probs_b, normalised and scaled weights, one shared expert). DeepSeek-V2-Lite differs in every
one of those: no q_lora (one `attn_q` matrix), softmax routing without `exp_probs_b`, weights
neither normalised nor scaled, two shared experts. llama.cpp reads a deepseek2 file without
`attention.q_lora_rank` only when it has 26 or 27 layers (its `is_lite` test), so these files have
27. This takes make_models.py's deepseek2 F32 file and rewrites those parts (the rest, tokenizer
included, unchanged), then quantizes and records llama.cpp's logits with make_models.py's own
functions.

    python make_lite_models.py SHARED_TOOLS_DIR OUT_DIR [--seed N] [--quants Q4_K_M,...]
                               [--experts N] [--used N] [--prefix lite] [--keep-f32]
"""
import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import make_models_all_mixes  # noqa: E402,F401  (puts SHARED_TOOLS_DIR on the path, every mix in FTYPES)
import make_models  # noqa: E402
import gguf  # noqa: E402

DROP_TENSORS = ("attn_q_a.weight", "attn_q_a_norm.weight", "attn_q_b.weight", "exp_probs_b.bias")
N_SHARED = 2


def lite(f32_path, dst_path, seed):
    """Copy f32_path (make_models' deepseek2) to dst_path as a V2-Lite-shaped model."""
    src = gguf.GGUFReader(str(f32_path))
    arch = "deepseek2"
    w = gguf.GGUFWriter(str(dst_path), arch)
    overrides = {
        arch + ".expert_gating_func": int(gguf.ExpertGatingFuncType.SOFTMAX),
        arch + ".expert_weights_norm": False,
        arch + ".expert_weights_scale": 1.0,
        arch + ".expert_shared_count": N_SHARED,
    }
    for f in src.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue
        if f.name == arch + ".attention.q_lora_rank":
            continue
        value = overrides.get(f.name, f.contents())
        sub_type = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, value, f.types[0], sub_type=sub_type)
    meta = {f.name: f.contents() for f in src.fields.values()}
    heads = meta[arch + ".attention.head_count"]
    qk = meta[arch + ".attention.key_length_mla"]
    rng = np.random.default_rng([seed, 2])
    for t in src.tensors:
        if t.name.endswith(DROP_TENSORS):
            if t.name.endswith("attn_q_b.weight"):
                embd = meta[arch + ".embedding_length"]
                q = rng.standard_normal((heads * qk, embd)) / np.sqrt(embd)
                w.add_tensor(t.name.replace("attn_q_b", "attn_q"), q.astype(np.float32))
            continue
        data = np.asarray(t.data, dtype=np.float32)
        if "_shexp." in t.name:
            # N_SHARED experts side by side: llama.cpp's shexp width is n_ff_exp * n_expert_shared.
            axis = 1 if t.name.endswith("ffn_down_shexp.weight") else 0
            extra = rng.standard_normal(data.shape).astype(np.float32) / np.sqrt(data.shape[1])
            data = np.concatenate([data] + [extra] * (N_SHARED - 1), axis=axis)
            if axis == 1:
                data = data * np.float32(np.sqrt(1.0 / N_SHARED))
        w.add_tensor(t.name, data.astype(np.float32))
    make_models.finish(w)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--quants", default="Q4_K_M")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--used", type=int, default=2)
    p.add_argument("--prefix", default="lite")
    p.add_argument("--keep-f32", action="store_true", help="keep the F32 file, with its expectations")
    a = p.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    args = argparse.Namespace(seed=a.seed, layers=27, experts=a.experts, used=a.used, groups=1,
                              groups_used=1, router_gain=4.0, embd_scale=200.0)
    tokens, merges = make_models.train_bpe(make_models.CORPUS * 3, 400)
    name = "%s-deepseek2" % a.prefix
    v3 = out / (name + "-v3-F32.gguf")
    f32 = out / (name + "-F32.gguf")
    make_models.write_deepseek2(v3, args, tokens, merges)
    lite(v3, f32, a.seed)
    v3.unlink()
    try:
        for q in a.quants.split(","):
            if q:
                dst = out / ("%s-%s.gguf" % (name, q))
                make_models.quantize(f32, dst, q)
                make_models.expected(dst, out / ("%s-%s" % (name, q)))
        if a.keep_f32:
            make_models.expected(f32, out / (name + "-F32"))
    finally:
        if not a.keep_f32:
            f32.unlink()


if __name__ == "__main__":
    main()
