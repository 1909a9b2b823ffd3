#!/usr/bin/env bash
# Arm performance evidence without Arm hardware: predicted cycles (llvm-mca, Neoverse N2 and V2
# scheduling models) and dynamic instruction counts (qemu) of nightshift's aarch64 GEMM tiers
# against ggml's kernels for the same work, plus a roofline per VM, in one Markdown report.
#
#   bash benches/arm/run.sh            # writes benches/arm/REPORT.md (every type, ~20 min)
#   ARM_K=1024 ARM_ROWS=64 bash benches/arm/run.sh
#   ARM_TYPES=q2_k,q3_k ARM_BATCHES=1,4 bash benches/arm/run.sh   # a subset (quick iterations)
#   ARM_TYPES=iq,fp4 bash benches/arm/run.sh   # groups: kquants, legacy, iq, fp4, all (default)
#   ARM_K=2048 ARM_ROWS=128 ARM_TYPES=kquants,legacy ARM_OUT=benches/arm/REPORT-expert-shape.md \
#     bash benches/arm/run.sh   # an expert's shape: per-call costs amortized as in the engine
#
# Batches: ARM_BATCHES for every type, else 1/2/4/8 for the K-quants, Q8_0 and Q4_0 and 1/4 for
# the rest (Q5_0/Q4_1/Q5_1, the i-quants, TQ1_0/TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0). ARM_JOBS: the
# parallel traces (default 2; 1 when other builds share the machine).
#
# What it does (see benches/arm/report.py for the method and README's benchmark section):
# 1. installs what it needs from Debian (llvm-19/clang-19 for llvm-mca with the N2/V2 models and
#    for cross-compiling ggml, the aarch64 cross libc/libstdc++, qemu-user);
# 2. cross-compiles ggml's ggml-cpu/arch/arm/{quants.c,repack.cpp} from the llama-cpp-sys-2
#    crate in the cargo registry (never copied into this repository) at -O3 -mcpu=neoverse-n2
#    and -mcpu=neoverse-v2, linked with benches/arm/ggml_trace.c;
# 3. builds nightshift-kernels' `arm_trace` example for aarch64 (release profile: the code that
#    ships);
# 4. traces every (type, tier or ggml path, batch) under qemu-aarch64 and runs llvm-mca on the
#    traced instruction streams (report.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
out_dir="$root/target/arm-report"
mkdir -p "$out_dir"

need=()
command -v llvm-mca-19 >/dev/null || need+=(llvm-19)
command -v clang-19 >/dev/null || need+=(clang-19)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
[ -d /usr/aarch64-linux-gnu/include/c++ ] || need+=(libstdc++-12-dev-arm64-cross)
if [ ${#need[@]} -gt 0 ]; then
  echo "--- installing ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
rustup target list --installed 2>/dev/null | grep -q aarch64-unknown-linux-gnu \
  || rustup target add aarch64-unknown-linux-gnu

# ggml's sources: the llama-cpp-sys-2 version pinned in Cargo.lock, from the cargo registry.
ver=$(awk '/^name = "llama-cpp-sys-2"/{getline; gsub(/version = |"/, ""); print; exit}' Cargo.lock)
cargo fetch --locked >/dev/null
ggml=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/llama-cpp-sys-2-"$ver"/llama.cpp/ggml | head -1)
[ -d "$ggml/src/ggml-cpu/arch/arm" ] || { echo "ggml sources not found for llama-cpp-sys-2 $ver" >&2; exit 1; }
echo "--- ggml from llama-cpp-sys-2 $ver ($ggml)"

for cpu in n2 v2; do
  mcpu=neoverse-$cpu
  flags=(--target=aarch64-linux-gnu -O3 -mcpu="$mcpu" -DNDEBUG -ffunction-sections
         -fdata-sections -I"$ggml/include" -I"$ggml/src" -I"$ggml/src/ggml-cpu")
  clang-19 "${flags[@]}" -std=gnu11 -c "$ggml/src/ggml-cpu/arch/arm/quants.c" -o "$out_dir/quants.$cpu.o"
  clang++-19 "${flags[@]}" -std=gnu++17 -c "$ggml/src/ggml-cpu/arch/arm/repack.cpp" -o "$out_dir/repack.$cpu.o"
  clang-19 "${flags[@]}" -std=gnu11 -c benches/arm/ggml_trace.c -o "$out_dir/ggml_trace.$cpu.o"
  # Static, and unused ggml functions dropped (they reference parts of ggml not compiled here).
  clang++-19 --target=aarch64-linux-gnu -static -Wl,--gc-sections "$out_dir/ggml_trace.$cpu.o" \
    "$out_dir/quants.$cpu.o" "$out_dir/repack.$cpu.o" -o "$out_dir/ggml_trace.$cpu"
done

echo "--- building nightshift-kernels' arm_trace example (aarch64, release)"
cargo build --locked -p nightshift-kernels --target aarch64-unknown-linux-gnu --release \
  --example arm_trace
ours="${CARGO_TARGET_DIR:-$root/target}/aarch64-unknown-linux-gnu/release/examples/arm_trace"

meta="nightshift $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- kernels || echo '+dirty'),"
meta+=" ggml from llama-cpp-sys-2 $ver, $(rustc --version | cut -d' ' -f1-2),"
meta+=" $(clang-19 --version | head -1), $(llvm-mca-19 --version | grep -m1 -o 'LLVM version [0-9.]*'),"
meta+=" $(qemu-aarch64 --version | head -1)."
echo "--- tracing and analysing (qemu + llvm-mca)"
# Baselines (earlier runs of the default shape) only where this run has that shape.
baselines=()
if [ -z "${ARM_K:-}${ARM_ROWS:-}" ]; then
  for b in benches/arm/baseline-*.json; do baselines+=(--baseline "$b"); done
fi
report="${ARM_OUT:-benches/arm/REPORT.md}"
json="$out_dir/results.json"
[ -z "${ARM_OUT:-}" ] || json="$out_dir/$(basename "$report" .md).json"
python3 benches/arm/report.py --ours "$ours" --ggml-n2 "$out_dir/ggml_trace.n2" \
  --ggml-v2 "$out_dir/ggml_trace.v2" --k "${ARM_K:-512}" --rows "${ARM_ROWS:-32}" \
  --jobs "${ARM_JOBS:-2}" --types "${ARM_TYPES:-all}" \
  --batches "${ARM_BATCHES:-auto}" --json "$json" --out "$report" \
  --meta "$meta" "${baselines[@]}"
