#!/usr/bin/env bash
# The official `openai` Python package against a real `nightshift serve` on loopback
# (coordinator/tests/python/test_openai.py). Builds the binary, starts the server on a free
# port with an API key, waits for /ready, runs the tests, stops the server.
# NIGHTSHIFT_OPENAI_MODEL=FILE.gguf serves that model; the default is the built-in toy model
# (`--mock`), which checks the HTTP/OpenAI layer without the engine.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "40-openai: $PY missing (run scripts/setup.sh)"; exit 1; }
cargo build -q -p nightshift-coordinator --bin nightshift
BIN="${CARGO_TARGET_DIR:-target}/debug/nightshift"
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
KEY="test-key-$RANDOM"
LOG=$(mktemp)
if [ -n "${NIGHTSHIFT_OPENAI_MODEL:-}" ]; then
  MODEL_ARGS=(--model "$NIGHTSHIFT_OPENAI_MODEL" --model-name test-model)
else
  MODEL_ARGS=(--mock --model-name test-model)
fi
"$BIN" serve "${MODEL_ARGS[@]}" --host 127.0.0.1 --port "$PORT" --api-key "$KEY" --ctx 512 --drain 5 >"$LOG" 2>&1 &
SERVER=$!
cleanup() { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; rm -f "$LOG"; }
trap cleanup EXIT
ready=0
for _ in $(seq 1 300); do
  if "$PY" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/ready', timeout=1)" 2>/dev/null; then
    ready=1; break
  fi
  kill -0 "$SERVER" 2>/dev/null || break
  sleep 0.2
done
if [ "$ready" != 1 ]; then
  echo "40-openai: the server did not become ready; its output:"; cat "$LOG"; exit 1
fi
NIGHTSHIFT_URL="http://127.0.0.1:$PORT" NIGHTSHIFT_MODEL=test-model NIGHTSHIFT_API_KEY="$KEY" \
  "$PY" coordinator/tests/python/test_openai.py
