#!/usr/bin/env bash
# nightshift vs llama.cpp end to end (prefill 512 / decode 128, 2 threads) on Qwen3-30B-A3B-shaped
# gen-model files (cached in target/bench-models), with STREAM bandwidth and the decode roofline.
# Then llama-check: every tiny generated mix loads in llama.cpp and matches our logits.
set -euo pipefail
cd "$(dirname "$0")/../.."
source benches/scripts/ggml-env.sh
cargo build -p nightshift-benches --release --features ggml --bins
./target/release/e2e-report "$@"
./target/release/llama-check --gen-tiny target/bench-models/tiny
