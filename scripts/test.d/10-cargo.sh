#!/usr/bin/env bash
# The Rust workspace's tests (host target). Every binary is built first, with the same feature
# set the other parts use (`cargo build --workspace --bins`), so integration tests that start
# `nightshift-expert-node` / `nightshift-atlas` use them as they are (NIGHTSHIFT_PREBUILT_BINS)
# instead of rebuilding them with another feature set.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --workspace --bins --locked
# As root the multi-host tests (network namespaces) must run, not skip.
[ "$(id -u)" -ne 0 ] || export NIGHTSHIFT_REQUIRE_NETNS=1
NIGHTSHIFT_PREBUILT_BINS=1 cargo test --workspace --locked
# The AVX-512 tier's builds for CPUs without VBMI (Q2_K's table lookup, the Q3_K..Q6_K fallback to
# the 32-byte kernels), on this (possibly VBMI) machine.
if grep -q avx512vbmi /proc/cpuinfo 2>/dev/null; then
    NIGHTSHIFT_X86_VBMI=off cargo test -p nightshift-kernels --locked --test x86_tiers
fi
