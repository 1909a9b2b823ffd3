//! Suffix drafting: the longest suffix of a sequence that occurs in recent requests' text (or
//! earlier in the sequence itself) and what followed it there. Each recent token stream (a
//! request's prompt when it starts, its prompt and output when it ends) gets a suffix automaton,
//! built online in linear time; the window keeps the most recent streams up to a token budget,
//! oldest dropped first. So boilerplate repeated across a batch of PR reviews is drafted from
//! another request's prompt or answer; the sequence's own text goes through the n-gram lookup.

use super::ngram::{lookup_both, NgramRange};
use super::{DraftKind, DraftRequest, Drafter};
use crate::error::ModelError;
use std::collections::{HashMap, VecDeque};

/// One state of a suffix automaton.
#[derive(Clone, Debug, Default)]
struct State {
    /// Length of the longest string in this state.
    len: usize,
    /// Suffix link (usize::MAX for the root).
    link: usize,
    next: HashMap<u32, usize>,
    /// End position (index of the last token) of the first occurrence of this state's strings.
    end: usize,
}

/// The suffix automaton of one token stream (every substring is a path from the root).
#[derive(Clone, Debug)]
pub struct SuffixAutomaton {
    states: Vec<State>,
    last: usize,
    text: Vec<u32>,
}

impl Default for SuffixAutomaton {
    fn default() -> Self {
        SuffixAutomaton::new()
    }
}

impl SuffixAutomaton {
    pub fn new() -> SuffixAutomaton {
        SuffixAutomaton {
            states: vec![State {
                link: usize::MAX,
                ..State::default()
            }],
            last: 0,
            text: Vec::new(),
        }
    }

    /// The automaton of `text`.
    pub fn of(text: &[u32]) -> SuffixAutomaton {
        let mut a = SuffixAutomaton::new();
        for &t in text {
            a.push(t);
        }
        a
    }

    pub fn text(&self) -> &[u32] {
        &self.text
    }

    /// Appends one token (the standard online construction).
    pub fn push(&mut self, c: u32) {
        let pos = self.text.len();
        self.text.push(c);
        let cur = self.states.len();
        self.states.push(State {
            len: self.states[self.last].len + 1,
            link: 0,
            next: HashMap::new(),
            end: pos,
        });
        let mut p = self.last;
        while p != usize::MAX && !self.states[p].next.contains_key(&c) {
            self.states[p].next.insert(c, cur);
            p = self.states[p].link;
        }
        if p != usize::MAX {
            let q = self.states[p].next[&c];
            if self.states[p].len + 1 == self.states[q].len {
                self.states[cur].link = q;
            } else {
                let clone = self.states.len();
                let mut st = self.states[q].clone();
                st.len = self.states[p].len + 1;
                self.states.push(st);
                while p != usize::MAX && self.states[p].next.get(&c) == Some(&q) {
                    self.states[p].next.insert(c, clone);
                    p = self.states[p].link;
                }
                self.states[q].link = clone;
                self.states[cur].link = clone;
            }
        }
        self.last = cur;
    }

    /// The longest suffix of `ctx` occurring in the text with at least one token after it: its
    /// length and the index just past the occurrence's end.
    pub fn longest_suffix(&self, ctx: &[u32]) -> Option<(usize, usize)> {
        // walk ctx; after each token, (state, l) = the longest suffix of ctx[..=i] in the text
        let (mut st, mut l) = (0usize, 0usize);
        for &c in ctx {
            while st != 0 && !self.states[st].next.contains_key(&c) {
                st = self.states[st].link;
                l = self.states[st].len;
            }
            match self.states[st].next.get(&c) {
                Some(&nx) => {
                    st = nx;
                    l += 1;
                }
                None => l = 0,
            }
        }
        // shorten until an occurrence has a following token: the first occurrence of a state's
        // strings ends at `end`, which is the text's last token only for suffixes of the whole text
        while l > 0 {
            let end = self.states[st].end;
            if end + 1 < self.text.len() {
                return Some((l, end + 1));
            }
            st = self.states[st].link;
            l = self.states[st].len;
        }
        None
    }
}

/// Drafts from the longest suffix match over the window of recent streams and the sequence's
/// own text (n-gram lookup over it and its extra source), whichever is longer.
pub struct SuffixDrafter {
    /// Recent streams, oldest first, with the keys of the sequences they came from.
    window: VecDeque<(u64, SuffixAutomaton)>,
    /// Tokens in the window.
    held: usize,
    /// Most tokens the window keeps.
    budget: usize,
    /// Longest context suffix matched (bounds the walk).
    max_match: usize,
    /// The lookup over the sequence's own text.
    range: NgramRange,
}

