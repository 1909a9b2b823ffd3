"""Tools and structured outputs with the official `openai` package (and `openai-agents`) against a
running `nightshift serve` whose random-weight model carries a real chat template.

Run by scripts/test.d/40-openai.sh once per template (NIGHTSHIFT_TEMPLATE names the .jinja file
the model was generated with). Constrained decoding makes the output valid whatever the weights:
forced tool calls validate against their schema, streamed calls reassemble to the same call,
json_schema content validates. The server's rendering of a conversation with tool calls and tool
results is compared byte for byte with Python jinja2 in transformers' environment. Plain
asserts; the last line says `N passed, N failed`.
"""

import asyncio
import json
import os
import urllib.error
import urllib.request

import jsonschema
import openai
from openai import AsyncOpenAI, OpenAI
from runner import run_tests

URL = os.environ.get("NIGHTSHIFT_URL", "http://127.0.0.1:8080")
MODEL = os.environ.get("NIGHTSHIFT_MODEL", "mock")
KEY = os.environ.get("NIGHTSHIFT_API_KEY", "none")
TEMPLATE = os.environ.get("NIGHTSHIFT_TEMPLATE") or None

client = OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0, timeout=300)

# bounded values, so a random model finishes its call within max_tokens
# the budget of a forced call: DeepSeek-V3.2's DSML tags, spelled with the tiny models' byte
# tokens, take ~200 tokens for one call
CALL_TOKENS = 400
WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the weather.",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "Get the time.",
                                      "parameters": {"type": "object", "properties": {
                                          "zone": {"type": "string", "enum": ["UTC", "CET"]}},
                                          "required": ["zone"], "additionalProperties": False}}},
]
ASK = [{"role": "system", "content": "You are a helpful assistant."},
       {"role": "user", "content": "What's the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def call(**kw):
    args = dict(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=CALL_TOKENS, temperature=0,
                parallel_tool_calls=False)
    args.update(kw)
    return client.chat.completions.create(**args)


def test_named_tool_choice_validates():
    r = call(tool_choice=NAMED)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", (c.finish_reason, c.message)
    assert not c.message.content, c.message.content
    assert len(c.message.tool_calls) == 1, c.message.tool_calls
    tc = c.message.tool_calls[0]
    assert tc.type == "function" and tc.id, tc
    assert tc.function.name == "get_weather", tc
    jsonschema.validate(json.loads(tc.function.arguments), WEATHER_PARAMS)


def test_required_tool_choice_calls_a_declared_tool():
    r = call(tool_choice="required", temperature=0.8, seed=3)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", (c.finish_reason, c.message)
    tc = c.message.tool_calls[0]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert tc.function.name in schemas, tc
    jsonschema.validate(json.loads(tc.function.arguments), schemas[tc.function.name])


def test_streamed_tool_call_reassembles():
    whole = call(tool_choice=NAMED).choices[0].message.tool_calls[0]
    calls = {}
    finish = None
    for chunk in call(tool_choice=NAMED, stream=True):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        for d in ch.delta.tool_calls or []:
            slot = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            if d.id:
                slot["id"] = d.id
            if d.function and d.function.name:
                slot["name"] += d.function.name
            if d.function and d.function.arguments:
                slot["arguments"] += d.function.arguments
        finish = ch.finish_reason or finish
    assert finish == "tool_calls", finish
    assert list(calls) == [0], calls
    got = calls[0]
    assert got["id"] and got["name"] == whole.function.name, (got, whole)
    assert json.loads(got["arguments"]) == json.loads(whole.function.arguments), (got, whole)
    # the SDK's own stream helper assembles the same call
    with client.chat.completions.stream(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=CALL_TOKENS,
                                        temperature=0, tool_choice=NAMED,
                                        parallel_tool_calls=False) as s:
        final = s.get_final_completion()
    tc = final.choices[0].message.tool_calls[0]
    assert tc.function.name == whole.function.name
    assert json.loads(tc.function.arguments) == json.loads(whole.function.arguments)


def test_response_format_json_schema_validates():
    schema = {"type": "object", "properties": {
        "answer": {"type": "string", "maxLength": 20},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3}},
        "required": ["answer", "score", "tags"], "additionalProperties": False}
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=160, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "reply", "schema": schema, "strict": True}})
    c = r.choices[0]
    assert c.finish_reason == "stop", (c.finish_reason, c.message.content)
    jsonschema.validate(json.loads(c.message.content), schema)


