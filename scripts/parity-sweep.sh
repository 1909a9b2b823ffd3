#!/usr/bin/env bash
# Parity with llama.cpp on models the project has not seen: generates a matrix of tiny MoE files
# with llama.cpp's own quantizer and expectations (shared/tools/make_models.py: other seeds,
# shapes, quant mixes, i-quant and ternary experts) and, with --gen, `nightshift gen-model` files
# of other shapes (head counts and sizes, vocabularies, quantized or tied heads) whose
# expectations llama.cpp writes through `llama-check --fixtures`; then checks every file with
# model/tests/parity.rs's `parity_dir_sweep` (the shipped fixtures' code and tolerances, one line
# per file) under every kernel tier of this CPU.
#
#   scripts/parity-sweep.sh [--quick] [--gen] [--keep DIR] [--tiers auto,scalar,...] [--aarch64]
#                           [--crosscheck VENV] [--no-make]
#
# --quick: a handful of files (about a minute of generation); default: the broad matrix (~20 min).
# --keep DIR: generate into DIR and keep it (default: a temp dir, removed at the end).
# --no-make: no make_models.py files (with --keep DIR: check what DIR holds, plus --gen's files).
# --aarch64: also run the check under qemu-aarch64 (the aarch64 target must be installed).
# --crosscheck VENV: re-run the failing files under the llama.cpp of another venv (another build,
#   e.g. without FMA) with shared/tools/crosscheck.py: "NEAR-TIE" there means llama.cpp itself
#   moves by more than the tolerance on that file (noise, not an engine bug).
# The Python venv (numpy, gguf, llama-cpp-python: compiles llama.cpp, a few minutes, once) lives
# in $NIGHTSHIFT_PARITY_VENV (default ~/.cache/nightshift/parity-venv); the shared tools in
# $NIGHTSHIFT_SHARED (default: ../shared beside the checkout, else ../../shared).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
quick=0 make=1 gen=0 keep="" aarch64=0 tiers="" crosscheck=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --gen) gen=1 ;;
        --no-make) make=0 ;;
        --keep) keep="$2"; shift ;;
        --tiers) tiers="$2"; shift ;;
        --aarch64) aarch64=1 ;;
        --crosscheck) crosscheck="$2"; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
shared="${NIGHTSHIFT_SHARED:-}"
if [ -z "$shared" ]; then
    for d in "$root/../shared" "$root/../../shared"; do
        [ -f "$d/tools/make_models.py" ] && shared="$(cd "$d" && pwd)" && break
    done
fi
[ -n "$shared" ] || { echo "shared/tools/make_models.py not found: set NIGHTSHIFT_SHARED" >&2; exit 1; }
venv="${NIGHTSHIFT_PARITY_VENV:-$HOME/.cache/nightshift/parity-venv}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import numpy, gguf, llama_cpp" 2>/dev/null; then
    echo "--- building the venv $venv (llama-cpp-python compiles llama.cpp: a few minutes)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q numpy gguf
    if [ "$(uname -m)" = x86_64 ]; then
        # This CPU's SIMD options, but not GGML_NATIVE: -march=native turns on ggml's AMX
        # matmul, which crashes in llama_decode on these models (llama-cpp-python 0.3.36 on a
        # Sapphire Rapids; the shipped fixtures were made on a CPU without AMX).
        # shellcheck disable=SC1091
        source benches/scripts/ggml-env.sh
        CMAKE_ARGS="-DGGML_NATIVE=OFF"
        for v in GGML_AVX GGML_AVX2 GGML_FMA GGML_F16C GGML_BMI2 GGML_AVX_VNNI GGML_AVX512 \
            GGML_AVX512_VNNI GGML_AVX512_VBMI GGML_AVX512_BF16; do
            CMAKE_ARGS+=" -D$v=${!v}"
        done
        export CMAKE_ARGS
    fi
    "$venv/bin/pip" install -q --no-cache-dir llama-cpp-python
fi
py="$venv/bin/python"
if [ -n "$keep" ]; then
    out="$keep"; mkdir -p "$out"
else
    out="$(mktemp -d -t nightshift-parity-XXXXXX)"
    trap 'rm -rf "$out"' EXIT
fi
log="$out/generate.log"
: >"$log"

