//! Tools and structured outputs over the mock model (byte vocabulary, Hermes tool format): a
//! forced call validates against its schema and streams as OpenAI streams calls, json_schema
//! content validates, tool messages reach the prompt, and bad tool input is a 400 naming the
//! field.

use super::*;

fn weather_params() -> Value {
    json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14}},
        "required": ["city", "days"], "additionalProperties": false})
}

pub(super) fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "d",
        "parameters": weather_params()}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}])
}

fn forced(stream: bool) -> Value {
    json!({"model": "mock", "messages": [{"role": "user", "content": "weather?"}],
        "tools": tools(), "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": false, "max_tokens": 200, "temperature": 0, "stream": stream})
}

/// `{"city": string of at most 12 chars, "days": 1..=14}` and nothing else.
pub(super) fn check_weather_args(args: &str) {
    let v: Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{args}: {e}"));
    let m = v.as_object().expect("an object");
    assert_eq!(m.len(), 2, "{args}");
    assert!(
        m["city"].as_str().is_some_and(|c| c.chars().count() <= 12),
        "{args}"
    );
    assert!(
        m["days"].as_i64().is_some_and(|d| (1..=14).contains(&d)),
        "{args}"
    );
}

#[tokio::test]
async fn forced_tool_call_validates_and_streams_like_openai() {
    let s = start(Opts::default()).await;
    let (st, v) = post(&s, "/v1/chat/completions", forced(false)).await;
    assert_eq!(st, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    assert!(c["message"]["content"].is_null(), "{v}");
    let calls = c["message"]["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["type"], "function");
    assert!(calls[0]["id"]
        .as_str()
        .is_some_and(|i| i.starts_with("call_")));
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args = calls[0]["function"]["arguments"]
        .as_str()
        .expect("arguments text");
    check_weather_args(args);

    let chunks = sse(&s, "/v1/chat/completions", forced(true)).await;
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    // first: index, id, type and name with empty arguments; then the arguments in pieces, as
    // they are generated (the call is constrained, so it is sent before it closes)
    assert!(deltas.len() > 3, "arguments in one piece: {chunks:?}");
    assert_eq!(deltas[0]["index"], 0);
    assert!(deltas[0]["id"].as_str().is_some());
    assert_eq!(deltas[0]["type"], "function");
    assert_eq!(deltas[0]["function"]["name"], "get_weather");
    assert_eq!(deltas[0]["function"]["arguments"], "");
    let mut joined = String::new();
    for d in &deltas[1..] {
        assert_eq!(d["index"], 0);
        assert!(
            d.get("id").is_none() && d["function"].get("name").is_none(),
            "{d}"
        );
        joined.push_str(d["function"]["arguments"].as_str().expect("arguments text"));
    }
    assert_eq!(joined, args);
    let last = chunks
        .iter()
        .rev()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(last, Some("tool_calls"));
    assert_eq!(stream_text(&chunks), "", "no content around a forced call");
}

#[tokio::test]
async fn required_with_parallel_calls_gives_declared_calls() {
    let s = start(Opts::default()).await;
    let mut body = forced(false);
    body["tool_choice"] = json!("required");
    body["parallel_tool_calls"] = json!(true);
    body["max_tokens"] = json!(400);
    let (st, v) = post(&s, "/v1/chat/completions", body).await;
    assert_eq!(st, 200, "{v}");
    let calls = v["choices"][0]["message"]["tool_calls"]
        .as_array()
        .expect("tool_calls");
    assert!(!calls.is_empty(), "{v}");
    for c in calls {
        let name = c["function"]["name"].as_str().unwrap_or("");
        let args = c["function"]["arguments"].as_str().unwrap_or("");
        match name {
            "get_weather" => check_weather_args(args),
            "get_time" => assert!(serde_json::from_str::<Value>(args).is_ok_and(|a| a.is_object())),
            other => panic!("undeclared tool {other}"),
        }
    }
}

#[tokio::test]
async fn json_schema_content_validates() {
    let s = start(Opts::default()).await;
    let schema = json!({"type": "object", "properties": {
        "answer": {"type": "string", "maxLength": 8},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
        "required": ["answer", "ok", "tags"], "additionalProperties": false});
    for rf in [
        json!({"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": true}}),
        json!({"type": "json_object"}),
    ] {
        let body = json!({"model": "mock", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 300, "temperature": 0, "response_format": rf});
        let (st, v) = post(&s, "/v1/chat/completions", body).await;
        assert_eq!(st, 200, "{v}");
        let c = &v["choices"][0];
        let text = c["message"]["content"].as_str().unwrap_or("");
        if c["finish_reason"] == "stop" {
            let got: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(got.is_object(), "{text}");
            if rf["type"] == "json_schema" {
                assert_eq!(got.as_object().map(|m| m.len()), Some(3), "{text}");
                assert!(got["answer"]
                    .as_str()
                    .is_some_and(|a| a.chars().count() <= 8));
                assert!(got["ok"].is_boolean());
            }
        } else {
            // cut by max_tokens: still a prefix of valid JSON
            assert!(text.starts_with('{'), "{text}");
        }
    }
}

#[tokio::test]
async fn lark_grammar_extension_constrains_content() {
    let s = start(Opts::default()).await;
    let body = json!({"model": "mock", "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 50, "temperature": 0, "grammar": "start: (\"yes\" | \"no\") \"!\""});
    let (st, v) = post(&s, "/v1/chat/completions", body).await;
    assert_eq!(st, 200, "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
    assert!(text == "yes!" || text == "no!", "{text}");
    let bad = json!({"model": "mock", "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 5, "grammar": "start: undefined_rule"});
    let (st, v) = post(&s, "/v1/chat/completions", bad).await;
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (400, Some("grammar")),
        "{v}"
    );
}

#[tokio::test]
async fn tool_messages_reach_the_prompt() {
    let s = start(Opts::default()).await;
    let conv = json!([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    ]);
    let (st, v) = post(
        &s,
        "/apply-template",
        json!({"messages": conv, "tools": tools()}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["prompt"],
        "<tools>get_weather,get_time\n<user>weather?\n<assistant>\
         <tool_call>get_weather({\"city\": \"Paris\", \"days\": 1})</tool_call>\n\
         <tool>sunny<id>call_1\n<assistant>"
    );
    let body = json!({"model": "mock", "messages": conv, "tools": tools(), "max_tokens": 4});
    let (st, v) = post(&s, "/v1/chat/completions", body).await;
    assert_eq!(st, 200, "{v}");
}

#[tokio::test]
async fn bad_tool_input_is_a_400_naming_the_field() {
    let s = start(Opts::default()).await;
    let user = json!([{"role": "user", "content": "x"}]);
    let base = |extra: Value| {
        let mut b = json!({"model": "mock", "messages": user, "max_tokens": 4});
        if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        b
    };
    let huge: serde_json::Map<String, Value> = (0..1000)
        .map(|i| {
            (
                format!("p{i}"),
                json!({"type": "string", "description": "x".repeat(100)}),
            )
        })
        .collect();
    let rows: Vec<(Value, &str)> = vec![
        (
            json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": tools(), "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        (json!({"tools": tools(), "n": 2}), "n"),
        (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
            "tools[0].function.name",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]}),
            "tools[1].function.name",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": huge}}}]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 5}}}}}], "tool_choice": "required"}),
            "tools",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}),
            "tools[0].function.strict",
        ),
        (
            // a strict tool in `auto` mode is compiled too: its bad schema is a 400
            json!({"tools": [{"type": "function", "function": {"name": "f", "strict": true, "parameters": {"type": "object", "properties": {"a": {"type": 5}}}}}]}),
            "tools",
        ),
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format.type",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}),
            "response_format.json_schema.name",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(?<=a)b"}}}}),
            "response_format",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "r"}]}),
            "messages[0].tool_call_id",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}),
            "messages[0].tool_calls",
        ),
    ];
    for (extra, param) in rows {
        let (st, v) = post(&s, "/v1/chat/completions", base(extra.clone())).await;
        assert_eq!(st, 400, "{extra}: {v}");
        assert_eq!(v["error"]["param"], param, "{extra}: {v}");
        assert!(!v["error"]["message"].as_str().unwrap_or("").is_empty());
    }
}

