#!/usr/bin/env bash
# Ours vs ggml on Kimi K2 expert GEMMs (one thread). Builds llama.cpp's ggml from source once
# (llama-cpp-sys-2: cmake + libclang-dev) with this CPU's SIMD flags. Extra args go to the report.
set -euo pipefail
cd "$(dirname "$0")/../.."
source benches/scripts/ggml-env.sh
cargo run -p nightshift-benches --release --features ggml --bin kernel-report -- "$@"