# One make_models.py run: files go to $out/<prefix>-*, expectations included.
mm() {
    local prefix="$1"; shift
    echo "--- make_models $prefix $*"
    if ! "$py" scripts/make_models_all_mixes.py "$shared/tools" "$out" --prefix "$prefix" "$@" >>"$log" 2>&1; then
        echo "make_models failed for $prefix $* (see $log):" >&2
        tail -3 "$log" >&2
        return 1
    fi
}

# F32 files (--keep-f32) carry no quantization noise: llama.cpp computes their matmuls in f32, so
# a formula difference shows there at any size while their quantized siblings' deltas are float
# noise amplified by 8-bit rounding flips (see README, "Parity on unseen inputs").
all_mixes=Q2_K,Q3_K_S,Q3_K_M,Q3_K_L,Q4_0,Q4_1,Q4_K_S,Q4_K_M,Q5_0,Q5_1,Q5_K_S,Q5_K_M,Q6_K,Q8_0,F16,BF16
if [ "$make" = 0 ]; then
    :
elif [ "$quick" = 1 ]; then
    mm q11 --seed 11 --quants Q3_K_S,Q4_0,Q5_K_S
    # (seeds 12 and 16 of this shape are near-ties under llama.cpp itself: its no-FMA build moves
    # by 3.0e-2 and 1.8e-2 there)
    mm e17 --seed 17 --experts 8 --used 2 --layers 4 --quants Q4_1 --quantize-output
    mm i13 --seed 13 --quants Q4_K_M --expert-type IQ3_S,TQ2_0 --expert-down-type IQ4_NL
else
    for seed in 11 12 13 14 15; do
        mm m$seed --seed "$seed" --quants "$all_mixes"
    done
    # llama.cpp's i-quant and ternary mixes (those it writes without an importance matrix)
    mm w41 --seed 41 --quants IQ4_NL,IQ4_XS,IQ3_S,IQ3_M,TQ1_0,TQ2_0
    # shapes
    mm x8 --seed 21 --experts 8 --used 1 --quants Q4_K_M,Q6_K
    mm x32 --seed 22 --experts 32 --used 8 --layers 4 --quants Q3_K_M,Q5_0 --keep-f32
    mm x64 --seed 23 --experts 64 --used 8 --groups 4 --groups-used 2 --layers 1 --which deepseek2 --quants Q4_K_S,Q8_0
    mm g64 --seed 24 --experts 64 --used 2 --groups 4 --groups-used 2 --layers 5 --which deepseek2 --quants Q2_K,Q5_K_M --keep-f32
    mm l1 --seed 25 --layers 1 --which qwen3moe --quants Q4_0,Q5_1
    mm qo --seed 26 --quantize-output --quants Q2_K,Q4_K_M,Q8_0
    # the embedding unscaled: noisier by design (make_models.py's docstring)
    mm es --seed 27 --embd-scale 1 --quants Q4_K_M,Q8_0 --keep-f32
    # routed experts in every i-quant and ternary type, changing from layer to layer
    mm i1 --seed 31 --expert-type IQ1_S,IQ1_M --expert-down-type IQ2_XXS
    mm i2 --seed 32 --expert-type IQ2_XS,IQ2_S --expert-down-type IQ3_XXS
    mm i3 --seed 33 --expert-type IQ3_S,IQ4_NL --expert-down-type IQ4_XS
    mm i4 --seed 34 --expert-type TQ1_0,TQ2_0 --expert-down-type IQ1_M
    mm i5 --seed 35 --expert-type TQ2_0 --quants Q5_K_M
    mm i6 --seed 36 --expert-type IQ4_XS,IQ3_XXS --expert-down-type TQ1_0,IQ2_S --quants Q3_K_S
    # ggml's newest types: llama.cpp's MXFP4_MOE and Q2_0 mixes, Q1_0 (qwen3moe only: llama.cpp
    # has no fallback for deepseek2's 64-wide attn_k_b rows), NVFP4 experts (llama.cpp's
    # quantizer has no NVFP4 mix)
    mm f1 --seed 61 --quants MXFP4_MOE,Q2_0
    mm f2 --seed 65 --which qwen3moe --quants Q1_0
    mm f3 --seed 66 --experts 8 --used 2 --layers 4 --quants MXFP4_MOE --quantize-output
    mm f4 --seed 67 --expert-type NVFP4,Q1_0 --expert-down-type MXFP4 --quants Q4_K_M
    # DeepSeek-V2-Lite's shape: no q_lora, softmax routing, two shared experts, 27 layers
    echo "--- make_lite_models"
    "$py" scripts/make_lite_models.py "$shared/tools" "$out" --seed 51 --quants Q4_K_M,Q8_0 --keep-f32 >>"$log" 2>&1 ||
        { echo "make_lite_models failed (see $log)" >&2; exit 1; }