def test_tool_messages_round_trip_into_the_prompt():
    conv = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "functions.get_weather:0", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})}}]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0",
         "content": json.dumps({"temperature_c": 18, "condition": "sunny"})},
    ]
    # the server accepts the next turn...
    r = client.chat.completions.create(model=MODEL, messages=conv, tools=TOOLS, max_tokens=4,
                                       temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # ...and its prompt holds the call and the result, byte for byte as jinja2 renders it
    prompt = apply_template({"messages": conv, "tools": TOOLS})
    assert "sunny" in prompt and "Paris" in prompt, prompt
    if TEMPLATE:
        want = render_with_jinja2(conv)
        assert prompt == want, f"\nserver: {prompt!r}\njinja2: {want!r}"


def test_reasoning_content_reaches_the_client():
    """DeepSeek-R1's generation prompt opens a think block: what the model writes before
    `</think>` is reasoning, sent as `reasoning_content` (whole and streamed), not content."""
    if not TEMPLATE or "deepseek-r1" not in TEMPLATE:
        return
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=6, temperature=0)
    msg = r.choices[0].message
    reasoning = (msg.model_extra or {}).get("reasoning_content")
    assert reasoning, msg
    assert not msg.content, msg
    stream = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=6,
                                            temperature=0, stream=True)
    streamed, content = "", ""
    for chunk in stream:
        if chunk.choices:
            d = chunk.choices[0].delta
            streamed += (d.model_extra or {}).get("reasoning_content") or ""
            content += d.content or ""
    assert (streamed, content) == (reasoning, ""), (streamed, content, reasoning)


def random_conversation(rng):
    """A conversation a client could send: system or not, user turns, plain answers (with
    reasoning sometimes), answers that call tools (with or without text) and their results;
    text with quotes, blanks, markup-like and non-ASCII pieces; arguments with nested values,
    numbers, booleans and nulls."""
    pieces = ["hello", " world", "é", "東京", "\n", "  ", '"quoted"', "<tag>", "{x}", "'s", "\\",
              "😀", "\t", "a/b", "100%", "<|fake|>"]

    def text(n=6):
        return "".join(rng.choice(pieces) for _ in range(rng.randint(1, n)))

    def value(depth=0):
        kinds = ["str", "int", "float", "bool", "null"] + (["list", "dict"] if depth < 2 else [])
        k = rng.choice(kinds)
        if k == "str":
            return text(3)
        if k == "int":
            return rng.choice([0, 7, -3, 123456789])
        if k == "float":
            return rng.choice([1.5, 0.25, -2.0, 3.14159])
        if k == "bool":
            return rng.choice([True, False])
        if k == "null":
            return None
        if k == "list":
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(["a", "b", "c"]) + str(i): value(depth + 1) for i in range(rng.randint(0, 3))}

    conv = []
    if rng.random() < 0.7:
        conv.append({"role": "system", "content": text()})
    n_call = 0
    for _ in range(rng.randint(1, 3)):
        conv.append({"role": "user", "content": text()})
        if rng.random() < 0.5:
            calls = []
            for _ in range(rng.randint(1, 2)):
                name = rng.choice(["get_weather", "get_time"])
                args = {k: value() for k in rng.sample(["city", "days", "zone", "opts"], rng.randint(0, 3))}
                calls.append({"id": f"functions.{name}:{n_call}", "type": "function",
                              "function": {"name": name, "arguments": json.dumps(args)}})
                n_call += 1
            content = text() if rng.random() < 0.3 else None
            conv.append({"role": "assistant", "content": content, "tool_calls": calls})
            for c in calls:
                conv.append({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
                             "content": text()})
        else:
            m = {"role": "assistant", "content": text()}
            if rng.random() < 0.3:
                m["reasoning_content"] = text()
            conv.append(m)
    conv.append({"role": "user", "content": text()})
    return conv


