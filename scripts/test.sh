#!/usr/bin/env bash
# The whole test suite: installs what it needs (scripts/setup.sh), then runs every part in
# scripts/test.d/ in order. Usage: bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
failed=0
for part in scripts/test.d/*.sh; do
  echo "=== ${part} ==="
  if ! bash "$part"; then
    echo "FAILED: ${part}"
    failed=1
  fi
done
exit $failed
