//! Edge conversion: validated OpenAI request fields -> the scheduler's own types (sampling
//! parameters, stop strings, token budget). Every rejection is an `ApiError` naming the field.

use super::error::ApiError;
use super::types::{ChatMessageIn, Common, Content, Prediction, PromptField, StopField};
use crate::scheduler::{ChatMessage, SamplingParams, ToolCall};

/// Most stop strings accepted.
pub const MAX_STOPS: usize = 16;
/// Most `logit_bias` entries accepted.
pub const MAX_LOGIT_BIAS: usize = 1024;
/// Most `top_logprobs` (chat) accepted.
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// Most `logprobs` (legacy completions) accepted.
pub const MAX_COMPLETION_LOGPROBS: u32 = 5;

/// What both endpoints validate the same way.
#[derive(Debug)]
pub struct Checked {
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
    pub cache_prompt: bool,
    /// false: the request opted out of speculative decoding.
    pub speculative: bool,
}

fn range(param: &str, v: Option<f32>, lo: f32, hi: f32, default: f32) -> Result<f32, ApiError> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(x),
        Some(x) => Err(ApiError::invalid(
            param,
            format!("`{param}` must be between {lo} and {hi}, found {x}"),
        )),
    }
}

/// Checks the model name (the served id or one of its aliases) and the fields shared by chat
/// and completions.
pub fn check_common(
    c: &Common,
    served: &str,
    aliases: &[String],
    vocab: usize,
) -> Result<Checked, ApiError> {
    match &c.model {
        None => return Err(ApiError::invalid("model", "missing required field `model`")),
        Some(m) if m != served && !aliases.contains(m) => {
            return Err(ApiError::model_not_found(m, served))
        }
        Some(_) => {}
    }
    if let Some(n) = c.n {
        if n != 1 {
            return Err(ApiError::invalid(
                "n",
                format!("only n = 1 is supported, found n = {n}"),
            ));
        }
    }
    let temperature = range("temperature", c.temperature, 0.0, 2.0, 1.0)?;
    // 0 is allowed: the sampler's top-p keeps at least one token, so 0 keeps the most probable
    let top_p = range("top_p", c.top_p, 0.0, 1.0, 1.0)?;
    let presence_penalty = range("presence_penalty", c.presence_penalty, -2.0, 2.0, 0.0)?;
    let frequency_penalty = range("frequency_penalty", c.frequency_penalty, -2.0, 2.0, 0.0)?;
    let min_p = range("min_p", c.min_p, 0.0, 1.0, 0.0)?;
    let repeat_penalty = range(
        "repeat_penalty",
        c.repeat_penalty,
        f32::MIN_POSITIVE,
        10.0,
        1.0,
    )?;
    let stop = match &c.stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s.clone()],
        Some(StopField::Many(v)) => v.clone(),
    };
    if stop.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "expected at most {MAX_STOPS} stop strings, found {}",
                stop.len()
            ),
        ));
    }
    let stream = c.stream.unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "`stream_options` is only allowed when `stream` is true",
        ));
    }
    let include_usage = c
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let logit_bias = match &c.logit_bias {
        None => Vec::new(),
        Some(m) => logit_bias(m, vocab)?,
    };
    let sampling = SamplingParams {
        logit_bias,
        temperature,
        top_p,
        top_k: c.top_k.unwrap_or(0) as usize,
        min_p,
        presence_penalty,
        frequency_penalty,
        repetition_penalty: repeat_penalty,
        penalty_last_n: 64,
        seed: c
            .seed
            .map(|s| s as u64)
            .unwrap_or_else(nightshift_model::sampler::fresh_seed),
    };
    Ok(Checked {
        sampling,
        stop,
        stream,
        include_usage,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        cache_prompt: c.cache_prompt.unwrap_or(true),
        speculative: c.speculative.unwrap_or(true),
    })
}