/// A thinking model's leading `<think>` block comes back as `reasoning_content`, apart from the
/// content, whole and streamed; a call drafted inside it is not a call (the one after it is).
#[tokio::test]
async fn a_think_block_is_reasoning_content_and_never_a_call() {
    let s = start(Opts::default()).await;
    let out = "<think>\nI could call <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n\
               </tool_call>\nbut weather first.\n</think>\n\n<tool_call>\n{\"name\": \
               \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 1}}\n</tool_call>";
    let grammar = format!("start: {}", serde_json::to_string(out).unwrap());
    let body = |stream: bool| {
        json!({"model": "mock", "messages": [{"role": "user", "content": "x"}], "stream": stream,
            "max_tokens": 300, "temperature": 0, "grammar": grammar, "tools": tools()})
    };
    let reasoning = "I could call <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n\
                     </tool_call>\nbut weather first.";
    let (st, v) = post(&s, "/v1/chat/completions", body(false)).await;
    assert_eq!(st, 200, "{v}");
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["reasoning_content"], reasoning, "{v}");
    assert_eq!(msg["content"], Value::Null, "{v}");
    let calls = msg["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");

    let chunks = sse(&s, "/v1/chat/completions", body(true)).await;
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str())
        .collect();
    assert_eq!(streamed, reasoning);
    assert_eq!(stream_text(&chunks), "", "no content besides the call");
    let names: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["name"].as_str())
        .collect();
    assert_eq!(names, ["get_weather"]);
}

