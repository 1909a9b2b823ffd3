//! Generated pieces (`tools::Piece`: content, reasoning, calls) as a sequence of blocks, the
//! shape both the Responses API (output items) and the Anthropic Messages API (content
//! blocks) answer in: a run of reasoning, a run of text, and each function call is one block,
//! opened, filled and closed in order, one open at a time.

use super::tools::Piece;

/// What a block holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Block {
    Text,
    Reasoning,
    /// A function call: the call id and the function's name; its text is the arguments.
    Call {
        id: String,
        name: String,
    },
}

/// One step of the block sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seg {
    Open(Block),
    /// Text of the open block (never empty).
    Text(String),
    Close,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Open {
    Text,
    Reasoning,
    /// The parser's index of the open call.
    Call(u32),
}

/// Turns pieces into blocks.
#[derive(Default, Debug)]
pub struct Segmenter {
    open: Option<Open>,
}

impl Segmenter {
    /// Whether the open block is reasoning.
    pub fn in_reasoning(&self) -> bool {
        self.open == Some(Open::Reasoning)
    }

    /// Whether the open block is text.
    pub fn in_text(&self) -> bool {
        self.open == Some(Open::Text)
    }

    fn switch(&mut self, to: Open, block: Block, out: &mut Vec<Seg>) {
        if self.open == Some(to) {
            return;
        }
        if self.open.take().is_some() {
            out.push(Seg::Close);
        }
        out.push(Seg::Open(block));
        self.open = Some(to);
    }

    fn text(out: &mut Vec<Seg>, s: String) {
        if !s.is_empty() {
            out.push(Seg::Text(s));
        }
    }

    pub fn push(&mut self, pieces: Vec<Piece>) -> Vec<Seg> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::Content(s) if s.is_empty() => {}
                Piece::Content(s) => {
                    self.switch(Open::Text, Block::Text, &mut out);
                    Self::text(&mut out, s);
                }
                Piece::Reasoning(s) if s.is_empty() => {}
                Piece::Reasoning(s) => {
                    self.switch(Open::Reasoning, Block::Reasoning, &mut out);
                    Self::text(&mut out, s);
                }
                Piece::Call { index, call } | Piece::CallStart { index, call } => {
                    // a new call always opens a new block, even right after another call
                    if self.open.take().is_some() {
                        out.push(Seg::Close);
                    }
                    out.push(Seg::Open(Block::Call {
                        id: call.id,
                        name: call.function.name,
                    }));
                    self.open = Some(Open::Call(index));
                    Self::text(&mut out, call.function.arguments);
                }
                Piece::CallArgs { index, text } => {
                    // arguments of a call that is not the open one (a dropped call) go nowhere
                    if self.open == Some(Open::Call(index)) {
                        Self::text(&mut out, text);
                    }
                }
            }
        }
        out
    }

    /// Closes the open block, if any.
    pub fn finish(&mut self) -> Vec<Seg> {
        match self.open.take() {
            Some(_) => vec![Seg::Close],
            None => Vec::new(),
        }
    }
}

/// A parsed call, for the tests of what reads pieces.
#[cfg(test)]
pub fn test_call(id: &str, name: &str, args: &str) -> super::types::ToolCallOut {
    super::types::ToolCallOut {
        id: id.into(),
        kind: "function",
        function: super::types::FunctionCallOut {
            name: name.into(),
            arguments: args.into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::test_call as call;
    use super::*;

    #[test]
    fn runs_become_blocks_and_each_call_its_own() {
        let mut s = Segmenter::default();
        let mut out = s.push(vec![
            Piece::Reasoning("a".into()),
            Piece::Reasoning("b".into()),
            Piece::Content(String::new()),
            Piece::Content("c".into()),
            Piece::Call {
                index: 0,
                call: call("x", "f", "{}"),
            },
            Piece::CallStart {
                index: 1,
                call: call("y", "g", ""),
            },
            Piece::CallArgs {
                index: 1,
                text: "{\"k\":1}".into(),
            },
            Piece::CallArgs {
                index: 0,
                text: "lost".into(),
            },
        ]);
        out.extend(s.finish());
        use Seg::*;
        assert_eq!(
            out,
            [
                Open(Block::Reasoning),
                Text("a".into()),
                Text("b".into()),
                Close,
                Open(Block::Text),
                Text("c".into()),
                Close,
                Open(Block::Call {
                    id: "x".into(),
                    name: "f".into()
                }),
                Text("{}".into()),
                Close,
                Open(Block::Call {
                    id: "y".into(),
                    name: "g".into()
                }),
                Text("{\"k\":1}".into()),
                Close,
            ]
        );
        assert!(s.finish().is_empty());
    }
}