def test_random_conversations_render_as_jinja2():
    """The server's rendering of 40 random conversations is byte for byte Python jinja2's in
    transformers' environment."""
    if not TEMPLATE:
        return
    import random
    rng = random.Random(11)
    bad = []
    compared = 0
    for i in range(40):
        conv = random_conversation(rng)
        try:
            want = render_with_jinja2(conv)
        except Exception as e:  # the template itself refuses this conversation
            want = "ERROR " + type(e).__name__
        try:
            got = apply_template({"messages": conv, "tools": TOOLS})
        except urllib.error.HTTPError as e:
            got = "ERROR " + type(e).__name__
        if want.startswith("ERROR") and got.startswith("ERROR"):
            continue
        compared += 1
        if got != want:
            at = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            bad.append(f"conversation {i}: first difference at {at}:\n server: {got[max(0, at - 80):at + 80]!r}\n jinja2: {want[max(0, at - 80):at + 80]!r}\n {json.dumps(conv, ensure_ascii=False)}")
    assert not bad, "\n".join(bad[:3]) + f"\n({len(bad)} of 40 differ)"
    # a template may refuse some conversations (both sides then fail alike), not most
    assert compared >= 30, f"only {compared} of 40 conversations rendered"


def apply_template(body):
    req = urllib.request.Request(URL + "/apply-template", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(req, timeout=30) as f:
        return json.loads(f.read())["prompt"]


def template_quirks():
    """How the template takes an assistant turn that calls tools: the published templates' table
    in model/tests/data/templates/render_templates.py (the one home of those quirks)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "render_templates", os.path.join(os.path.dirname(TEMPLATE), "render_templates.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.TEMPLATES[os.path.basename(TEMPLATE).removesuffix(".jinja")]


def render_with_jinja2(conv):
    """transformers' apply_chat_template environment (render_templates.py's), the template's
    quirks applied as a client following it would."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: \
        json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(jinja2.exceptions.TemplateError(m))
    source = open(TEMPLATE, encoding="utf-8").read()
    name = os.path.basename(TEMPLATE)
    quirks = template_quirks()
    msgs = json.loads(json.dumps(conv))
    for m in msgs:
        if m["role"] == "assistant" and m.get("tool_calls"):
            # e.g. DeepSeek-R1's writes a second, empty turn for "", V3's renders calls only for None
            if not m.get("content"):
                m["content"] = quirks["content"]
            m["tool_calls"] = [dict(c) for c in m["tool_calls"]]
            for c in m["tool_calls"]:
                c["function"] = dict(c["function"])
                if quirks["args"] == "object":
                    c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        if m["role"] == "tool":
            m.setdefault("name", "get_weather")
    # the generated models' special tokens (gen-model), not the published ones
    specials = {"qwen": (None, "<|im_end|>"), "kimi": ("[BOS]", "<|im_end|>"),
                "deepseek": ("[BOS]", "<｜end▁of▁sentence｜>"), "glm": (None, "<|im_end|>")}
    bos, eos = next(v for k, v in specials.items() if k in name)
    tmpl = env.from_string(source)
    shim_tools(tmpl, quirks, msgs, eos)
    return tmpl.render(messages=msgs, tools=TOOLS, add_generation_prompt=True,
                       bos_token=bos, eos_token=eos)


def shim_tools(tmpl, quirks, msgs, eos):
    """What the server adds for a template that never prints the tools it is given (DeepSeek
    V3, V3.1, R1), as llama.cpp's template runtime does: the definitions and an example call cut
    out of the template's own render, in the system message (one made for them when there is
    none; the first user turn when the template prints no system message). Edits `msgs`."""
    def render(ms, gen, tools=None, eos_token=""):
        kw = {"tools": tools} if tools is not None else {}
        try:
            return tmpl.render(messages=ms, add_generation_prompt=gen, bos_token="",
                               eos_token=eos_token, **kw)
        except Exception:
            return None
    probe_tool = [{"type": "function", "function": {
        "name": "probe_tool_fn", "description": "probe description",
        "parameters": {"type": "object", "properties": {"probe_arg": {"type": "string"}}}}}]
    user = {"role": "user", "content": "probe user turn"}
    printed = render([user], True, probe_tool)
    if printed is not None and "probe_tool_fn" in printed:
        return
    sys_render = render([{"role": "system", "content": "probe system turn"}, user], True)
    system_role = sys_render is not None and "probe system turn" in sys_render
    args = {"arg1": "some_value"} if quirks["args"] == "object" else '{"arg1": "some_value"}'
    call = {"role": "assistant", "content": quirks["content"], "tool_calls": [
        {"id": "call_1___", "type": "function", "function": {"name": "tool_name", "arguments": args}}]}
    prefix = render([user], True, eos_token="<probe-eos>")
    full = render([user, call], False, eos_token="<probe-eos>")
    example = None
    if prefix is not None and full is not None:
        n = 0
        while n < min(len(prefix), len(full)) and prefix[n] == full[n]:
            n += 1
        tail = full[n:].rstrip()
        tail = tail.removesuffix("<probe-eos>").rstrip()
        if "tool_name" in tail and "some_value" in tail:
            example = tail
    text = ("You can call any of the following tools to satisfy the user's requests: "
            + json.dumps(TOOLS, indent=2, ensure_ascii=False))
    if example is not None:
        if eos:
            example = example.removesuffix(eos).rstrip()
        text += "\n\nExample tool call syntax:\n\n" + example + "\n\n"
    if system_role:
        if msgs and msgs[0]["role"] == "system":
            msgs[0]["content"] = msgs[0]["content"] + "\n\n" + text
        else:
            msgs.insert(0, {"role": "system", "content": text})
    else:
        u = next((m for m in msgs if m["role"] == "user"), None)
        if u is not None:
            u["content"] = text + "\n\n" + u["content"]
        else:
            msgs.insert(0, {"role": "user", "content": text})


