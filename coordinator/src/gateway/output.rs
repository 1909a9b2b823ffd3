//! A chat response's generated text on its way out: a thinking model's leading `<think>` block
//! split off as reasoning (the model crate's `ThinkSplit`), then the rest through the tool-call
//! parser when the request has tools (`ToolStream`), else content. Reasoning never reaches the
//! tool parser, so a call the model drafts while thinking is not a call.

use super::tools::{Piece, ToolStream};
use nightshift_model::reasoning::{Split, ThinkSplit};

#[derive(Debug)]
pub struct OutputParser {
    think: Option<ThinkSplit>,
    tools: Option<ToolStream>,
}

impl OutputParser {
    /// None when the text goes out as it is (no think split, no tools).
    pub fn new(think: Option<ThinkSplit>, tools: Option<ToolStream>) -> Option<OutputParser> {
        (think.is_some() || tools.is_some()).then_some(OutputParser { think, tools })
    }

    /// Calls emitted so far.
    pub fn calls(&self) -> u32 {
        self.tools.as_ref().map_or(0, ToolStream::calls)
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        match (&mut self.think, &mut self.tools) {
            (Some(t), _) => {
                let splits = t.push(text);
                self.content(splits, false)
            }
            // no think split: the text goes straight to the tool parser (per token, no copy)
            (None, Some(ts)) => ts.push(text),
            (None, None) => vec![Piece::Content(text.to_string())],
        }
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        let splits = self
            .think
            .as_mut()
            .map(ThinkSplit::finish)
            .unwrap_or_default();
        self.content(splits, true)
    }

    fn content(&mut self, splits: Vec<Split>, end: bool) -> Vec<Piece> {
        let mut out = Vec::new();
        for s in splits {
            match s {
                Split::Reasoning(r) => out.push(Piece::Reasoning(r)),
                Split::Content(c) => match &mut self.tools {
                    Some(ts) => out.extend(ts.push(&c)),
                    None => out.push(Piece::Content(c)),
                },
            }
        }
        if end {
            if let Some(ts) = &mut self.tools {
                out.extend(ts.finish());
            }
        }
        out
    }
}

/// One token's text as pieces: through the parser when there is one, else content.
pub fn pieces(parser: &mut Option<OutputParser>, text: &str) -> Vec<Piece> {
    match parser {
        Some(p) => p.push(text),
        None if text.is_empty() => Vec::new(),
        None => vec![Piece::Content(text.to_string())],
    }
}
