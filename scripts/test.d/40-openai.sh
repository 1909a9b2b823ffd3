#!/usr/bin/env bash
# The official `openai` Python package (chat, completions, the Responses API) and the official
# `anthropic` package (the Messages API) against a real `nightshift serve` on loopback
# (coordinator/tests/python/test_openai.py). Builds the binary, starts the server on a free
# port with an API key, waits for /ready, runs the tests, stops the server.
# Runs twice: on the tiny qwen3moe fixture (real engine, tokenizer and chat template) and on the
# built-in toy model (`--mock`, HTTP/OpenAI layer alone). NIGHTSHIFT_OPENAI_MODEL=FILE.gguf
# replaces the fixture.
# Then, for tools and structured outputs over all three APIs (coordinator/tests/python/test_tools.py,
# with `openai-agents` on its chat and Responses models, `anthropic` and `jsonschema`): one tiny random model per published chat template
# (model/tests/data/templates: Qwen3, Qwen3 Thinking-2507, Qwen3-Coder, Kimi K2, Kimi-K2-Thinking, DeepSeek V3.1,
# DeepSeek-V3, DeepSeek-R1's, DeepSeek-V3.2's, GLM-4.6's on a qwen3moe model), made by `gen-model --chat-template`; NIGHTSHIFT_TOOL_TEMPLATES=NAME:ARCH ...
# picks some.
# And the OpenAPI document (GET /openapi.json) with schemathesis fuzzing the live server from it
# (coordinator/tests/python/test_openapi.py): no 5xx, every answer as documented.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "40-openai: $PY missing (run scripts/setup.sh)"; exit 1; }
cargo build -q --workspace --bins --locked
BIN="${CARGO_TARGET_DIR:-target}/debug/nightshift"
CURRENT_SERVER=""
# (an `a && b` whose b fails would trip errexit inside the trap and fail the whole script)
trap 'if [ -n "$CURRENT_SERVER" ]; then kill "$CURRENT_SERVER" 2>/dev/null || true; fi' EXIT
run_suite() { # $1 = label, rest = model args
  local label=$1; shift
  local URL KEY LOG SERVER ready
  KEY="test-key-$RANDOM"
  LOG=$(mktemp)
  # port 0: the server binds a free port itself and prints it, so no other socket can take the
  # port between a pick and the bind
  "$BIN" serve "$@" --model-name test-model --host 127.0.0.1 --port 0 --api-key "$KEY" --ctx "${CTX:-512}" --drain 5 >"$LOG" 2>&1 &
  SERVER=$!
  CURRENT_SERVER=$SERVER
  ready=0
  URL=
  for _ in $(seq 1 300); do
    [ -n "$URL" ] || URL=$(sed -n 's|^nightshift serve: listening on \(http://[^ ]*\).*|\1|p' "$LOG" | head -n1)
    if [ -n "$URL" ] && "$PY" -c "import urllib.request; urllib.request.urlopen('$URL/ready', timeout=1)" 2>/dev/null; then
      ready=1; break
    fi
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.2
  done
  local rc=0
  if [ "$ready" != 1 ]; then
    echo "40-openai ($label): the server did not become ready; its output:"; cat "$LOG"; rc=1
  else
    echo "40-openai: $label"
    NIGHTSHIFT_URL="$URL" NIGHTSHIFT_MODEL=test-model NIGHTSHIFT_API_KEY="$KEY" NIGHTSHIFT_TEMPLATE="${NIGHTSHIFT_TEMPLATE:-}" \
      "$PY" "coordinator/tests/python/${SUITE:-test_openai.py}" || rc=1
    if [ "$rc" != 0 ]; then echo "40-openai ($label): the server's last output:"; tail -n 40 "$LOG"; fi
  fi
  kill "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  CURRENT_SERVER=
  rm -f "$LOG"
  return $rc
}
MODEL_FILE=${NIGHTSHIFT_OPENAI_MODEL:-model/tests/data/tiny-qwen3moe-Q2_K.gguf}
status=0
run_suite "model $MODEL_FILE" --model "$MODEL_FILE" || status=1
run_suite "toy model (--mock)" --mock || status=1
# the OpenAPI document, and schemathesis fuzzing the live server from it (bounded)
SUITE=test_openapi.py run_suite "OpenAPI + schemathesis: model $MODEL_FILE" --model "$MODEL_FILE" || status=1
SUITE=test_openapi.py run_suite "OpenAPI + schemathesis: toy model" --mock || status=1
GEN_DIR=$(mktemp -d)
for t in ${NIGHTSHIFT_TOOL_TEMPLATES:-qwen3-30b-a3b:qwen3moe qwen3-thinking-2507:qwen3moe qwen3-coder-30b-a3b:qwen3moe kimi-k2-instruct:deepseek2 kimi-k2-thinking:deepseek2 deepseek-v3.1:deepseek2 deepseek-v3:deepseek2 deepseek-r1-distill:deepseek2 deepseek-v3.2:deepseek2 glm-4.6:qwen3moe}; do
  name=${t%%:*}
  tmpl="model/tests/data/templates/$name.jinja"
  "$BIN" gen-model --preset tiny --arch "${t##*:}" --chat-template "$tmpl" --ctx 4096 -o "$GEN_DIR/$name.gguf" 2>/dev/null
  SUITE=test_tools.py CTX=2048 NIGHTSHIFT_TEMPLATE="$tmpl" run_suite "tools: $name template" \
    --model "$GEN_DIR/$name.gguf" || status=1
done
rm -rf "$GEN_DIR"
exit $status