def run_weather_agent(model_cls, **agent_kw):
    """openai-agents with a forced get_weather tool on `model_cls` (its chat or Responses
    model); returns (cities the tool saw, the run's final output)."""
    from typing import Literal

    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from openai.types.shared import Reasoning

    set_tracing_disabled(True)
    seen = []

    @function_tool
    def get_weather(city: Literal["Paris", "London"]) -> str:
        """Get the weather of a city."""
        seen.append(city)
        return "sunny, 18 C"

    model = model_cls(
        model=MODEL, openai_client=AsyncOpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0))
    agent = Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather],
                  model=model,
                  # thinking off where the template has a switch (DeepSeek-V3.2 thinks by
                  # default): a random model's whole answer would otherwise be reasoning, and
                  # the SDK refuses a turn with no text
                  model_settings=ModelSettings(tool_choice="get_weather", temperature=0,
                                               max_tokens=CALL_TOKENS, parallel_tool_calls=False,
                                               reasoning=Reasoning(effort="minimal")),
                  **agent_kw)
    result = asyncio.run(Runner.run(agent, "What's the weather in Paris?", max_turns=4))
    return seen, result.final_output


def prompt_opens_think():
    """Whether the template's generation prompt opens a think block it has no switch for
    (Qwen3 Thinking-2507's): a random model never closes it, so its free text is all reasoning."""
    if not TEMPLATE:
        return False
    p = apply_template({"messages": [{"role": "user", "content": "hi"}],
                        "chat_template_kwargs": {"enable_thinking": False, "thinking": False}})
    return p.rstrip().endswith("<think>")


def test_agents_sdk_loop():
    from agents import OpenAIChatCompletionsModel

    # After the tool, the run wants free text. Under a prompt that opens a think block with no
    # switch, a random model's text is all reasoning, which the SDK refuses as an empty turn.
    # So there the tool's answer ends the run, as in the Responses loop below.
    kw = {"tool_use_behavior": "stop_on_first_tool"} if prompt_opens_think() else {}
    seen, final = run_weather_agent(OpenAIChatCompletionsModel, **kw)
    assert seen and seen[0] in ("Paris", "London"), seen
    assert isinstance(final, str), final
    if kw:
        assert final == "sunny, 18 C", final


def expect_400(fn, param_or_text):
    try:
        fn()
    except openai.BadRequestError as e:
        body = json.dumps(e.body)
        assert param_or_text in body, body
        return
    raise AssertionError(f"expected a 400 mentioning {param_or_text!r}")


def test_bad_input_table():
    expect_400(lambda: call(tool_choice={"type": "function", "function": {"name": "nope"}}),
               "tool_choice")
    expect_400(lambda: client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4,
                                                      tool_choice="required"), "tool_choice")
    expect_400(lambda: call(n=2), "\"n\"")
    bad_schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)a"}}}
    expect_400(lambda: client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=4,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad_schema}}),
        "response_format")
    expect_400(lambda: call(tool_choice="required", tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 5}}}}}]), "tools")
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100}
                                             for i in range(1000)}}
    expect_400(lambda: call(tools=[{"type": "function", "function": {"name": "f", "parameters": huge}}]),
               "tools[0].function.parameters")
    expect_400(lambda: call(tools=[{"type": "function", "function": {"name": "bad name"}}]),
               "tools[0].function.name")
    expect_400(lambda: client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4,
                                                      response_format={"type": "yaml"}),
               "response_format.type")