/// OpenAI's `logit_bias`: token ids (JSON keys) below the vocabulary size, biases in
/// -100..=100.
fn logit_bias(
    m: &serde_json::Map<String, serde_json::Value>,
    vocab: usize,
) -> Result<Vec<(u32, f32)>, ApiError> {
    if m.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::invalid(
            "logit_bias",
            format!(
                "expected at most {MAX_LOGIT_BIAS} entries, found {}",
                m.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(m.len());
    for (k, v) in m {
        let param = format!("logit_bias.{k}");
        let token = match k.parse::<u32>() {
            Ok(t) if (t as usize) < vocab => t,
            Ok(t) => {
                return Err(ApiError::invalid(
                    param,
                    format!("token id {t} is out of range: the vocabulary has {vocab} tokens"),
                ))
            }
            Err(_) => {
                return Err(ApiError::invalid(
                    param,
                    format!("keys are token ids, found `{k}`"),
                ))
            }
        };
        match v.as_f64() {
            Some(b) if (-100.0..=100.0).contains(&b) => out.push((token, b as f32)),
            _ => {
                return Err(ApiError::invalid(
                    param,
                    format!("a bias is a number between -100 and 100, found {v}"),
                ))
            }
        }
    }
    Ok(out)
}

/// The chat templates' thinking switches (Qwen3's `enable_thinking`, DeepSeek V3.1's and
/// Kimi's `thinking`) set to `on` in the template variables, unless the request set them itself.
pub fn with_thinking(
    kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    on: bool,
) -> serde_json::Map<String, serde_json::Value> {
    let mut m = kwargs.unwrap_or_default();
    for k in ["enable_thinking", "thinking"] {
        m.entry(k).or_insert(serde_json::Value::Bool(on));
    }
    m
}

/// OpenAI's reasoning effort as a thinking switch: `none` and `minimal` off, `low` to `xhigh`
/// on (None: the template's own default).
pub fn effort_thinking(param: &str, effort: Option<&str>) -> Result<Option<bool>, ApiError> {
    match effort {
        None => Ok(None),
        Some("none" | "minimal") => Ok(Some(false)),
        Some("low" | "medium" | "high" | "xhigh") => Ok(Some(true)),
        Some(other) => Err(ApiError::invalid(
            param,
            format!("expected none, minimal, low, medium, high or xhigh, found `{other}`"),
        )),
    }
}

/// The text of a message content (a string or text parts); `at` names the field in errors.
fn content_text(c: &Content, at: &str) -> Result<String, ApiError> {
    match c {
        Content::Text(t) => Ok(t.clone()),
        Content::Parts(parts) => {
            let mut s = String::new();
            for (j, p) in parts.iter().enumerate() {
                if p.kind != "text" {
                    return Err(ApiError::invalid(
                        format!("{at}[{j}].type"),
                        format!(
                            "only `text` content parts are supported, found `{}`",
                            p.kind
                        ),
                    ));
                }
                match &p.text {
                    Some(t) => s.push_str(t),
                    None => {
                        return Err(ApiError::invalid(
                            format!("{at}[{j}].text"),
                            "a text content part needs a `text` string",
                        ))
                    }
                }
            }
            Ok(s)
        }
    }
}

/// The text of OpenAI's `prediction` (empty without one); only `type: "content"` exists.
pub fn prediction_text(p: Option<&Prediction>) -> Result<String, ApiError> {
    let Some(p) = p else {
        return Ok(String::new());
    };
    if p.kind != "content" {
        return Err(ApiError::invalid(
            "prediction.type",
            format!("expected `content`, found `{}`", p.kind),
        ));
    }
    content_text(&p.content, "prediction.content")
}

/// Converts chat messages (text content, an assistant's tool calls, tool results); only text
/// content parts are supported. A tool result without `name` gets the name of the call it
/// answers, for templates that print it.
pub fn chat_turns(messages: &[ChatMessageIn]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must contain at least one message",
        ));
    }
    let mut turns = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    format!(
                        "expected role system, developer, user, assistant or tool, found `{other}`"
                    ),
                ))
            }
        };
        let content = match &m.content {
            None => String::new(),
            Some(c) => content_text(c, &format!("messages[{i}].content"))?,
        };
        let mut tool_calls = Vec::new();
        if let Some(calls) = &m.tool_calls {
            if role != "assistant" {
                return Err(ApiError::invalid(
                    format!("messages[{i}].tool_calls"),
                    "only assistant messages carry `tool_calls`",
                ));
            }
            for (j, c) in calls.iter().enumerate() {
                if c.kind.as_deref().is_some_and(|k| k != "function") {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].tool_calls[{j}].type"),
                        "only `function` tool calls are supported",
                    ));
                }
                let arguments = match &c.function.arguments {
                    None | Some(serde_json::Value::Null) => "{}".to_string(),
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(v) => v.to_string(),
                };
                tool_calls.push(ToolCall {
                    id: c.id.clone().unwrap_or_else(|| format!("call_{i}_{j}")),
                    name: c.function.name.clone(),
                    arguments,
                });
            }
        }
        let mut name = m.name.clone();
        if role == "tool" {
            let Some(id) = &m.tool_call_id else {
                return Err(ApiError::invalid(
                    format!("messages[{i}].tool_call_id"),
                    "a tool message needs the `tool_call_id` it answers",
                ));
            };
            if name.is_none() {
                name = turns.iter().rev().find_map(|t: &ChatMessage| {
                    t.tool_calls
                        .iter()
                        .find(|c| &c.id == id)
                        .map(|c| c.name.clone())
                });
            }
        }
        turns.push(ChatMessage {
            role: role.to_string(),
            content,
            tool_calls,
            tool_call_id: m.tool_call_id.clone(),
            name,
            reasoning_content: m.reasoning_content.clone(),
        });
    }
    Ok(turns)
}

