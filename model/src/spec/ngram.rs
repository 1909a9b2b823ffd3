//! n-gram prompt lookup: the last n tokens of a sequence are searched for in its own prompt and
//! output (and an extra source such as OpenAI's `prediction`), longest n first; of that n-gram's
//! occurrences the one whose match goes furthest back wins, the most recent on a tie; the tokens
//! that followed it are the draft. Costs a scan of the sequence per n and nothing else, so it is
//! the default drafter: code edits and reviews quote their input at length.
//!
//! Why the furthest-back match: code and prose repeat short n-grams (a closing brace and a
//! newline, `return`, a repeated argument list), so a quoted file holds a sequence's last few
//! tokens in many places, and the most recent one is usually not where the quote is being
//! copied from. The place being copied matches as far back as the copy goes.

use super::{DraftKind, DraftRequest, Drafter};
use crate::error::ModelError;

/// The n range of the lookup (inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramRange {
    pub min: usize,
    pub max: usize,
}

impl Default for NgramRange {
    fn default() -> Self {
        NgramRange { min: 2, max: 5 }
    }
}

/// Longest match [`lookup`] measures (the n-gram and how far it extends back), as the suffix
/// drafter's.
pub const MATCH_MAX: usize = 64;

/// For the largest `n` in `range` whose last `n` tokens of `ctx` occur earlier in `hay` with at
/// least one token after them: the occurrence whose match with `ctx`'s end goes furthest back
/// (at most [`MATCH_MAX`] tokens; the most recent on a tie), as (that match's length, the at
/// most `max` tokens that follow it). When `hay` is `ctx` itself, the occurrence at its very end
/// does not count.
pub fn lookup(
    hay: &[u32],
    ctx: &[u32],
    range: NgramRange,
    max: usize,
) -> Option<(usize, Vec<u32>)> {
    lookup_from(hay, 0, ctx, range, max)
}

/// [`lookup`] over the occurrences that end at `hay[from - 1]` or later (so a token of
/// `hay[from..]` follows each); `hay[..from]` is the text `hay[from..]` follows, which only
/// extends their matches back.
fn lookup_from(
    hay: &[u32],
    from: usize,
    ctx: &[u32],
    range: NgramRange,
    max: usize,
) -> Option<(usize, Vec<u32>)> {
    if max == 0 {
        return None;
    }
    let hi = range.max.min(ctx.len());
    for n in (range.min.max(1)..=hi).rev() {
        let pat = &ctx[ctx.len() - n..];
        // `start + n < hay.len()`: a token follows; for hay == ctx that also skips the suffix
        let Some(last) = hay.len().checked_sub(n + 1) else {
            continue;
        };
        // (match length, start) of the best occurrence so far
        let mut best: Option<(usize, usize)> = None;
        let reach = MATCH_MAX.max(n).min(ctx.len());
        for start in (from.saturating_sub(n)..=last).rev() {
            if &hay[start..start + n] != pat {
                continue;
            }
            let back = (n..reach)
                .take_while(|&l| {
                    start > l - n && hay[start - 1 - (l - n)] == ctx[ctx.len() - 1 - l]
                })
                .count();
            let len = n + back;
            if best.is_none_or(|b| len > b.0) {
                best = Some((len, start));
                if len == reach {
                    break;
                }
            }
        }
        if let Some((len, start)) = best {
            let from = start + n;
            let to = (from + max).min(hay.len());
            return Some((len, hay[from..to].to_vec()));
        }
    }
    None
}

/// [`lookup`] over a sequence's own tokens and its extra source: the longer match wins, counted
/// up to the n-gram range's largest n, and the extra source (a predicted output) on a tie. A
/// match of the sequence's own text that only goes further back does not displace the
/// prediction: measured on a prediction with a fifth of its tokens replaced (Kimi-K2 shape),
/// letting it do so cut the drafts' acceptance and speculation's gain there. The extra source
/// is matched from n = 1: it is the expected answer, so after a token that differs from it,
/// the next one already finds its place again. Where the output's last token has no place in
/// it longer than one token, the output is taken to have replaced one of its tokens
/// ([`past_a_substitution`]).
pub fn lookup_both(req: &DraftRequest, range: NgramRange) -> Option<(usize, Vec<u32>)> {
    let own = lookup(req.tokens, req.tokens, range, req.max);
    let from_one = NgramRange { min: 1, ..range };
    let extra = match lookup_from(req.extra, req.extra_from, req.tokens, from_one, req.max) {
        Some(e) if e.0 >= range.min => Some(e),
        weak => past_a_substitution(req, range).or(weak),
    };
    match (own, extra) {
        (Some(o), Some(e)) => Some(if e.0.min(range.max) >= o.0.min(range.max) {
            e
        } else {
            o
        }),
        (o, e) => o.or(e),
    }
}

