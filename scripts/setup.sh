#!/usr/bin/env bash
# Installs everything the build and the tests need on a fresh Debian machine with rustup.
# Idempotent: a second run installs nothing. `--build-only` installs just what building needs
# (the demo uses that); without it, also the aarch64 cross tools, qemu and the Python test venv.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
BUILD_PKGS=(libhwloc-dev libudev-dev hwloc pkg-config)
TEST_PKGS=(qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross python3-venv jq openssl iproute2)
APT_PKGS=("${BUILD_PKGS[@]}")
[ "${1:-}" = "--build-only" ] || APT_PKGS+=("${TEST_PKGS[@]}")
missing=()
for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
[ "${1:-}" = "--build-only" ] && exit 0
rustup target list --installed | grep -q aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q -r scripts/requirements-test.txt