/// A prompt that opens the think block (`thinking`, as DeepSeek-V3.1's and R1's templates
/// do) makes the output reasoning up to `</think>`.
#[tokio::test]
async fn a_prompt_that_opens_the_think_block_starts_in_reasoning() {
    let s = start(Opts::default()).await;
    let out = "Short plan.\n</think>\n\nThe answer.";
    let grammar = format!("start: {}", serde_json::to_string(out).unwrap());
    let body = json!({"model": "mock", "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 100, "temperature": 0, "grammar": grammar,
        "chat_template_kwargs": {"thinking": true}});
    let (st, v) = post(&s, "/v1/chat/completions", body).await;
    assert_eq!(st, 200, "{v}");
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["reasoning_content"], "Short plan.", "{v}");
    assert_eq!(msg["content"], "The answer.", "{v}");
}

/// `reasoning_format: "none"` (llama-server's request field) leaves the think block in the
/// content; a value it does not know is a 400 naming the field.
#[tokio::test]
async fn reasoning_format_none_keeps_the_block_in_the_content() {
    let s = start(Opts::default()).await;
    let out = "<think>plan</think>answer";
    let grammar = format!("start: {}", serde_json::to_string(out).unwrap());
    let body = |format: &str| {
        json!({"model": "mock", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 100, "temperature": 0, "grammar": grammar, "reasoning_format": format})
    };
    let (st, v) = post(&s, "/v1/chat/completions", body("none")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], out, "{v}");
    assert!(
        v["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{v}"
    );
    for format in ["deepseek", "auto"] {
        let (st, v) = post(&s, "/v1/chat/completions", body(format)).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(
            v["choices"][0]["message"]["reasoning_content"], "plan",
            "{format}: {v}"
        );
        assert_eq!(
            v["choices"][0]["message"]["content"], "answer",
            "{format}: {v}"
        );
    }
    let (st, v) = post(&s, "/v1/chat/completions", body("sometimes")).await;
    assert_eq!(st, 400, "{v}");
    assert!(v["error"].to_string().contains("reasoning_format"), "{v}");
}