/// The single prompt of a completion request: text or token ids (n = 1: one prompt only).
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// The single prompt of a completion request. `[]` (no text, no ids) reads as an empty list
/// of token ids, as `[[]]` does: both have no tokens ([`empty_prompt`]).
pub fn single_prompt(p: &PromptField) -> Result<Prompt, ApiError> {
    let many = |n: usize| {
        ApiError::invalid(
            "prompt",
            format!("only one prompt per request is supported, found {n}"),
        )
    };
    match p {
        PromptField::Text(s) => Ok(Prompt::Text(s.clone())),
        PromptField::Tokens(t) => Ok(Prompt::Tokens(t.clone())),
        PromptField::Texts(v) if v.is_empty() => Ok(Prompt::Tokens(Vec::new())),
        PromptField::Texts(v) if v.len() == 1 => Ok(Prompt::Text(v[0].clone())),
        PromptField::Texts(v) => Err(many(v.len())),
        PromptField::TokenLists(v) if v.len() == 1 => Ok(Prompt::Tokens(v[0].clone())),
        PromptField::TokenLists(v) => Err(many(v.len())),
    }
}

/// Why a prompt whose text gave no tokens is refused.
const EMPTY_AFTER_TOKENIZATION: &str = "the prompt is empty after tokenization";

/// The 400 for a completion prompt that tokenized to nothing (`text_len`: the text's length in
/// bytes, None for token ids). A text prompt is tokenized as the model does (an empty one is
/// the model's BOS token alone, when it adds one); token ids are taken as given, never with a
/// BOS added. Either way a prompt needs a token to start from.
pub fn empty_prompt(text_len: Option<usize>) -> ApiError {
    let why = match text_len {
        Some(0) => {
            "the prompt is empty and this model adds no BOS token, so it has no tokens; \
             send at least one character or token id"
        }
        Some(_) => EMPTY_AFTER_TOKENIZATION,
        None => {
            "the prompt has no token ids (ids are used as given, without a BOS token); \
             send at least one"
        }
    };
    ApiError::invalid("prompt", why)
}

/// Token budget: `asked` or what is left of the context; errors name both numbers.
pub fn max_tokens(
    param: &str,
    asked: Option<u32>,
    default: Option<u32>,
    prompt: usize,
    n_ctx: usize,
) -> Result<u32, ApiError> {
    if asked == Some(0) {
        return Err(ApiError::invalid(
            "max_tokens",
            "`max_tokens` must be at least 1, found 0",
        ));
    }
    if prompt == 0 {
        return Err(ApiError::invalid("prompt", EMPTY_AFTER_TOKENIZATION));
    }
    let want = asked
        .or(default)
        .map(|m| m as usize)
        .unwrap_or(n_ctx.saturating_sub(prompt))
        .max(1);
    if prompt + want > n_ctx {
        if asked.is_none() && prompt < n_ctx {
            return Ok((n_ctx - prompt) as u32);
        }
        return Err(ApiError::context_overflow(param, n_ctx, prompt, want));
    }
    Ok(want as u32)
}

/// Rejects, before tokenizing, a prompt of `bytes` that cannot leave room for one completion
/// token in `n_ctx` even if every token were the vocabulary's longest (`longest` bytes).
pub fn cheap_bound(
    param: &str,
    bytes: usize,
    longest: usize,
    n_ctx: usize,
) -> Result<(), ApiError> {
    let min_tokens = bytes.div_ceil(longest.max(1));
    if min_tokens >= n_ctx {
        return Err(ApiError::prompt_too_long(param, bytes, min_tokens, n_ctx));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_budget() {
        // (asked, default, prompt, n_ctx) -> Ok(budget) or Err(status)
        let check = |a, d, p, n, expect: Result<u32, u16>| {
            let got = max_tokens("prompt", a, d, p, n).map_err(|e| e.status.as_u16());
            assert_eq!(got, expect, "asked {a:?} default {d:?} prompt {p} ctx {n}");
        };
        check(Some(10), None, 5, 100, Ok(10));
        check(None, None, 5, 100, Ok(95));
        check(None, Some(16), 5, 100, Ok(16));
        check(None, Some(16), 90, 100, Ok(10));
        check(Some(96), None, 5, 100, Err(400));
        check(None, None, 100, 100, Err(400));
        check(Some(0), None, 5, 100, Err(400));
        check(Some(1), None, 0, 100, Err(400));
        for param in ["prompt", "messages"] {
            let e = max_tokens(param, Some(96), None, 5, 100).unwrap_err();
            assert!(
                e.message.contains("100") && e.message.contains("101"),
                "{}",
                e.message
            );
            assert_eq!(e.param.as_deref(), Some(param));
            assert_eq!(e.code, Some("context_length_exceeded"));
        }
    }

    #[test]
    fn cheap_bound_rejects_only_what_cannot_fit() {
        // (bytes, longest token, n_ctx) -> fits
        let check = |b, l, n, fits: bool| {
            let got = cheap_bound("prompt", b, l, n);
            assert_eq!(got.is_ok(), fits, "{b} bytes, longest {l}, ctx {n}");
            if let Err(e) = got {
                assert_eq!(e.param.as_deref(), Some("prompt"));
                assert_eq!(e.code, Some("context_length_exceeded"));
                assert!(e.message.contains(&b.to_string()), "{}", e.message);
            }
        };
        check(0, 16, 100, true);
        check(99 * 16, 16, 100, true);
        check(99 * 16 + 1, 16, 100, false);
        check(100 * 16, 16, 100, false);
        check(3_900_000, 256, 4096, false);
        check(5, 0, 100, true);
    }
}
