//! Reasoning in generated text. Thinking models write their reasoning first, in a
//! `<think>…</think>` block (Qwen3, Kimi-K2-Thinking, DeepSeek-R1 and V3.1 in thinking mode), and
//! clients expect it apart from the answer: OpenAI-compatible servers (llama-server's
//! `--reasoning-format deepseek`, vLLM's reasoning parsers) send it as `reasoning_content`.
//! [`ThinkSplit`] splits a stream of generated text into reasoning and content, incrementally:
//! a leading think block (blanks before it allowed) is reasoning, everything after it content.
//! Some templates open the block in the prompt (DeepSeek-R1's generation prompt ends in
//! `<think>\n`): then the output starts inside it ([`ends_inside_think`]). Text that might still
//! become a marker is held back, so a partial marker never goes out; blanks around the
//! reasoning and right after the block are dropped, as llama.cpp does. Output without a block
//! is content exactly as written.

use crate::toolcall::partial_suffix;

pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

/// Whether a chat template writes think blocks (so its model's output may carry one).
pub fn template_thinks(source: &str) -> bool {
    source.contains(OPEN) || source.contains(CLOSE)
}

/// Whether a prompt's end leaves a think block open: its last non-blank text is `<think>`.
pub fn ends_inside_think(prompt_tail: &str) -> bool {
    prompt_tail.trim_end().ends_with(OPEN)
}

/// A piece of generated text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Split {
    Reasoning(String),
    Content(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but blanks yet: a think block may open.
    Start,
    /// Inside the think block.
    Inside,
    /// After the block (or there was none).
    After,
}

/// The splitter of one generation.
#[derive(Debug)]
pub struct ThinkSplit {
    state: State,
    /// Text not yet emitted: leading blanks, a possible marker prefix, or held blanks.
    buf: String,
    /// The reasoning has started (blanks before it are dropped).
    reasoning_started: bool,
    /// Content has started (blanks after the block are dropped).
    content_started: bool,
}

impl ThinkSplit {
    /// A splitter; `open`: the prompt ended inside a think block.
    pub fn new(open: bool) -> ThinkSplit {
        ThinkSplit {
            state: if open { State::Inside } else { State::Start },
            buf: String::new(),
            reasoning_started: false,
            content_started: false,
        }
    }

    /// Feeds generated text; returns what became certain.
    pub fn push(&mut self, text: &str) -> Vec<Split> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.scan(&mut out, false);
        out
    }

    /// The generation ended: everything left (an unclosed block's text is reasoning).
    pub fn finish(&mut self) -> Vec<Split> {
        let mut out = Vec::new();
        self.scan(&mut out, true);
        out
    }

    fn scan(&mut self, out: &mut Vec<Split>, at_end: bool) {
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.buf = rest.to_string();
                        self.state = State::Inside;
                    } else if !at_end && (t.is_empty() || OPEN.starts_with(t)) {
                        return;
                    } else {
                        // no block: the text is content exactly as written
                        self.content_started = true;
                        self.state = State::After;
                    }
                }
                State::Inside => match self.buf.find(CLOSE) {
                    Some(at) => {
                        let r = self.buf[..at].to_string();
                        self.reasoning(out, r.trim_end());
                        self.buf.drain(..at + CLOSE.len());
                        self.state = State::After;
                    }
                    None => {
                        // hold a possible marker prefix, and trailing blanks (dropped if the
                        // block closes right after them)
                        let keep = if at_end {
                            self.buf.len() - self.buf.trim_end().len()
                        } else {
                            let k = partial_suffix(&self.buf, &[CLOSE]);
                            let head = self.buf[..self.buf.len() - k].trim_end().len();
                            self.buf.len() - head
                        };
                        let r: String = self.buf.drain(..self.buf.len() - keep).collect();
                        self.reasoning(out, &r);
                        if at_end {
                            self.buf.clear();
                        }
                        return;
                    }
                },
                State::After => {
                    let mut text = std::mem::take(&mut self.buf);
                    if !self.content_started {
                        text = text.trim_start().to_string();
                        self.content_started = !text.is_empty();
                    }
                    if !text.is_empty() {
                        push(out, Split::Content(text));
                    }
                    return;
                }
            }
        }
    }

    fn reasoning(&mut self, out: &mut Vec<Split>, text: &str) {
        let text = if self.reasoning_started {
            text
        } else {
            text.trim_start()
        };
        if text.is_empty() {
            return;
        }
        self.reasoning_started = true;
        push(out, Split::Reasoning(text.to_string()));
    }
}