fi

if [ "$gen" = 1 ]; then
    # gen-model shapes make_models.py does not write, expectations by llama.cpp via llama-check.
    # shellcheck disable=SC1091
    source benches/scripts/ggml-env.sh
    cargo build -q -p nightshift-benches --features ggml --bin llama-check
    cargo build -q -p nightshift-coordinator --bin nightshift
    g() {
        local name="$1"; shift
        echo "--- gen-model $name $*"
        target/debug/nightshift gen-model "$@" -o "$out/$name.gguf" >>"$log" 2>&1
        target/debug/llama-check --fixtures "$out" "$out/$name.gguf" >>"$log" 2>&1
    }
    for arch in qwen3moe deepseek2 qwen3 llama; do
        for q in Q2_K Q4_K_M Q8_0 F16; do
            g "g-$arch-v777-$q" --preset tiny --arch "$arch" --seed 41 --vocab 777 --quant "$q" --leave-output-tensor
        done
        g "g-$arch-qhead" --preset tiny --arch "$arch" --seed 42 --quant Q4_K_M
    done
    for arch in qwen3moe deepseek2; do
        for q in UD-IQ1_S UD-IQ2_XXS UD-Q2_K_XL; do
            g "g-$arch-v1500-$q" --preset tiny --arch "$arch" --seed 43 --vocab 1500 --quant "$q" --leave-output-tensor
        done
    done
    [ "$quick" = 1 ] || g g-qwen3-30b-a3b --preset qwen3-30b-a3b --layers 2 --experts 8 --vocab 2048 --quant Q4_K_M --leave-output-tensor
fi

echo "--- $(ls "$out"/*.expected.json | wc -l) files in $out; checking"
cargo test -q -p nightshift-model --test parity --no-run
status=0
[ -n "$tiers" ] || tiers="$(grep -q avx512_vnni /proc/cpuinfo 2>/dev/null && echo auto,scalar,avx2 || echo auto,scalar)"
for tier in ${tiers//,/ }; do
    echo "--- NIGHTSHIFT_KERNEL=$tier"
    NIGHTSHIFT_KERNEL="$tier" NIGHTSHIFT_PARITY_DIR="$out" \
        cargo test -q -p nightshift-model --test parity parity_dir_sweep -- --ignored --nocapture 2>&1 |
        sed -n '/^parity_dir_sweep:/,/^test result/p' | tee "$out/check-$tier.txt" || status=1
done
if [ "$aarch64" = 1 ]; then
    echo "--- aarch64 under qemu"
    NIGHTSHIFT_PARITY_DIR="$out" cargo test -q -p nightshift-model --test parity \
        --target aarch64-unknown-linux-gnu parity_dir_sweep -- --ignored --nocapture 2>&1 |
        sed -n '/^parity_dir_sweep:/,/^test result/p' | tee "$out/check-aarch64.txt" || status=1
fi
# A file can fail because llama.cpp itself sits on a near-tie there (an expert choice or an 8-bit
# rounding that float noise flips): re-run llama.cpp on the failing files under a second build
# (e.g. one without FMA, see shared/README.md) and see whether it moves as far.
if [ -n "$crosscheck" ]; then
    failed=$(sed -n 's/^FAIL \([^:]*\):.*/\1/p' "$out"/check-*.txt | sort -u)
    if [ -n "$failed" ]; then
        echo "--- crosscheck of the failing files under $crosscheck"
        # shellcheck disable=SC2046
        "$crosscheck/bin/python" "$shared/tools/crosscheck.py" $(for f in $failed; do echo "$out/$f"; done) 2>/dev/null |
            grep 'max|diff|' || true
    fi
fi
exit $status
