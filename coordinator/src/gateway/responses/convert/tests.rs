//! The conversion's tests: items into chat messages, tools as the model sees them,
//! truncation, and errors named as the Responses API names its fields.

use super::*;
use crate::gateway::types::Content;

fn items(v: Value) -> Vec<Item> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| Item::from_value(x.clone()).unwrap())
        .collect()
}

#[test]
fn an_agent_turn_becomes_one_assistant_message_with_its_calls() {
    let it = items(json!([
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "two cities"}]},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{\"c\":\"Paris\"}"},
        {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{\"c\":\"Rome\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Sunny and rain.", "annotations": []}]},
        {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]}
    ]));
    let m = chat_messages(&it).unwrap();
    let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool", "tool", "assistant", "user"]
    );
    let calls = m[1].tool_calls.as_ref().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].id.as_deref(), Some("c2"));
    assert_eq!(m[1].reasoning_content.as_deref(), Some("two cities"));
    assert!(m[1].content.is_none());
    assert_eq!(m[3].tool_call_id.as_deref(), Some("c2"));
    assert!(matches!(&m[3].content, Some(Content::Text(t)) if t == "rain"));
    assert!(m[4].reasoning_content.is_none());
}

#[test]
fn unsupported_items_and_parts_name_their_place() {
    let e = Item::from_value(json!({"type": "web_search_call", "id": "x"})).unwrap_err();
    assert!(e.contains("web_search_call"), "{e}");
    let it = items(json!([{"role": "user", "content": [
        {"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "x"}]}]));
    let e = chat_messages(&it).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("input[0].content[1].type"));
    let e = chat_tools(&[json!({"type": "function"})]).err().unwrap();
    assert_eq!(e.param.as_deref(), Some("tools[0].name"));
    let e = chat_format(&json!({"type": "grammar"})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("text.format.type"));
}

#[test]
fn flat_tools_and_formats_take_chat_shape() {
    let seen = chat_tools(
        &[json!({"type": "function", "name": "f", "description": "d",
            "parameters": {"type": "object"}, "strict": true})],
    )
    .unwrap();
    let t = seen.tools[0].clone();
    assert_eq!(
        t,
        json!({"type": "function", "function": {"name": "f", "description": "d",
            "parameters": {"type": "object"}, "strict": true}})
    );
    let keys: Vec<&String> = t["function"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["name", "description", "parameters", "strict"]);
    assert_eq!(
        chat_tool_choice(&json!({"type": "function", "name": "f"})).unwrap(),
        json!({"type": "function", "function": {"name": "f"}})
    );
    let f = chat_format(&json!({"type": "json_schema", "name": "r",
        "schema": {"type": "object"}, "strict": true}))
    .unwrap()
    .unwrap();
    assert_eq!(f["json_schema"]["schema"], json!({"type": "object"}));
    assert_eq!(chat_format(&json!({"type": "text"})).unwrap(), None);
}

/// Codex's tool list: functions, a namespace of a function and a custom tool, a hosted
/// tool. The model sees the functions (the namespace's as `ns.name`); the hosted tool is
/// left out.
#[test]
fn namespaces_flatten_and_hosted_tools_are_left_out() {
    let seen = chat_tools(&[
        json!({"type": "function", "name": "exec", "parameters": {"type": "object"}}),
        json!({"type": "namespace", "name": "agents", "description": "d", "tools": [
            {"type": "function", "name": "spawn", "parameters": {"type": "object"}},
            {"type": "custom", "name": "free"}]}),
        json!({"type": "web_search", "external_web_access": false}),
    ])
    .unwrap();
    let names: Vec<&str> = seen
        .tools
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["exec", "agents.spawn", "agents.free"]);
    assert_eq!(seen.namespaces, ["agents"]);
    assert_eq!(seen.custom, ["agents.free"]);
    assert_eq!(seen.skipped, ["tools[2] (web_search)"]);
    let ns = seen.namespaces;
    assert_eq!(
        split_namespace("agents.spawn", &ns),
        (Some("agents".into()), "spawn")
    );
    assert_eq!(
        split_namespace("agentsX.spawn", &ns),
        (None, "agentsX.spawn")
    );
    assert_eq!(split_namespace("exec", &ns), (None, "exec"));
    // a namespaced call sent back reaches the template under the name the model wrote
    let it = items(json!([{"role": "user", "content": "x"},
        {"type": "function_call", "call_id": "c", "name": "spawn", "namespace": "agents",
         "arguments": "{}"}]));
    let m = chat_messages(&it).unwrap();
    assert_eq!(
        m[1].tool_calls.as_ref().unwrap()[0].function.name,
        "agents.spawn"
    );
}

/// A custom (free-form) tool is a function of one string for the model; its call and
/// output sent back reach the template as a call with `{"input": ..}` and a tool message.
#[test]
fn custom_tools_are_functions_of_one_string() {
    let seen = chat_tools(&[json!({"type": "custom", "name": "apply_patch",
        "description": "Patch files.",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}})])
    .unwrap();
    let f = &seen.tools[0]["function"];
    assert_eq!(f["name"], "apply_patch");
    assert_eq!(f["parameters"]["required"], json!(["input"]));
    assert!(f["description"]
        .as_str()
        .unwrap()
        .ends_with("lark grammar:\nstart: /.+/"));
    assert_eq!(seen.custom, ["apply_patch"]);
    let it = items(json!([{"role": "user", "content": "x"},
        {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch",
         "input": "*** Begin Patch\n\"q\""},
        {"type": "custom_tool_call_output", "call_id": "c", "output": "done"}]));
    let m = chat_messages(&it).unwrap();
    let call = &m[1].tool_calls.as_ref().unwrap()[0];
    let Some(Value::String(args)) = &call.function.arguments else {
        panic!("{call:?}")
    };
    assert_eq!(custom_input(args), "*** Begin Patch\n\"q\"");
    assert_eq!(m[2].role, "tool");
    assert_eq!(custom_input("{\"input\": 5}"), "5");
    assert_eq!(custom_input("not json"), "not json");
}

#[test]
fn truncation_drops_whole_turns_and_keeps_the_system_prompt() {
    let it = items(json!([
        {"role": "developer", "content": "sys"},
        {"role": "user", "content": "u1"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "o"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "u3"}
    ]));
    assert_eq!(next_turn(&it, 0), Some(4));
    assert_eq!(next_turn(&it, 4), Some(6));
    assert_eq!(next_turn(&it, 6), None);
    // skipping starts after the system prompt: it stays
    let kept = from_turn(&it, 4);
    assert_eq!(kept.len(), 4);
    let m = chat_messages(&kept).unwrap();
    assert_eq!(m[0].role, "developer");
    assert!(matches!(&m[1].content, Some(Content::Text(t)) if t == "u2"));
    assert_eq!(from_turn(&it, 0).len(), it.len());
}

#[test]
fn errors_name_the_responses_fields() {
    let e = rename(ApiError::invalid("messages[2].content", "x"));
    assert_eq!(e.param.as_deref(), Some("input[2].content"));
    let e = rename(ApiError::invalid("max_completion_tokens", "x"));
    assert_eq!(e.param.as_deref(), Some("max_output_tokens"));
    let e = rename(ApiError::invalid("response_format.json_schema.schema", "x"));
    assert_eq!(e.param.as_deref(), Some("text.format.schema"));
    let e = rename(ApiError::invalid("tools[1].function.parameters", "x"));
    assert_eq!(e.param.as_deref(), Some("tools[1].parameters"));
}
