"""The server's OpenAPI document (`GET /openapi.json`, derived from the request and response types)
checked, then used to fuzz the live server with schemathesis, bounded: every generated request,
valid or not, must get an answer that is not a 5xx, has a documented status code and content type,
and whose body follows the documented schema.

Run by scripts/test.d/40-openai.sh against the fixture model and the toy model, with the API key
set. NIGHTSHIFT_SCHEMATHESIS_EXAMPLES (default 25) bounds the examples per operation.
"""

import json
import os
import subprocess
import sys
import urllib.request

from runner import run_tests

URL = os.environ.get("NIGHTSHIFT_URL", "http://127.0.0.1:8080")
MODEL = os.environ.get("NIGHTSHIFT_MODEL", "mock")
KEY = os.environ.get("NIGHTSHIFT_API_KEY", "none")
EXAMPLES = os.environ.get("NIGHTSHIFT_SCHEMATHESIS_EXAMPLES", "25")


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


def test_schemathesis_finds_no_server_error_or_schema_violation():
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


if __name__ == "__main__":
    run_tests(globals())