# the Responses API's flat function tools
FLAT_TOOLS = [dict(t["function"], type="function") for t in TOOLS]
ASK_INPUT = [{"role": "user", "content": "What's the weather in Paris?"}]


def test_responses_forced_call_round_trip():
    """`client.responses` with a forced call: a function_call item that validates, streamed
    arguments that reassemble to it, and its output sent back with previous_response_id."""
    args = dict(model=MODEL, instructions="You are a helpful assistant.", input=ASK_INPUT,
                tools=FLAT_TOOLS, tool_choice={"type": "function", "name": "get_weather"},
                parallel_tool_calls=False, max_output_tokens=CALL_TOKENS, temperature=0)
    r = client.responses.create(**args)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", r.output
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_PARAMS)
    with client.responses.stream(**args) as stream:
        streamed = "".join(e.delta for e in stream
                           if e.type == "response.function_call_arguments.delta")
        final = stream.get_final_response()
    fc = [o for o in final.output if o.type == "function_call"]
    assert fc and streamed == fc[0].arguments, (streamed, final.output)
    back = client.responses.create(
        model=MODEL, previous_response_id=r.id, tools=FLAT_TOOLS, max_output_tokens=8,
        temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "sunny, 18 C"}])
    assert back.status in ("completed", "incomplete"), back.status
    assert back.usage.input_tokens > r.usage.input_tokens, (r.usage, back.usage)


def test_responses_parse_validates():
    from typing import Literal

    from pydantic import BaseModel, Field

    class Weather(BaseModel):
        city: str = Field(max_length=12)
        sky: Literal["sunny", "rain"]

    r = client.responses.parse(model=MODEL, input=ASK_INPUT, text_format=Weather,
                               max_output_tokens=200, temperature=0)
    assert r.status == "completed", r
    assert isinstance(r.output_parsed, Weather), r.output_parsed


def test_agents_sdk_responses_loop():
    """openai-agents' default model speaks the Responses API."""
    from agents import OpenAIResponsesModel

    # the tool's answer ends the run: a random model's free text after it would run into
    # max_output_tokens, which the SDK (as with OpenAI's own `response.incomplete`) raises on
    seen, final = run_weather_agent(OpenAIResponsesModel, tool_use_behavior="stop_on_first_tool")
    assert seen and seen[0] in ("Paris", "London"), seen
    assert final == "sunny, 18 C", final


def anthropic_client():
    import anthropic

    return anthropic.Anthropic(base_url=URL, api_key=KEY, max_retries=0, timeout=300)


ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]


def test_anthropic_messages_tool_loop():
    """The official `anthropic` client: a forced tool_use block that validates, the same call
    streamed (input_json_delta), count_tokens, and the tool_result turn sent back."""
    ac = anthropic_client()
    # anthropic's client has no `temperature` argument any more: greedy through the body
    args = dict(model=MODEL, max_tokens=CALL_TOKENS, extra_body={"temperature": 0},
                system="You are a helpful assistant.", messages=ASK[1:], tools=ANTHROPIC_TOOLS,
                tool_choice={"type": "tool", "name": "get_weather",
                             "disable_parallel_tool_use": True})
    m = ac.messages.create(**args)
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and len(uses) == 1, m
    jsonschema.validate(uses[0].input, WEATHER_PARAMS)
    with ac.messages.stream(**args) as stream:
        final = stream.get_final_message()
    su = [b for b in final.content if b.type == "tool_use"]
    assert su and su[0].input == uses[0].input, (final, m)
    n = ac.messages.count_tokens(model=MODEL, system=args["system"], messages=args["messages"],
                                 tools=ANTHROPIC_TOOLS)
    assert n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), (n, m)
    back = ac.messages.create(
        model=MODEL, max_tokens=8, extra_body={"temperature": 0}, system=args["system"],
        tools=ANTHROPIC_TOOLS,
        messages=ASK[1:] + [
            {"role": "assistant", "content": [b.model_dump() for b in m.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                          "content": "sunny, 18 C"}]}])
    assert back.stop_reason in ("end_turn", "max_tokens", "tool_use"), back
    total = back.usage.input_tokens + (back.usage.cache_read_input_tokens or 0)
    assert total > n.input_tokens, (back.usage, n)


if __name__ == "__main__":
    run_tests(globals())
