#!/usr/bin/env bash
# The Rust workspace's tests (host target).
set -euo pipefail
cargo test --workspace --locked
