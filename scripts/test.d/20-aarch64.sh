#!/usr/bin/env bash
# The aarch64 SIMD tiers: cross-compiles nightshift-kernels' tests for aarch64-unknown-linux-gnu
# and runs them under `qemu-aarch64 -cpu max -L /usr/aarch64-linux-gnu` (the runner is set in
# .cargo/config.toml). The whole kernels suite runs once per forced tier (NIGHTSHIFT_KERNEL),
# and the tier tests (kernels/tests/aarch64_*.rs) check NEON, dotprod and i8mm against the
# scalar reference directly; the attention tests (kernels::attn: the portable body Arm runs, bit
# for bit against the plain one-head computation) are part of that suite. qemu is slow:
# proptest case counts are kept modest.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PROPTEST_CASES="${PROPTEST_CASES:-32}"
export NIGHTSHIFT_EXPECT_ALL_ARM_TIERS=1
target=aarch64-unknown-linux-gnu
# Tests that re-run the test binary as a child process cannot work under qemu-user without
# binfmt_misc (the emulated exec of an aarch64 binary fails): skipped here, they run natively.
skip=(--skip forced_tier_reaches_gemm)
cargo test -p nightshift-kernels --locked --target "$target" --no-run
for tier in neon dotprod i8mm; do
  echo "--- nightshift-kernels on aarch64, NIGHTSHIFT_KERNEL=${tier}"
  NIGHTSHIFT_KERNEL="$tier" cargo test -p nightshift-kernels --locked --target "$target" -- "${skip[@]}"
done
