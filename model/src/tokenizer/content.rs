//! Message contents are plain text: the chat template's own markup is the only source of special
//! tokens in a rendered chat prompt. A message containing `<|im_start|>` must not open a turn.
//!
//! The template cannot be told which parts of its output came from a message (it concatenates,
//! strips and splits them), so the contents go in *protected*: every special-token text in them is
//! replaced by a placeholder (`U+FDD0`, the token id in decimal, `U+FDD1`; both are Unicode
//! noncharacters, and literal ones in a message are escaped the same way), the template renders,
//! and [`Tokenizer::restore_content`] puts the texts back and returns their byte ranges, which
//! [`Tokenizer::encode_with_plain`] tokenizes as the plain text they are. A content with no special
//! text renders and tokenizes exactly as before; one with special text gives the same string with
//! those bytes tokenized by BPE.

use std::ops::Range;

use super::{Frag, TokenType, Tokenizer};

const OPEN: char = '\u{FDD0}';
const CLOSE: char = '\u{FDD1}';
/// Placeholder bodies of literal `OPEN` / `CLOSE` characters in a message.
const LIT_OPEN: &str = "o";
const LIT_CLOSE: &str = "c";

/// Which special tokens a content may not produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protect {
    /// Every special token: control, user-defined, unknown (user, system and tool messages).
    All,
    /// Control and unknown tokens; user-defined ones (`<think>`, `<tool_call>`: the model's own
    /// markup, which templates look for in earlier assistant turns) are kept.
    Control,
}

impl Tokenizer {
    /// `content` with every special-token text that `which` forbids replaced by a placeholder.
    pub fn protect_content(&self, content: &str, which: Protect) -> String {
        let mut out = String::with_capacity(content.len());
        for frag in self.partition(content, true, &[]) {
            match frag {
                Frag::Token(id) => {
                    let keep = which == Protect::Control
                        && self.types[id as usize] == TokenType::UserDefined;
                    if keep {
                        out.push_str(&self.texts[id as usize]);
                    } else {
                        push_placeholder(&mut out, &id.to_string());
                    }
                }
                Frag::Text(s) => {
                    for c in s.chars() {
                        match c {
                            OPEN => push_placeholder(&mut out, LIT_OPEN),
                            CLOSE => push_placeholder(&mut out, LIT_CLOSE),
                            c => out.push(c),
                        }
                    }
                }
            }
        }
        out
    }

    /// A rendered prompt with the placeholders of `protect_content` turned back into their texts,
    /// and the byte ranges of the special-token texts that came from contents (to be tokenized as
    /// plain text). Anything that is not a well-formed placeholder is left as it is.
    pub fn restore_content(&self, rendered: &str) -> (String, Vec<Range<usize>>) {
        let mut out = String::with_capacity(rendered.len());
        let mut plain = Vec::new();
        let mut rest = rendered;
        while let Some(at) = rest.find(OPEN) {
            out.push_str(&rest[..at]);
            let after = &rest[at + OPEN.len_utf8()..];
            // A body is at most 10 digits: look no further (no quadratic scan on stray OPENs).
            let close = after.char_indices().take(11).find(|&(_, c)| c == CLOSE);
            let Some((body, tail)) =
                close.map(|(e, _)| (&after[..e], &after[e + CLOSE.len_utf8()..]))
            else {
                out.push(OPEN);
                rest = after;
                continue;
            };
            match self.placeholder_text(body) {
                Some((text, special)) => {
                    if special {
                        plain.push(out.len()..out.len() + text.len());
                    }
                    out.push_str(text);
                    rest = tail;
                }
                None => {
                    out.push(OPEN);
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        (out, plain)
    }

    /// What a placeholder body stands for, and whether it is a special token's text.
    fn placeholder_text(&self, body: &str) -> Option<(&str, bool)> {
        const OPEN_STR: &str = "\u{FDD0}";
        const CLOSE_STR: &str = "\u{FDD1}";
        match body {
            LIT_OPEN => Some((OPEN_STR, false)),
            LIT_CLOSE => Some((CLOSE_STR, false)),
            _ if body.bytes().all(|b| b.is_ascii_digit()) => body
                .parse::<u32>()
                .ok()
                .filter(|&id| self.is_special(id))
                .map(|id| (self.texts[id as usize].as_str(), true)),
            _ => None,
        }
    }

    /// `encode(text, add_bos, true)`, except that no special token may overlap a range of
    /// `plain` (sorted, disjoint): those bytes are tokenized as ordinary text.
    pub fn encode_with_plain(&self, text: &str, add_bos: bool, plain: &[Range<usize>]) -> Vec<u32> {
        self.encode_parts(text, add_bos, true, plain)
    }
}

fn push_placeholder(out: &mut String, body: &str) {
    out.push(OPEN);
    out.push_str(body);
    out.push(CLOSE);
}

/// Whether `[start, end)` overlaps a range of `plain` (sorted, disjoint).
pub(super) fn overlaps(plain: &[Range<usize>], start: usize, end: usize) -> bool {
    let i = plain.partition_point(|r| r.end <= start);
    plain.get(i).is_some_and(|r| r.start < end)
}
