"""The server's OpenAPI document (`GET /openapi.json`, derived from the request and response types)
checked, then used to fuzz the live server with schemathesis, bounded: every generated request,
valid or not, must get an answer that is not a 5xx, has a documented status code and content type,
and whose body follows the documented schema.

Run by scripts/test.d/40-openai.sh against the fixture model and the toy model, with the API key
set. NIGHTSHIFT_SCHEMATHESIS_EXAMPLES (default 25) bounds the examples per operation.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

from runner import run_tests

URL = os.environ.get("NIGHTSHIFT_URL", "http://127.0.0.1:8080")
MODEL = os.environ.get("NIGHTSHIFT_MODEL", "mock")
KEY = os.environ.get("NIGHTSHIFT_API_KEY", "none")
EXAMPLES = os.environ.get("NIGHTSHIFT_SCHEMATHESIS_EXAMPLES", "25")

# Operations schemathesis may still report for a schema validation mismatch (most generated
# bodies refused), and why the document cannot say more: `/v1/admin/placement` takes TOML,
# which its schema does not describe; a Responses request names a stored response in
# `previous_response_id` (a format the document states, an existence it cannot) and needs
# `input` unless it does (a rule across fields, stated in the descriptions).
MISMATCH_EXPECTED = {"POST /v1/admin/placement", "POST /v1/responses"}


def document():
    with urllib.request.urlopen(URL + "/openapi.json", timeout=10) as r:
        assert r.status == 200
        return json.load(r)


def test_document_covers_the_api():
    doc = document()
    assert doc["openapi"].startswith("3.1"), doc["openapi"]
    paths = doc["paths"]
    for p, m in [
        ("/v1/chat/completions", "post"),
        ("/v1/completions", "post"),
        ("/v1/responses", "post"),
        ("/v1/responses/{id}", "get"),
        ("/v1/responses/{id}", "delete"),
        ("/v1/responses/{id}/input_items", "get"),
        ("/v1/messages", "post"),
        ("/v1/messages/count_tokens", "post"),
        ("/v1/models", "get"),
        ("/health", "get"),
        ("/ready", "get"),
        ("/metrics", "get"),
        ("/v1/admin/placement", "post"),
    ]:
        assert m in paths.get(p, {}), f"{m} {p} missing"
    schemas = doc["components"]["schemas"]
    chat = schemas["ChatRequest"]
    assert "messages" in chat["required"] and "model" in chat["required"], chat["required"]
    # the served model is the one `model` takes
    assert chat["properties"]["model"]["enum"] == [MODEL], chat["properties"]["model"]
    for name in ["ChatCompletion", "ChatChunk", "Completion", "ErrorBody", "ToolCallOut",
                 "ResponseObject", "Item"]:
        assert name in schemas, name
    assert doc["components"]["securitySchemes"]["api_key"]["scheme"] == "bearer"
    # a streamed answer is documented event by event (OpenAPI 3.2's reading of an event stream)
    for p in ["/v1/chat/completions", "/v1/completions"]:
        sse = paths[p]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
        assert sse == {"$ref": "#/components/schemas/StreamEvent"}, sse
    event = schemas["StreamEvent"]
    assert event["required"] == ["data"] and event["properties"]["data"]["type"] == "string", event


def test_document_states_the_server_limits():
    """The limits the server checks, as documented (the in-process gateway tests pin each one
    to the constant it is checked with; here, the served model's own)."""
    doc = document()
    schemas = doc["components"]["schemas"]
    completion = schemas["CompletionRequest"]["properties"]
    # top_p from 0 (greedy: top-p keeps at least one token); repeat_penalty above 0 as an f32
    assert completion["top_p"]["minimum"] == 0, completion["top_p"]
    assert completion["repeat_penalty"]["minimum"] > 0, completion["repeat_penalty"]
    assert completion["logprobs"]["maximum"] == 5, completion["logprobs"]
    assert completion["best_of"]["maximum"] == 1 and completion["best_of"]["minimum"] == 1
    assert completion["echo"]["enum"] == [False, None], completion["echo"]
    assert completion["suffix"]["maxLength"] == 0, completion["suffix"]
    # per server: a token id is below the vocabulary's size, a budget leaves a prompt token
    vocab = schemas["TokenId"]["maximum"] + 1
    ctx = completion["max_tokens"]["maximum"] + 1
    assert vocab > 1 and ctx > 1, (vocab, ctx)
    base = {"model": MODEL, "prompt": [0], "max_tokens": 1}
    assert post("/v1/completions", dict(base, prompt=[vocab - 1]))[0] == 200
    status, body = post("/v1/completions", dict(base, prompt=[vocab]))
    assert status == 400 and body["error"]["param"] == "prompt", (status, body)
    status, body = post("/v1/completions", dict(base, max_tokens=ctx))
    assert status == 400 and body["error"]["param"] == "prompt", (status, body)
    messages = schemas["MessagesRequest"]
    assert "max_tokens" in messages["required"], messages["required"]
    assert "max_tokens" not in schemas["CountTokensRequest"]["required"]
    assert schemas["ResponsesRequest"]["properties"]["metadata"]["maxProperties"] == 16


def post(path, body):
    req = urllib.request.Request(
        URL + path,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_schemathesis_finds_no_server_error_or_schema_violation():
    report_dir = tempfile.mkdtemp(prefix="schemathesis-")
    cmd = [
        os.path.join(os.path.dirname(sys.executable), "schemathesis"),
        "run",
        URL + "/openapi.json",
        "--checks",
        "not_a_server_error,status_code_conformance,content_type_conformance,"
        "response_schema_conformance",
        "--phases",
        "examples,coverage,fuzzing",
        "--max-examples",
        EXAMPLES,
        "--workers",
        "1",
        "--request-timeout",
        "60",
        "--seed",
        "1",
        "-H",
        f"Authorization: Bearer {KEY}",
        # the run's verdict as JSON: its warnings and how many generated bodies were served
        "--report",
        "json",
        "--report-dir",
        report_dir,
    ]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as e:
        # what schemathesis had printed, so the operation it was stuck on shows (a timeout's
        # output is bytes even with text=True)
        out = (e.stdout or b"").decode(errors="replace")
        raise AssertionError(f"schemathesis did not finish in 900 s; its output so far:\n{out[-6000:]}")
    tail = "\n".join(r.stdout.splitlines()[-40:])
    print(tail)
    assert r.returncode == 0, f"schemathesis failed:\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}"
    assert "passed" in r.stdout, tail
    reports = glob.glob(os.path.join(report_dir, "*.json"))
    assert len(reports) == 1, reports
    with open(reports[0]) as f:
        report = json.load(f)
    shutil.rmtree(report_dir, ignore_errors=True)
    for op in ["POST /v1/completions", "POST /v1/messages", "POST /v1/responses"]:
        rates = report["valid_rates"].get(op, {})
        print(op, "served/refused valid bodies:",
              {phase: (r["accepted"], r["rejected"]) for phase, r in rates.items()})
    # a mismatch means the document allows bodies the server refuses: a schema to tighten
    mismatch = set(report["warnings"]["validation_mismatch"])
    assert mismatch <= MISMATCH_EXPECTED, (
        f"schema validation mismatch (most generated bodies refused) on "
        f"{sorted(mismatch - MISMATCH_EXPECTED)}: the document allows what the server refuses"
    )


if __name__ == "__main__":
    run_tests(globals())