/// A predicted output as an extra source (`DraftRequest::extra`, `extra_from`), built once per
/// request: the prompt's last [`MATCH_MAX`] tokens, then the prediction (nothing when there is
/// none). The output follows the prompt, so a match at the prediction's start goes back into
/// the prompt. Without them, an output's first tokens that occur again later in the
/// prediction matched both places by the same length, and the later place (the most recent)
/// won: a prediction the output followed exactly had its first draft wrong.
pub fn predicted_output(prompt: &[u32], prediction: &[u32]) -> (Vec<u32>, usize) {
    if prediction.is_empty() {
        return (Vec::new(), 0);
    }
    let tail = &prompt[prompt.len().saturating_sub(MATCH_MAX)..];
    ([tail, prediction].concat(), tail.len())
}

/// The extra source (a predicted output) past a token the output replaced: the context up to
/// the output's last token matched in it (at least `range.min` tokens), and the draft taken from
/// one token after that match, skipping the prediction's token in the replaced one's place
/// (two, when the output's token is the one after it: the output left a token out).
/// An edit that renames an identifier or changes a literal differs from the prediction in a
/// token or a few and then follows it again; without this the step after each such token has
/// no draft (its token is nowhere in the prediction), and a prediction with a fifth of its
/// tokens replaced lost a draft every fifth step. Its length is the match's, to weigh it
/// against the own-text match as [`lookup_both`] does.
fn past_a_substitution(req: &DraftRequest, range: NgramRange) -> Option<(usize, Vec<u32>)> {
    let (&last, head) = req.tokens.split_last()?;
    let (len, d) = lookup_from(
        req.extra,
        req.extra_from,
        head,
        range,
        req.max.checked_add(2)?,
    )?;
    let rest = match d.as_slice() {
        [replaced, ..] if *replaced == last => return None,
        [_, next, rest @ ..] if *next == last => rest,
        [_, rest @ ..] => rest,
        [] => return None,
    };
    let rest = &rest[..rest.len().min(req.max)];
    (!rest.is_empty()).then(|| (len, rest.to_vec()))
}

/// The n-gram prompt-lookup drafter.
#[derive(Clone, Debug, Default)]
pub struct NgramDrafter {
    pub range: NgramRange,
}

impl NgramDrafter {
    pub fn new(range: NgramRange) -> NgramDrafter {
        NgramDrafter { range }
    }
}

impl Drafter for NgramDrafter {
    fn kind(&self) -> DraftKind {
        DraftKind::Ngram
    }

