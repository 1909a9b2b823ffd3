"""The official `openai` Python package against a running `nightshift serve`.

Run by scripts/test.d/40-openai.sh, which starts the server and sets NIGHTSHIFT_URL,
NIGHTSHIFT_MODEL and NIGHTSHIFT_API_KEY. Plain asserts, no pytest needed: every `test_*`
function runs, and the last line says `N passed, N failed`.
"""

import json
import os
import urllib.request

import openai
from openai import OpenAI
from runner import run_tests

URL = os.environ.get("NIGHTSHIFT_URL", "http://127.0.0.1:8080")
MODEL = os.environ.get("NIGHTSHIFT_MODEL", "mock")
KEY = os.environ.get("NIGHTSHIFT_API_KEY", "none")

client = OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0, timeout=120)
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]


def greedy_chat(**kw):
    args = dict(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    args.update(kw)
    return client.chat.completions.create(**args)


def test_models():
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL], ids


def test_chat():
    r = greedy_chat()
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str)
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    u = r.usage
    assert u.prompt_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert c.finish_reason == "stop" or u.completion_tokens == 12
    # greedy is deterministic
    assert greedy_chat().choices[0].message.content == c.message.content


def test_chat_stream_with_usage():
    want = greedy_chat()
    stream = greedy_chat(stream=True, stream_options={"include_usage": True})
    text, finish, usage, roles = "", None, None, []
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
            continue
        d = chunk.choices[0].delta
        if d.role:
            roles.append(d.role)
        text += d.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert roles == ["assistant"], roles
    assert text == want.choices[0].message.content, (text, want.choices[0].message.content)
    assert finish == want.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == want.usage.completion_tokens


def test_text_parts_equal_string_content():
    parts = [{"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hello."}]}]
    a = greedy_chat(messages=[{"role": "user", "content": "Say hello."}])
    b = greedy_chat(messages=parts)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_chat_logprobs():
    r = greedy_chat(logprobs=True, top_logprobs=3, max_tokens=6)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens, (len(content), r.usage)
    for t in content:
        assert t.logprob <= 0.0
        assert len(t.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5


def test_completions_and_logprobs():
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0, logprobs=2)
    assert r.object == "text_completion"
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length")
    if "\ufffd" not in c.text:  # per-token strings are lossy where a character spans tokens
        assert "".join(c.logprobs.tokens) == c.text
    assert len(c.logprobs.token_logprobs) == len(c.logprobs.tokens) == r.usage.completion_tokens
    assert all(len(t) <= 2 for t in c.logprobs.top_logprobs)
    s = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0, stream=True)
    assert "".join(ch.choices[0].text for ch in s if ch.choices) == c.text


def test_stop_string_not_emitted():
    full = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0).choices[0].text
    if len(full) < 6:
        return  # the model ended too early to pick a stop string from its output
    stop = full[3:5]
    cut = full[: full.index(stop)]
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop", (r.choices[0].text, cut)
    s = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0, stop=stop, stream=True)
    assert "".join(ch.choices[0].text for ch in s if ch.choices) == cut


def test_seed_reproducible():
    a = greedy_chat(temperature=1.0, seed=1234, max_tokens=10).choices[0].message.content
    b = greedy_chat(temperature=1.0, seed=1234, max_tokens=10).choices[0].message.content
    assert a == b


def test_prefix_cache_cached_tokens():
    # a long prompt sent twice: the second finds all its full 16-token blocks cached
    msgs = [{"role": "user", "content": "Review this function for bugs and style. " * 8}]
    first = greedy_chat(messages=msgs, max_tokens=4)
    d = first.usage.prompt_tokens_details
    assert d is not None and isinstance(d.cached_tokens, int), first.usage
    second = greedy_chat(messages=msgs, max_tokens=4)
    p, c = second.usage.prompt_tokens, second.usage.prompt_tokens_details.cached_tokens
    assert p - 16 <= c < p, (p, c)
    assert second.choices[0].message.content == first.choices[0].message.content
    stream = greedy_chat(messages=msgs, max_tokens=4, stream=True, stream_options={"include_usage": True})
    usage = [ch.usage for ch in stream if ch.usage is not None]
    assert len(usage) == 1 and usage[0].prompt_tokens_details.cached_tokens == c, usage
    off = greedy_chat(messages=msgs, max_tokens=4, extra_body={"cache_prompt": False})
    assert off.usage.prompt_tokens_details.cached_tokens == 0, off.usage


def expect(exc, fn, status, param=None):
    try:
        fn()
    except exc as e:
        assert e.status_code == status, (e.status_code, e)
        body = e.body if isinstance(e.body, dict) else {}
        if param is not None:
            assert body.get("param") == param, body
        assert body.get("message"), body
        return
    raise AssertionError(f"expected {exc.__name__}")


