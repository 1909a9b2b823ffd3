#!/usr/bin/env bash
# Real coding agents against a real `nightshift serve`: OpenAI's Codex CLI over the Responses API
# and Anthropic's Claude Code over the Messages API, each running one non-interactive turn
# (`codex exec`, `claude -p`). Both agents come from npm (installed into a temporary prefix, or
# AGENTS_PREFIX to reuse one); the model is a tiny random-weight file with Qwen3-Coder's chat
# template and a 128k context (NIGHTSHIFT_AGENT_MODEL=FILE.gguf to use your own), so what is
# checked is the protocol: each agent finishes its turn without an API error. A random-weight
# model never ends its turn by itself, so every answer runs to the agent's token limit. Claude
# Code reports that limit as an error of its own ("exceeded the N output token maximum") after
# reading the whole answer; the check accepts it only with no API error and tokens counted both
# ways, so Claude Code's JSON result is checked, not its exit status. Not part of the test
# command (it downloads the agents and prefills their 27k-80k-token prompts).
#   bash scripts/agents-smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v npm >/dev/null || { echo "agents-smoke: npm is needed (apt-get install -y npm)"; exit 1; }
WORK=$(mktemp -d)
SERVER=""
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
PREFIX=${AGENTS_PREFIX:-$WORK/agents}
if [ ! -x "$PREFIX/node_modules/.bin/codex" ] || [ ! -x "$PREFIX/node_modules/.bin/claude" ]; then
  npm install --silent --no-audit --no-fund --prefix "$PREFIX" @openai/codex @anthropic-ai/claude-code
fi
cargo build -q --release --bin nightshift
BIN=target/release/nightshift
MODEL=${NIGHTSHIFT_AGENT_MODEL:-$WORK/agent.gguf}
if [ -z "${NIGHTSHIFT_AGENT_MODEL:-}" ]; then
  "$BIN" gen-model --preset tiny --arch qwen3moe --ctx 131072 -o "$MODEL" \
    --chat-template model/tests/data/templates/qwen3-coder-30b-a3b.jinja >/dev/null
fi
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
KEY="agents-$RANDOM"
# Claude Code names its models itself: let its main and small model names through
"$BIN" serve --model "$MODEL" --model-name local --host 127.0.0.1 --port "$PORT" --api-key "$KEY" \
  --ctx 131072 --model-alias claude-sonnet-4-5 --model-alias claude-haiku-4-5 >"$WORK/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null && break
  kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/server.log"; exit 1; }
  sleep 0.2
done
status=0

mkdir -p "$WORK/codex"
cat >"$WORK/codex/config.toml" <<EOF
model = "local"
model_provider = "nightshift"

[model_providers.nightshift]
name = "nightshift"
base_url = "http://127.0.0.1:$PORT/v1"
wire_api = "responses"
env_key = "NIGHTSHIFT_KEY"
EOF
echo "agents-smoke: codex exec (Responses API)"
if (cd "$WORK" && CODEX_HOME="$WORK/codex" NIGHTSHIFT_KEY="$KEY" timeout 900 \
    "$PREFIX/node_modules/.bin/codex" exec --skip-git-repo-check "say hi" \
    >"$WORK/codex.out" 2>&1) && grep -aq "tokens used" "$WORK/codex.out"; then
  echo "  ok: $(grep -a -A1 'tokens used' "$WORK/codex.out" | tail -1) tokens"
else
  echo "  FAILED:"; tail -20 "$WORK/codex.out"; status=1
fi

echo "agents-smoke: claude -p (Messages API)"
if (cd "$WORK" && HOME="$WORK" ANTHROPIC_BASE_URL="http://127.0.0.1:$PORT" ANTHROPIC_API_KEY="$KEY" \
    ANTHROPIC_MODEL=claude-sonnet-4-5 ANTHROPIC_SMALL_FAST_MODEL=claude-haiku-4-5 \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 CLAUDE_CODE_MAX_OUTPUT_TOKENS=256 \
    timeout 1800 "$PREFIX/node_modules/.bin/claude" -p "say hi" --output-format json --max-turns 1 \
    >"$WORK/claude.out" 2>&1 || true) && python3 -c '
import json, re, sys
r = json.load(open(sys.argv[1]))
u = r.get("usage", {})
assert r.get("api_error_status") is None, r
assert u.get("input_tokens", 0) + u.get("cache_read_input_tokens", 0) > 0 and u.get("output_tokens", 0) > 0, r
if r.get("is_error"):
    # the one error a random model causes: its answer reached the limit the agent set
    assert re.fullmatch(r"API Error: Claude.s response exceeded the \d+ output token maximum\..*",
                        r.get("result", ""), re.S), r
    print("  ok (answer ran to the token limit, as a random model does):", u)
else:
    print("  ok:", u)' "$WORK/claude.out"; then
  :
else
  echo "  FAILED:"; tail -c 2000 "$WORK/claude.out"; status=1
fi
exit $status