fn push(out: &mut Vec<Split>, s: Split) {
    match (out.last_mut(), s) {
        (Some(Split::Reasoning(a)), Split::Reasoning(b)) => a.push_str(&b),
        (Some(Split::Content(a)), Split::Content(b)) => a.push_str(&b),
        (_, s) => out.push(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (reasoning, content) from feeding `chunks`.
    fn run(open: bool, chunks: &[&str]) -> (String, String) {
        let mut s = ThinkSplit::new(open);
        let (mut r, mut c) = (String::new(), String::new());
        let mut take = |v: Vec<Split>| {
            for p in v {
                match p {
                    Split::Reasoning(x) => r.push_str(&x),
                    Split::Content(x) => c.push_str(&x),
                }
            }
        };
        for ch in chunks {
            take(s.push(ch));
        }
        take(s.finish());
        (r, c)
    }

    /// Every split of `text` into two chunks, and one character at a time, give `want`.
    fn every_split(open: bool, text: &str, want: (&str, &str)) {
        let want = (want.0.to_string(), want.1.to_string());
        assert_eq!(run(open, &[text]), want, "{text:?} whole");
        for (i, _) in text.char_indices() {
            assert_eq!(
                run(open, &[&text[..i], &text[i..]]),
                want,
                "{text:?} split at {i}"
            );
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(run(open, &refs), want, "{text:?} by characters");
    }

    #[test]
    fn a_leading_block_is_reasoning() {
        // Qwen3's layout
        every_split(
            false,
            "<think>\nThe user wants X.\nSo Y.\n</think>\n\nThe answer is Y.",
            ("The user wants X.\nSo Y.", "The answer is Y."),
        );
        // Kimi-K2-Thinking's, no blanks
        every_split(false, "<think>a</think>b", ("a", "b"));
        // blanks before the block
        every_split(false, "\n <think>a </think> b ", ("a", "b "));
    }

    #[test]
    fn a_prompt_that_opens_the_block_starts_inside_it() {
        // DeepSeek-R1: the generation prompt ends in `<think>\n`
        every_split(
            true,
            "Let me see.\n</think>\n\nHello.",
            ("Let me see.", "Hello."),
        );
        every_split(true, "</think>Hi", ("", "Hi"));
    }

    #[test]
    fn text_without_a_leading_block_is_content() {
        every_split(
            false,
            "Hello <think>x</think> there",
            ("", "Hello <think>x</think> there"),
        );
        every_split(false, "<thin", ("", "<thin"));
        every_split(false, "<th>x", ("", "<th>x"));
        every_split(false, "", ("", ""));
        every_split(false, "\n  Hi ", ("", "\n  Hi "));
        // a second block after the first is content
        every_split(
            false,
            "<think>a</think>b<think>c</think>",
            ("a", "b<think>c</think>"),
        );
    }

    #[test]
    fn an_unclosed_block_is_all_reasoning() {
        // the generation stopped (max_tokens) while thinking
        every_split(
            false,
            "<think>\nstill thinking </th",
            ("still thinking </th", ""),
        );
        every_split(true, "thinking", ("thinking", ""));
    }

    #[test]
    fn partial_markers_are_held_back() {
        let mut s = ThinkSplit::new(false);
        assert_eq!(s.push("<thi"), vec![]);
        assert_eq!(s.push("nk>abc</th"), vec![Split::Reasoning("abc".into())]);
        assert_eq!(s.push("ink>"), vec![]);
        assert_eq!(s.push("x"), vec![Split::Content("x".into())]);
    }

    /// Random texts of marker pieces, fed in random chunks, split as when fed whole; text that
    /// never spells `<think>` is all content, byte for byte.
    #[test]
    fn random_chunkings_split_as_the_whole_text() {
        use nightshift_kernels::rng::SplitMix64;
        const PIECES: &[&str] = &[
            "<think>", "</think>", "<thi", "nk>", "</th", "<", ">", "a", " ", "\n", "é", "x y",
        ];
        let mut r = SplitMix64::new(7);
        for case in 0..2000 {
            let n = (r.next_u64() % 12) as usize;
            let text: String = (0..n)
                .map(|_| PIECES[(r.next_u64() % PIECES.len() as u64) as usize])
                .collect();
            let open = case % 3 == 0;
            let whole = run(open, &[&text]);
            let mut chunks = Vec::new();
            let mut at = 0;
            while at < text.len() {
                let mut end = (at + 1 + (r.next_u64() % 6) as usize).min(text.len());
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                chunks.push(&text[at..end]);
                at = end;
            }
            assert_eq!(run(open, &chunks), whole, "{text:?} in {chunks:?}");
            if !open && !text.trim_start().starts_with(OPEN) {
                assert_eq!(whole, (String::new(), text.clone()), "{text:?}");
            }
        }
    }

    #[test]
    fn prompts_ending_in_an_open_block() {
        assert!(ends_inside_think("<｜Assistant｜><think>\n"));
        assert!(!ends_inside_think(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!ends_inside_think("<|im_start|>assistant\n"));
    }
}