    fn draft(&mut self, req: &DraftRequest) -> Result<Vec<u32>, ModelError> {
        Ok(lookup_both(req, self.range)
            .map(|m| m.1)
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: NgramRange = NgramRange { min: 2, max: 4 };

    #[test]
    fn the_longest_then_most_recent_match_gives_the_draft() {
        // "1 2 3" occurs twice followed by 9 then 7; "5 1 2 3" only once (followed by 7)
        let ctx = [1, 2, 3, 9, 5, 1, 2, 3, 7, 8, 5, 1, 2, 3];
        assert_eq!(lookup(&ctx, &ctx, R, 3), Some((4, vec![7, 8, 5])));
        let ctx = [1, 2, 3, 9, 4, 1, 2, 3, 7, 6, 1, 2, 3];
        // n = 4 finds nothing; n = 3: the most recent earlier "1 2 3" is followed by 7
        assert_eq!(lookup(&ctx, &ctx, R, 2), Some((3, vec![7, 6])));
    }

    #[test]
    fn of_an_n_grams_occurrences_the_one_matching_furthest_back_wins() {
        // a quoted block "4 5 6 1 2 3 7 8" is being copied ("4 5 6 1 2 3" so far); "1 2 3"
        // also occurs later, followed by 9: the copy's place matches 6 tokens back, the later
        // occurrence 3
        let ctx = [4, 5, 6, 1, 2, 3, 7, 8, 0, 1, 2, 3, 9, 0, 4, 5, 6, 1, 2, 3];
        assert_eq!(lookup(&ctx, &ctx, R, 2), Some((6, vec![7, 8])));
        // a predicted output with the same repeat of a 4-gram (the longest n): the place being
        // copied matches 5 back and wins over the most recent occurrence
        let pred = [5, 6, 1, 2, 3, 7, 8, 0, 6, 1, 2, 3, 9];
        let tokens = [50, 5, 6, 1, 2, 3];
        let req = DraftRequest {
            key: 0,
            tokens: &tokens,
            extra: &pred,
            extra_from: 0,
            max: 2,
        };
        assert_eq!(lookup_both(&req, R), Some((5, vec![7, 8])));
        // the match is measured at most MATCH_MAX back, then the most recent occurrence wins
        let block: Vec<u32> = (100..100 + MATCH_MAX as u32 + 8).collect();
        let mut hay = block.clone();
        hay.push(1);
        hay.extend_from_slice(&block);
        hay.push(2);
        let ctx = block.clone();
        let got = lookup(&hay, &ctx, R, 1).expect("a match");
        assert_eq!(got, (MATCH_MAX, vec![2]));
    }

    #[test]
    fn no_match_no_draft_and_the_suffix_itself_does_not_count() {
        let ctx = [1, 2, 3, 4, 5, 6];
        assert_eq!(lookup(&ctx, &ctx, R, 4), None);
        // below the minimum n
        let ctx = [7, 1, 8, 1];
        assert_eq!(lookup(&ctx, &ctx, R, 4), None);
        assert_eq!(
            lookup(&ctx, &ctx, NgramRange { min: 1, max: 2 }, 4),
            Some((1, vec![8, 1]))
        );
        assert_eq!(lookup(&ctx, &ctx, R, 0), None);
    }

    #[test]
    fn the_extra_source_is_searched_and_wins_ties() {
        let tokens = [5, 6, 7, 1, 2];
        let extra = [1, 2, 40, 41, 42];
        let req = DraftRequest {
            key: 0,
            tokens: &tokens,
            extra: &extra,
            extra_from: 0,
            max: 2,
        };
        assert_eq!(
            NgramDrafter::new(R).draft(&req).expect("draft"),
            vec![40, 41]
        );
        // one token is enough in the extra source
        let tokens = [5, 6, 7, 9, 42];
        let req = DraftRequest {
            tokens: &tokens,
            ..req
        };
        assert_eq!(
            NgramDrafter::new(R).draft(&req).expect("draft"),
            Vec::<u32>::new()
        );
        let tokens = [5, 6, 7, 9, 41];
        let req = DraftRequest {
            tokens: &tokens,
            ..req
        };
        assert_eq!(NgramDrafter::new(R).draft(&req).expect("draft"), vec![42]);
    }

    #[test]
    fn a_prediction_follows_its_prompt() {
        // the prediction repeats its opening "30 38 100 414" later, followed by 206 there
        let pred = [30, 38, 100, 414, 10, 11, 552, 30, 38, 100, 414, 206, 178];
        let prompt = [900, 901, 902];
        // `after`: whether the extra source carries the prompt's end (as the scheduler builds it)
        let draft = |out: &[u32], after: bool| {
            let tokens: Vec<u32> = prompt.iter().chain(out).copied().collect();
            let (extra, extra_from) = if after {
                predicted_output(&prompt, &pred)
            } else {
                (pred.to_vec(), 0)
            };
            let req = DraftRequest {
                key: 0,
                tokens: &tokens,
                extra: &extra,
                extra_from,
                max: 4,
            };
            NgramDrafter::new(R).draft(&req).expect("draft")
        };
        // the output's first token matches both places by one token; the opening's match goes
        // back into the prompt, so the opening is followed (the later place won before)
        assert_eq!(draft(&[30], true), vec![38, 100, 414, 10]);
        assert_eq!(draft(&[30], false), vec![38, 100, 414, 206]);
        // nothing generated yet: the prediction from its start
        assert_eq!(draft(&[], true), vec![30, 38, 100, 414]);
        // past the opening the output's own match decides as before
        assert_eq!(
            draft(&[30, 38, 100, 414, 10, 11, 552, 30], true),
            vec![38, 100, 414, 206]
        );
        // a first token other than the prediction's replaced it: the prediction goes on after it
        assert_eq!(draft(&[7], true), vec![38, 100, 414, 10]);
        assert_eq!(draft(&[7], false), Vec::<u32>::new());
    }

    #[test]
    fn past_a_token_the_output_replaced_the_prediction_is_followed_again() {
        let pred = [10, 11, 12, 13, 14, 15, 16];
        let draft = |tokens: &[u32], max: usize| {
            let req = DraftRequest {
                key: 0,
                tokens,
                extra: &pred,
                extra_from: 0,
                max,
            };
            NgramDrafter::new(R).draft(&req).expect("draft")
        };
        // 13 replaced by 99: the prediction goes on after 13
        assert_eq!(draft(&[1, 10, 11, 12, 99], 3), vec![14, 15, 16]);
        assert_eq!(draft(&[1, 10, 11, 12, 99], 1), vec![14]);
        // 13 left out: after 14
        assert_eq!(draft(&[1, 10, 11, 12, 14], 3), vec![15, 16]);
        // followed as predicted: the plain lookup
        assert_eq!(draft(&[1, 10, 11, 12, 13], 2), vec![14, 15]);
        // the tokens before the replaced one match a single token: no place to resume
        assert_eq!(draft(&[1, 2, 12, 99], 3), Vec::<u32>::new());
        // the replaced token was the prediction's last: nothing after it
        assert_eq!(draft(&[12, 13, 14, 15, 99], 3), Vec::<u32>::new());
        // the own text's longer match still wins over a resumed prediction
        let own = [5, 6, 7, 8, 30, 31, 5, 6, 7, 8];
        let req = DraftRequest {
            key: 0,
            tokens: &own,
            extra: &[40, 6, 7, 41, 42],
            extra_from: 0,
            max: 2,
        };
        assert_eq!(lookup_both(&req, R), Some((4, vec![30, 31])));
    }
}
