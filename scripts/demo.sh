#!/usr/bin/env bash
# The main job on the embedded default: builds NightShift (release), generates the demo model
# once (./demo/, a qwen3moe-shaped MoE in llama.cpp's GGUF layout) and serves it through the
# OpenAI-compatible gateway on http://127.0.0.1:8080 with a local cluster of expert-node
# processes (NIGHTSHIFT_NODES, default 2). Extra arguments go to `nightshift serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --build-only
cargo build --release --locked -p nightshift-coordinator -p nightshift-expert-node
exec target/release/nightshift serve --nodes "${NIGHTSHIFT_NODES:-2}" "$@"
