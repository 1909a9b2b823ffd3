//! n-gram prompt lookup: the last n tokens of a sequence are searched for in its own prompt and
//! output (and an extra source such as OpenAI's `prediction`), longest n first, most recent
//! occurrence first; the tokens that followed that occurrence are the draft. Costs a scan of the
//! sequence per n and nothing else, so it is the default drafter: code edits and reviews quote
//! their input at length.

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

/// The continuation after the most recent earlier occurrence in `hay` of the last `n` tokens of
/// `ctx`, for the largest `n` in `range` that has one with at least one following token; at most
/// `max` tokens. When `hay` is `ctx` itself, the occurrence at its very end does not count.
pub fn lookup(
    hay: &[u32],
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
        for start in (0..=last).rev() {
            if &hay[start..start + n] == pat {
                let from = start + n;
                let to = (from + max).min(hay.len());
                return Some((n, hay[from..to].to_vec()));
            }
        }
    }
    None
}

/// [`lookup`] over a sequence's own tokens and its extra source: the longer match wins, the
/// extra source (a predicted output) on a tie. The extra source is matched from n = 1: it is
/// the expected answer, so after a token that differs from it, the next one already finds its
/// place again.
pub fn lookup_both(req: &DraftRequest, range: NgramRange) -> Option<(usize, Vec<u32>)> {
    let own = lookup(req.tokens, req.tokens, range, req.max);
    let from_one = NgramRange { min: 1, ..range };
    let extra = lookup(req.extra, req.tokens, from_one, req.max);
    match (own, extra) {
        (Some(o), Some(e)) => Some(if e.0 >= o.0 { e } else { o }),
        (o, e) => o.or(e),
    }
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
}