impl SuffixDrafter {
    /// A window of at most `budget` tokens of recent streams.
    pub fn new(budget: usize, range: NgramRange) -> SuffixDrafter {
        SuffixDrafter {
            window: VecDeque::new(),
            held: 0,
            budget,
            max_match: super::ngram::MATCH_MAX,
            range,
        }
    }

    /// Adds a stream to the window (from sequence `key`), dropping the oldest over budget.
    pub fn add_stream(&mut self, key: u64, text: &[u32]) {
        if text.len() < 2 || self.budget == 0 {
            return;
        }
        let text = &text[text.len().saturating_sub(self.budget)..];
        self.held += text.len();
        self.window.push_back((key, SuffixAutomaton::of(text)));
        while self.held > self.budget {
            match self.window.pop_front() {
                Some((_, a)) => self.held -= a.text().len(),
                None => break,
            }
        }
    }

    /// Tokens the window holds.
    pub fn held(&self) -> usize {
        self.held
    }
}

impl Drafter for SuffixDrafter {
    fn kind(&self) -> DraftKind {
        DraftKind::Suffix
    }

    fn begin(&mut self, key: u64, prompt: &[u32]) {
        self.add_stream(key, prompt);
    }

    fn draft(&mut self, req: &DraftRequest) -> Result<Vec<u32>, ModelError> {
        if req.max == 0 {
            return Ok(Vec::new());
        }
        let ctx = &req.tokens[req.tokens.len().saturating_sub(self.max_match)..];
        let mut best: Option<(usize, Vec<u32>)> = None;
        // newest first, so on equal lengths the most recent stream wins; a sequence's own prompt
        // stream is skipped (the n-gram lookup covers it, and its suffix would match itself)
        for (key, a) in self.window.iter().rev() {
            if *key == req.key {
                continue;
            }
            if let Some((l, from)) = a.longest_suffix(ctx) {
                if l >= self.range.min && best.as_ref().is_none_or(|b| l > b.0) {
                    let to = (from + req.max).min(a.text().len());
                    best = Some((l, a.text()[from..to].to_vec()));
                }
            }
        }
        if let Some(own) = lookup_both(req, self.range) {
            if best.as_ref().is_none_or(|b| own.0 >= b.0) {
                best = Some(own);
            }
        }
        Ok(best.map(|b| b.1).unwrap_or_default())
    }

    fn end(&mut self, key: u64, tokens: &[u32]) {
        // the prompt-only stream of this sequence is superseded by the whole text
        if let Some(i) = self.window.iter().position(|(k, _)| *k == key) {
            if let Some((_, a)) = self.window.remove(i) {
                self.held -= a.text().len();
            }
        }
        self.add_stream(key, tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest suffix of `ctx` occurring in `text` with a token after it, by brute force.
    fn brute(text: &[u32], ctx: &[u32]) -> usize {
        (1..=ctx.len())
            .rev()
            .find(|&l| {
                let pat = &ctx[ctx.len() - l..];
                text.len() > l && text[..text.len() - 1].windows(l).any(|w| w == pat)
            })
            .unwrap_or(0)
    }

    #[test]
    fn the_automaton_finds_the_longest_suffix_with_a_continuation() {
        let mut rng = nightshift_kernels::rng::SplitMix64::new(7);
        for _ in 0..300 {
            let n = 1 + (rng.next_u64() % 40) as usize;
            let text: Vec<u32> = (0..n).map(|_| (rng.next_u64() % 3) as u32).collect();
            let m = 1 + (rng.next_u64() % 12) as usize;
            let ctx: Vec<u32> = (0..m).map(|_| (rng.next_u64() % 3) as u32).collect();
            let a = SuffixAutomaton::of(&text);
            let want = brute(&text, &ctx);
            match a.longest_suffix(&ctx) {
                None => assert_eq!(want, 0, "{text:?} {ctx:?}"),
                Some((l, from)) => {
                    assert_eq!(l, want, "{text:?} {ctx:?}");
                    assert!(from < text.len());
                    assert_eq!(&text[from - l..from], &ctx[ctx.len() - l..]);
                }
            }
        }
    }

    #[test]
    fn another_requests_text_is_drafted_and_the_window_is_bounded() {
        let mut d = SuffixDrafter::new(12, NgramRange { min: 2, max: 4 });
        d.end(1, &[10, 11, 12, 13, 14, 15, 16]);
        let tokens = [1, 2, 3, 11, 12, 13];
        let req = DraftRequest {
            key: 2,
            tokens: &tokens,
            extra: &[],
            extra_from: 0,
            max: 3,
        };
        assert_eq!(d.draft(&req).expect("draft"), vec![14, 15, 16]);
        // 7 + 6 tokens exceed the budget of 12: the first stream goes
        d.end(3, &[20, 21, 22, 23, 24, 25]);
        assert_eq!(d.held(), 6);
        assert_eq!(d.draft(&req).expect("draft"), Vec::<u32>::new());
    }
}