/// Text without a leading think block is all content, and a JSON response format is never
/// split, even after a prompt that opens the block (its output is the answer from the first
/// token).
#[tokio::test]
async fn output_without_a_leading_think_block_is_content() {
    let s = start(Opts::default()).await;
    let out = "Hello <think>not reasoning</think>";
    let grammar = format!("start: {}", serde_json::to_string(out).unwrap());
    let body = json!({"model": "mock", "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 100, "temperature": 0, "grammar": grammar});
    let (st, v) = post(&s, "/v1/chat/completions", body).await;
    assert_eq!(st, 200, "{v}");
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["content"], out, "{v}");
    assert!(msg.get("reasoning_content").is_none(), "{v}");
    let schema = json!({"type": "object", "properties": {"a": {"type": "string", "const": "<think>x</think>"}},
        "required": ["a"], "additionalProperties": false});
    let body = json!({"model": "mock", "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 100, "temperature": 0, "response_format": {"type": "json_schema",
        "json_schema": {"name": "r", "schema": schema, "strict": true}},
        "chat_template_kwargs": {"thinking": true}});
    let (st, v) = post(&s, "/v1/chat/completions", body).await;
    assert_eq!(st, 200, "{v}");
    let msg = &v["choices"][0]["message"];
    assert!(msg.get("reasoning_content").is_none(), "{v}");
    let content: Value = serde_json::from_str(msg["content"].as_str().unwrap()).unwrap();
    assert_eq!(content["a"], "<think>x</think>", "{v}");
}

/// `logit_bias` reaches the sampler: banning the greedy answer's first byte changes it;
/// malformed biases are a 400 naming the entry.
#[tokio::test]
async fn logit_bias_bans_tokens_and_bad_ones_are_named() {
    let s = start(Opts::default()).await;
    let body = |bias: Value| {
        json!({"model": "mock", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4, "temperature": 0, "logit_bias": bias})
    };
    let (st, free) = post(&s, "/v1/chat/completions", body(json!({}))).await;
    assert_eq!(st, 200, "{free}");
    let first = free["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .as_bytes()[0];
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        body(json!({first.to_string(): -100})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        !text.as_bytes().contains(&first),
        "{text:?} still has byte {first}"
    );
    for (bias, param) in [
        (json!({"x": 1}), "logit_bias.x"),
        (json!({"999999": 1}), "logit_bias.999999"),
        (json!({"65": 101}), "logit_bias.65"),
        (json!({"65": "big"}), "logit_bias.65"),
    ] {
        let (st, v) = post(&s, "/v1/chat/completions", body(bias.clone())).await;
        assert_eq!(
            (st, v["error"]["param"].as_str()),
            (400, Some(param)),
            "{bias}: {v}"
        );
    }
}

/// `reasoning_effort` (chat) and `reasoning.effort` (responses) switch a hybrid template's
/// thinking: the toy template opens a think block in the prompt when `thinking` is on.
#[tokio::test]
async fn reasoning_effort_switches_the_templates_thinking() {
    let s = start(Opts::default()).await;
    let chat = |extra: Value| {
        let mut b = json!({"model": "mock", "max_tokens": 1,
            "messages": [{"role": "user", "content": "x"}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let tokens = |v: &Value| v["usage"]["prompt_tokens"].as_u64().unwrap();
    let (_, base) = post(&s, "/v1/chat/completions", chat(json!({}))).await;
    let (_, high) = post(
        &s,
        "/v1/chat/completions",
        chat(json!({"reasoning_effort": "high"})),
    )
    .await;
    let (_, off) = post(
        &s,
        "/v1/chat/completions",
        chat(json!({"reasoning_effort": "minimal"})),
    )
    .await;
    let opened = "<think>\n".len() as u64;
    assert_eq!(tokens(&high), tokens(&base) + opened, "{high}");
    assert_eq!(tokens(&off), tokens(&base), "{off}");
    // the request's own template variables win
    let (_, kw) = post(
        &s,
        "/v1/chat/completions",
        chat(json!({"reasoning_effort": "high", "chat_template_kwargs": {"thinking": false}})),
    )
    .await;
    assert_eq!(tokens(&kw), tokens(&base), "{kw}");
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        chat(json!({"reasoning_effort": "max"})),
    )
    .await;
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (400, Some("reasoning_effort")),
        "{v}"
    );
    let (st, r) = post(
        &s,
        "/v1/responses",
        json!({"model": "mock", "input": "x", "max_output_tokens": 1,
            "reasoning": {"effort": "medium"}}),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["usage"]["input_tokens"].as_u64().unwrap(), tokens(&high));
    let (st, v) = post(
        &s,
        "/v1/responses",
        json!({"model": "mock", "input": "x", "reasoning": {"effort": "max"}}),
    )
    .await;
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (400, Some("reasoning.effort")),
        "{v}"
    );
}