def test_errors():
    expect(openai.NotFoundError, lambda: greedy_chat(model="no-such-model"), 404, "model")
    expect(openai.BadRequestError, lambda: greedy_chat(n=2), 400, "n")
    expect(openai.BadRequestError, lambda: greedy_chat(temperature=7), 400, "temperature")
    expect(openai.BadRequestError, lambda: greedy_chat(max_tokens=10**7), 400, "messages")
    expect(openai.BadRequestError, lambda: greedy_chat(messages=[{"role": "oracle", "content": "x"}]), 400, "messages[0].role")
    expect(openai.BadRequestError, lambda: greedy_chat(extra_body={"top_k": "many"}), 400, "top_k")
    if KEY != "none":
        bad = OpenAI(base_url=URL + "/v1", api_key="wrong-" + KEY, max_retries=0)
        expect(openai.AuthenticationError, lambda: bad.models.list(), 401)


def test_what_openai_and_llama_cpp_accept():
    """top_p 0 (greedy: top-p keeps at least one token), integers written as floats, and an
    empty completions prompt (the BOS token alone, on a model that adds one)."""
    want = greedy_chat(max_tokens=8)
    r = greedy_chat(max_tokens=8.0, n=1.0, seed=7.0, temperature=1.0, top_p=0)
    assert r.choices[0].message.content == want.choices[0].message.content
    assert r.usage.completion_tokens == want.usage.completion_tokens
    prompt = "Once upon a time"
    want = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0)
    c = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6.0, logprobs=1.0,
                                  temperature=1.0, top_p=0)
    assert c.choices[0].text == want.choices[0].text
    assert len(c.choices[0].logprobs.tokens) == c.usage.completion_tokens
    expect(openai.BadRequestError, lambda: greedy_chat(max_tokens=8.5), 400, "max_tokens")
    # the served document says whether this model takes an empty prompt text
    with urllib.request.urlopen(URL + "/openapi.json", timeout=10) as d:
        text = json.load(d)["components"]["schemas"]["PromptField"]["oneOf"][0]
    if "minLength" in text:
        expect(openai.BadRequestError,
               lambda: client.completions.create(model=MODEL, prompt="", max_tokens=2), 400, "prompt")
    else:
        e = client.completions.create(model=MODEL, prompt="", max_tokens=2, temperature=0)
        assert e.usage.prompt_tokens == 1, e.usage


def test_extensions_accepted():
    r = greedy_chat(extra_body={"top_k": 5, "min_p": 0.05, "repeat_penalty": 1.1}, presence_penalty=0.5, frequency_penalty=0.5, user="tests")
    assert r.choices[0].finish_reason in ("stop", "length")


def test_responses_api_matches_chat():
    """`client.responses`: the same answer as the chat request, streamed and whole; stored,
    continued with previous_response_id, retrieved and deleted."""
    chat = greedy_chat()
    r = client.responses.create(model=MODEL, instructions="You are terse.", input="Say hello.",
                                max_output_tokens=12, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_"), r.id
    assert r.output_text == chat.choices[0].message.content, (r.output_text, chat)
    assert r.usage.input_tokens == chat.usage.prompt_tokens, (r.usage, chat.usage)
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    with client.responses.stream(model=MODEL, instructions="You are terse.", input="Say hello.",
                                 max_output_tokens=12, temperature=0) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert deltas == r.output_text and final.output_text == r.output_text, (deltas, final)
    # instructions are not carried over by previous_response_id (as OpenAI's are not)
    r2 = client.responses.create(model=MODEL, previous_response_id=r.id, input="Again.",
                                 instructions="You are terse.", max_output_tokens=4,
                                 temperature=0)
    assert r2.usage.input_tokens > r.usage.input_tokens + 2, (r.usage, r2.usage)
    assert r2.usage.input_tokens_details.cached_tokens > 0, r2.usage
    assert client.responses.retrieve(r.id).output_text == r.output_text
    items = client.responses.input_items.list(r.id)
    assert [i.content[0].text if isinstance(i.content, list) else i.content
            for i in items.data] == ["Say hello."], items
    client.responses.delete(r2.id)
    try:
        client.responses.retrieve(r2.id)
        raise AssertionError("a deleted response was still found")
    except openai.NotFoundError:
        pass
    try:
        client.responses.create(model=MODEL, input=[{"type": "web_search_call", "id": "x"}])
        raise AssertionError("an unsupported item was accepted")
    except openai.BadRequestError as e:
        assert "web_search_call" in str(e.body), e.body


def test_anthropic_messages_match_chat():
    """The official `anthropic` client on /v1/messages: the chat answer as text blocks, whole
    and streamed, and its errors as anthropic's exceptions."""
    import anthropic

    ac = anthropic.Anthropic(base_url=URL, api_key=KEY, max_retries=0, timeout=120)
    chat = greedy_chat()
    m = ac.messages.create(model=MODEL, system="You are terse.", max_tokens=12, extra_body={"temperature": 0},
                           messages=[{"role": "user", "content": "Say hello."}])
    text = "".join(b.text for b in m.content if b.type == "text")
    assert text == chat.choices[0].message.content, (m, chat)
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == chat.usage.prompt_tokens
    with ac.messages.stream(model=MODEL, system="You are terse.", max_tokens=12, extra_body={"temperature": 0},
                            messages=[{"role": "user", "content": "Say hello."}]) as s:
        streamed = "".join(s.text_stream)
    assert streamed == text, (streamed, text)
    try:
        ac.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AA=="}}]}])
        raise AssertionError("an image block was accepted")
    except anthropic.BadRequestError as e:
        assert "image" in str(e), e


if __name__ == "__main__":
    run_tests(globals())
