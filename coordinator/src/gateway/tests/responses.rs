//! `/v1/responses` over the mock model: the same prompt and answer as the equivalent chat
//! request, its stream's events in order and adding up to the whole response, function calls
//! and their outputs, reasoning items, stored responses continued with
//! `previous_response_id`, `truncation: auto`, and bad input answered with a 400 naming the
//! field.

use super::tool_api::tools as chat_tools;
use super::*;

/// The chat tools in the Responses API's flat shape.
fn flat_tools() -> Value {
    let v: Vec<Value> = chat_tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let mut f = t["function"].clone();
            f["type"] = json!("function");
            f
        })
        .collect();
    Value::Array(v)
}

async fn events(s: &Server, body: Value) -> Vec<(String, Value)> {
    named_events(s, "/v1/responses", body).await
}

#[tokio::test]
async fn a_response_is_the_chat_answer_in_items() {
    let s = start(Opts::default()).await;
    let (st, chat) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "mock", "max_tokens": 12, "temperature": 0, "messages": [
            {"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]}),
    )
    .await;
    assert_eq!(st, 200, "{chat}");
    let body = json!({"model": "mock", "instructions": "be brief", "input": "hello",
        "max_output_tokens": 12, "temperature": 0});
    let (st, v) = post(&s, "/v1/responses", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "response");
    assert!(v["id"].as_str().unwrap_or("").starts_with("resp_"), "{v}");
    assert_eq!(
        v["usage"]["input_tokens"], chat["usage"]["prompt_tokens"],
        "same prompt as the chat request"
    );
    assert_eq!(
        output_text(&v),
        chat["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let n = v["usage"]["output_tokens"].as_u64().unwrap();
    assert_eq!(
        v["usage"]["total_tokens"].as_u64().unwrap(),
        v["usage"]["input_tokens"].as_u64().unwrap() + n
    );
    let status = if chat["choices"][0]["finish_reason"] == "length" {
        assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
        "incomplete"
    } else {
        "completed"
    };
    assert_eq!(v["status"], status, "{v}");
    assert_eq!(v["output"][0]["role"], "assistant");
    assert_eq!(v["output"][0]["status"], "completed");

    // the stream: created, in_progress, the item's events, then the finished response, whose
    // output is the non-streamed one's
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let ev = events(&s, sb).await;
    let names: Vec<&str> = ev.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names[..2], ["response.created", "response.in_progress"]);
    assert_eq!(ev[0].1["response"]["status"], "in_progress");
    assert_eq!(
        names.last().copied(),
        Some(format!("response.{status}").as_str())
    );
    for (k, e) in ev.iter().enumerate() {
        assert_eq!(e.1["sequence_number"], k as u64, "{names:?}");
    }
    let deltas: String = ev
        .iter()
        .filter(|e| e.0 == "response.output_text.delta")
        .map(|e| e.1["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deltas, output_text(&v));
    let last = &ev.last().unwrap().1["response"];
    assert_eq!(output_text(last), output_text(&v));
    assert_eq!(last["usage"], v["usage"]);
    for n in [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ] {
        assert_eq!(
            names.iter().filter(|x| **x == n).count(),
            1,
            "{n}: {names:?}"
        );
    }
}

#[tokio::test]
async fn function_calls_and_their_outputs_go_both_ways() {
    let s = start(Opts::default()).await;
    let body = |stream: bool| {
        json!({"model": "mock", "input": "weather?", "tools": flat_tools(),
            "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": false, "max_output_tokens": 200, "temperature": 0,
            "stream": stream})
    };
    let (st, v) = post(&s, "/v1/responses", body(false)).await;
    assert_eq!(st, 200, "{v}");
    let out = v["output"].as_array().unwrap();
    assert_eq!(out.len(), 1, "{v}");
    let call = &out[0];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "get_weather");
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
    assert!(call["id"].as_str().unwrap().starts_with("fc_"));
    super::tool_api::check_weather_args(call["arguments"].as_str().unwrap());

    let ev = events(&s, body(true)).await;
    let args: String = ev
        .iter()
        .filter(|e| e.0 == "response.function_call_arguments.delta")
        .map(|e| e.1["delta"].as_str().unwrap().to_string())
        .collect();
    let done = ev
        .iter()
        .find(|e| e.0 == "response.function_call_arguments.done")
        .expect("arguments done");
    assert_eq!(done.1["arguments"].as_str().unwrap(), args);
    super::tool_api::check_weather_args(&args);
    assert!(
        ev.iter()
            .filter(|e| e.0 == "response.function_call_arguments.delta")
            .count()
            > 1,
        "the arguments stream as they are generated"
    );

    // the call and its output sent back: the same prompt as chat's tool conversation
    let chat_conv = json!([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    ]);
    let (_, chat) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "mock", "messages": chat_conv, "tools": chat_tools(), "max_tokens": 4}),
    )
    .await;
    let input = json!([
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\": \"Paris\", \"days\": 1}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
    ]);
    let (st, v) = post(
        &s,
        "/v1/responses",
        json!({"model": "mock", "input": input, "tools": flat_tools(), "max_output_tokens": 4}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
}

/// A think block becomes a reasoning item before the call; streamed as reasoning_text deltas.
#[tokio::test]
async fn reasoning_is_its_own_item() {
    let s = start(Opts::default()).await;
    let out = "<think>\nweather first.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \
               \"arguments\": {\"city\": \"Paris\", \"days\": 1}}\n</tool_call>";
    let grammar = format!("start: {}", serde_json::to_string(out).unwrap());
    let body = |stream: bool| {
        json!({"model": "mock", "input": "x", "stream": stream, "max_output_tokens": 300,
            "temperature": 0, "grammar": grammar, "tools": flat_tools()})
    };
    let (st, v) = post(&s, "/v1/responses", body(false)).await;
    assert_eq!(st, 200, "{v}");
    let kinds: Vec<&str> = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["reasoning", "function_call"], "{v}");
    assert_eq!(v["output"][0]["content"][0]["text"], "weather first.");
    assert_eq!(v["output"][0]["content"][0]["type"], "reasoning_text");
    let r = v["usage"]["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        r >= "weather first.".len() as u64 && r < v["usage"]["output_tokens"].as_u64().unwrap(),
        "{v}"
    );
    let ev = events(&s, body(true)).await;
    let reasoning: String = ev
        .iter()
        .filter(|e| e.0 == "response.reasoning_text.delta")
        .map(|e| e.1["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(reasoning, "weather first.");

    // sent back, the reasoning item rides on the assistant turn of the call
    let input = json!([{"role": "user", "content": "x"}, v["output"][0], v["output"][1],
        {"type": "function_call_output", "call_id": v["output"][1]["call_id"], "output": "ok"}]);
    let (st, v2) = post(
        &s,
        "/v1/responses",
        json!({"model": "mock", "input": input, "tools": flat_tools(), "max_output_tokens": 2}),
    )
    .await;
    assert_eq!(st, 200, "{v2}");
}

#[tokio::test]
async fn stored_responses_continue_and_can_be_read_and_deleted() {
    let s = start(Opts {
        prefix: true,
        ..Opts::default()
    })
    .await;
    let first = json!({"model": "mock", "input": "tell me a story", "max_output_tokens": 8,
        "temperature": 0});
    let (st, r1) = post(&s, "/v1/responses", first).await;
    assert_eq!(st, 200, "{r1}");
    let id = r1["id"].as_str().unwrap().to_string();
    let a1 = output_text(&r1);
    // continuing equals sending the whole conversation
    let (_, whole) = post(
        &s,
        "/v1/responses",
        json!({"model": "mock", "max_output_tokens": 8, "temperature": 0, "store": false,
            "input": [{"role": "user", "content": "tell me a story"},
                      {"role": "assistant", "content": a1},
                      {"role": "user", "content": "more"}]}),
    )
    .await;
    let (st, r2) = post(
        &s,
        "/v1/responses",
        json!({"model": "mock", "input": "more", "previous_response_id": id,
            "max_output_tokens": 8, "temperature": 0}),
    )
    .await;
    assert_eq!(st, 200, "{r2}");
    assert_eq!(r2["previous_response_id"], id.as_str());
    assert_eq!(r2["usage"]["input_tokens"], whole["usage"]["input_tokens"]);
    assert_eq!(output_text(&r2), output_text(&whole));
    assert!(
        r2["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0,
        "the earlier turn's prefix is cached: {r2}"
    );
    // GET and DELETE
    let c = reqwest::Client::new();
    let got: Value = c
        .get(format!("{}/v1/responses/{id}", s.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["id"], id.as_str());
    assert_eq!(output_text(&got), a1);
    let del = c
        .delete(format!("{}/v1/responses/{id}", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(del.status().as_u16(), 200);
    let del: Value = del.json().await.unwrap();
    assert_eq!(del["deleted"], true);
    let gone = c
        .get(format!("{}/v1/responses/{id}", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status().as_u16(), 404);
    // r2's chain lost its first response: continuing it is a 400 naming the field
    let (st, v) = post(
        &s,
        "/v1/responses",
        json!({"model": "mock", "input": "again", "previous_response_id": r2["id"]}),
    )
    .await;
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (400, Some("previous_response_id")),
        "{v}"
    );
    // store: false keeps nothing
    let unstored = whole["id"].as_str().unwrap();
    let r = c
        .get(format!("{}/v1/responses/{unstored}", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
}

#[tokio::test]
async fn truncation_auto_drops_old_turns_until_the_input_fits() {
    let s = start(Opts {
        n_ctx: 160,
        ..Opts::default()
    })
    .await;
    // the whole input is longer than the context (an output budget alone never fails a
    // request here: it is an upper bound)
    let long = "x".repeat(100);
    let input = json!([
        {"role": "developer", "content": "sys"},
        {"role": "user", "content": long}, {"role": "assistant", "content": long},
        {"role": "user", "content": "short question"}
    ]);
    let body =
        |t: &str| json!({"model": "mock", "input": input, "max_output_tokens": 8, "truncation": t});
    let (st, v) = post(&s, "/v1/responses", body("disabled")).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["param"], "input");
    let (st, v) = post(&s, "/v1/responses", body("auto")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["truncation"], "auto");
    // what is left: the system prompt and the last turn
    let kept = "<system>sys\n<user>short question\n<assistant>".len() as u64;
    assert_eq!(v["usage"]["input_tokens"], kept);
}

#[tokio::test]
async fn bad_responses_input_is_a_400_naming_the_field() {
    let s = start(Opts::default()).await;
    let cases = [
        (json!({"model": "mock"}), "input"),
        (json!({"model": "mock", "input": 5}), "input"),
        (
            json!({"model": "mock", "input": [{"type": "web_search_call", "id": "w"}]}),
            "input",
        ),
        (
            json!({"model": "mock", "input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": "http://x"}]}]}),
            "input[0].content[0].type",
        ),
        (
            json!({"model": "mock", "input": "x", "tools": [{"type": "web_search"}],
                "tool_choice": {"type": "web_search"}}),
            "tool_choice.type",
        ),
        (
            json!({"model": "mock", "input": "x", "tools": [{"type": "namespace", "name": "n"}]}),
            "tools[0].tools",
        ),
        (
            json!({"model": "mock", "input": "x", "text": {"format": {"type": "yaml"}}}),
            "text.format.type",
        ),
        (
            json!({"model": "mock", "input": "x", "previous_response_id": "resp_nope"}),
            "previous_response_id",
        ),
        (
            json!({"model": "mock", "input": "x", "truncation": "sometimes"}),
            "truncation",
        ),
        (
            json!({"model": "mock", "input": "x", "metadata": {"k": 1}}),
            "metadata.k",
        ),
        (
            json!({"model": "mock", "input": "x", "top_logprobs": 3}),
            "top_logprobs",
        ),
    ];
    for (body, param) in cases {
        let (st, v) = post(&s, "/v1/responses", body.clone()).await;
        assert_eq!(st, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
    }
    let (st, v) = post(&s, "/v1/responses", json!({"model": "other", "input": "x"})).await;
    assert_eq!(st, 404, "{v}");
}

#[tokio::test]
async fn json_schema_format_and_logprobs() {
    let s = start(Opts::default()).await;
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"], "additionalProperties": false});
    let (st, v) = post(
        &s,
        "/v1/responses",
        json!({"model": "mock", "input": "x", "max_output_tokens": 100, "temperature": 0,
            "text": {"format": {"type": "json_schema", "name": "r", "schema": schema,
                                "strict": true}},
            "include": ["message.output_text.logprobs"], "top_logprobs": 2}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let text = output_text(&v);
    let got: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert!(got["ok"].is_boolean(), "{text}");
    assert_eq!(v["text"]["format"]["type"], "json_schema");
    let lps = v["output"][0]["content"][0]["logprobs"].as_array().unwrap();
    let joined: String = lps.iter().map(|l| l["token"].as_str().unwrap()).collect();
    assert_eq!(joined, text, "one logprob per output token");
    assert!(lps
        .iter()
        .all(|l| l["top_logprobs"].as_array().unwrap().len() == 2));
}

/// Codex's tools: a namespace of functions and a hosted `web_search` beside plain functions.
/// The hosted tool is left out, a namespace's function is called as `ns.name` and its call
/// comes back with `namespace`, and the call sent back reaches the same prompt.
#[tokio::test]
async fn namespace_tools_and_hosted_tools_as_codex_sends_them() {
    let s = start(Opts::default()).await;
    let weather = flat_tools()[0].clone();
    let tools = json!([{"type": "web_search", "external_web_access": false},
        {"type": "namespace", "name": "wx", "description": "weather tools", "tools": [weather]},
        flat_tools()[1]]);
    let body = json!({"model": "mock", "input": "weather?", "tools": tools,
        "tool_choice": {"type": "function", "name": "get_weather", "namespace": "wx"},
        "parallel_tool_calls": false, "max_output_tokens": 200, "temperature": 0,
        "store": false, "include": ["reasoning.encrypted_content"]});
    let (st, v) = post(&s, "/v1/responses", body).await;
    assert_eq!(st, 200, "{v}");
    let call = &v["output"][0];
    assert_eq!(call["type"], "function_call", "{v}");
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["namespace"], "wx");
    super::tool_api::check_weather_args(call["arguments"].as_str().unwrap());
    // the tool list the model saw: the namespace's function as wx.get_weather, no web_search
    let (_, chat) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "mock", "max_tokens": 1, "messages": [{"role": "user", "content": "q"}],
            "tools": [{"type": "function", "function": {"name": "wx.get_weather"}},
                      {"type": "function", "function": {"name": "get_time"}}]}),
    )
    .await;
    let (st, r) = post(
        &s,
        "/v1/responses",
        json!({"model": "mock", "input": "q", "tools": tools, "max_output_tokens": 1}),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
}

/// A custom (free-form) tool, as Codex declares `apply_patch` for some models: a forced call
/// comes back as a `custom_tool_call` whose `input` is the text, whole and streamed.
#[tokio::test]
async fn custom_tool_calls_carry_plain_text_input() {
    let s = start(Opts::default()).await;
    let body = |stream: bool| {
        json!({"model": "mock", "input": "patch it", "max_output_tokens": 120, "temperature": 0,
            "stream": stream,
            "tools": [{"type": "custom", "name": "apply_patch", "description": "Patch files."}],
            "tool_choice": {"type": "custom", "name": "apply_patch"}})
    };
    let (st, v) = post(&s, "/v1/responses", body(false)).await;
    assert_eq!(st, 200, "{v}");
    let call = &v["output"][0];
    assert_eq!(call["type"], "custom_tool_call", "{v}");
    assert_eq!(call["name"], "apply_patch");
    assert!(call["input"].is_string(), "{v}");
    assert!(call.get("arguments").is_none(), "{v}");
    let ev = events(&s, body(true)).await;
    let done = ev
        .iter()
        .find(|e| e.0 == "response.custom_tool_call_input.done")
        .expect("input done");
    let last = &ev.last().unwrap().1["response"]["output"][0];
    assert_eq!(done.1["input"], last["input"]);
    assert_eq!(last["type"], "custom_tool_call");
}

/// `GET /v1/responses/{id}/input_items`: the request's own input items, ids given to those
/// sent without one, newest first by default, paged with `limit` and `after`.
#[tokio::test]
async fn input_items_page_through_a_stored_requests_input() {
    let s = start(Opts::default()).await;
    let input = json!([{"role": "user", "content": "a"},
        {"type": "message", "id": "msg_given", "role": "assistant", "content": "b"},
        {"role": "user", "content": "c"}]);
    let (st, r) = post(
        &s,
        "/v1/responses",
        json!({"model": "mock", "input": input, "max_output_tokens": 1}),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    let id = r["id"].as_str().unwrap();
    let get = |q: String| {
        let url = format!("{}/v1/responses/{id}/input_items{q}", s.url);
        async move {
            let r = reqwest::get(url).await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (st, all) = get(String::new()).await;
    assert_eq!(st, 200, "{all}");
    let texts: Vec<&str> = all["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["content"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["c", "b", "a"], "newest first");
    assert_eq!(all["data"][1]["id"], "msg_given");
    assert!(all["data"][0]["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(all["has_more"], false);
    let (_, page) = get("?order=asc&limit=2".into()).await;
    assert_eq!(page["data"].as_array().unwrap().len(), 2);
    assert_eq!(page["has_more"], true);
    assert_eq!(page["last_id"], "msg_given");
    let (_, rest) = get("?order=asc&after=msg_given".into()).await;
    assert_eq!(rest["data"][0]["content"], "c");
    assert_eq!(rest["has_more"], false);
    for (q, param) in [
        ("?limit=0", "limit"),
        ("?order=up", "order"),
        ("?after=nope", "after"),
    ] {
        let (st, v) = get(q.into()).await;
        assert_eq!(
            (st, v["error"]["param"].as_str()),
            (400, Some(param)),
            "{q}: {v}"
        );
    }
    let r = reqwest::get(format!("{}/v1/responses/resp_nope/input_items", s.url))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
}
