//! The JSONL prompt set that `nightshift-atlas record` runs (in process or through a
//! coordinator): one `{"prompt": "..."}` or `{"messages": [{"role", "content"}, ...]}` per line.
//! The whole file is parsed before anything runs, so a bad line fails fast with its line number.

use std::path::Path;

use anyhow::{bail, Context, Result};

/// One chat message of a prompt line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// One JSONL line: a raw prompt or chat messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptLine {
    Raw(String),
    Chat(Vec<Message>),
}

const EXPECTED: &str =
    r#"expected {"prompt": "..."} or {"messages": [{"role": "...", "content": "..."}, ...]}"#;

/// Parses line `n` (1-based, for messages) of a prompt set.
pub fn parse_line(n: usize, line: &str) -> Result<PromptLine> {
    let v: serde_json::Value = serde_json::from_str(line)
        .map_err(|e| anyhow::anyhow!("line {n}: not JSON ({e}); {EXPECTED}"))?;
    if let Some(p) = v.get("prompt") {
        return match p.as_str() {
            Some(s) => Ok(PromptLine::Raw(s.to_string())),
            None => bail!("line {n}: \"prompt\" must be a string; {EXPECTED}"),
        };
    }
    let Some(msgs) = v.get("messages").and_then(|m| m.as_array()) else {
        bail!("line {n}: {EXPECTED}, found {}", short(line));
    };
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let role = m.get("role").and_then(|r| r.as_str());
        let content = m.get("content").and_then(|c| c.as_str());
        match (role, content) {
            (Some(r), Some(c)) => out.push(Message {
                role: r.to_string(),
                content: c.to_string(),
            }),
            _ => bail!("line {n}: message {i} needs string \"role\" and \"content\"; {EXPECTED}"),
        }
    }
    if out.is_empty() {
        bail!("line {n}: \"messages\" is empty; {EXPECTED}");
    }
    Ok(PromptLine::Chat(out))
}

/// Reads and parses a whole JSONL prompt file (blank lines skipped; at least one prompt).
pub fn read_prompts(path: &Path) -> Result<Vec<PromptLine>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read prompts file {}", path.display()))?;
    let mut lines = Vec::new();
    for (i, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        lines.push(parse_line(i + 1, l).with_context(|| format!("{}", path.display()))?);
    }
    if lines.is_empty() {
        bail!(
            "{}: expected at least one prompt line, found none",
            path.display()
        );
    }
    Ok(lines)
}

fn short(s: &str) -> String {
    let t: String = s.chars().take(80).collect();
    if t.len() < s.len() {
        format!("{t}...")
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(line: &str, expect: Result<PromptLine, &str>) {
        match (parse_line(3, line), expect) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{line}"),
            (Err(e), Err(needle)) => {
                let msg = format!("{e:#}");
                assert!(msg.contains(needle), "{line}: {msg}");
                assert!(msg.starts_with("line 3:"), "{msg}");
            }
            (got, want) => panic!("{line}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn prompt_lines() {
        let msg = |r: &str, c: &str| Message {
            role: r.into(),
            content: c.into(),
        };
        check(r#"{"prompt": "hi"}"#, Ok(PromptLine::Raw("hi".into())));
        check(
            r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}"#,
            Ok(PromptLine::Chat(vec![
                msg("user", "a"),
                msg("assistant", "b"),
            ])),
        );
        check(r#"{"prompt": 3}"#, Err("\"prompt\" must be a string"));
        check(r#"{"messages": []}"#, Err("\"messages\" is empty"));
        check(
            r#"{"messages": [{"role": "user"}]}"#,
            Err("message 0 needs"),
        );
        check(r#"{"text": "x"}"#, Err("found {\"text\""));
        check("not json", Err("not JSON"));
    }
}
