//! The tokenizer of generated models: a byte-level BPE (GPT-2 byte-to-unicode alphabet, 256
//! byte tokens + merges trained on a small built-in corpus) plus each architecture's special
//! tokens and chat template.
//!
//! This is a faithful port of `train_bpe` in `shared/tools/make_models.py`, so the `tiny` preset
//! gets exactly the vocabulary and merges of the reference fixtures (same corpus, same pre-split,
//! same tie-breaking: among equally frequent pairs the smallest pair wins).

use std::collections::{BTreeMap, HashMap};

/// The training text (make_models.py's CORPUS; it is used three times over, as there).
pub const CORPUS: &str = "
NightShift turns one Arm CPU virtual machine into a private, trillion-parameter engineer.
Memory bandwidth is the real currency of CPU inference: tokens per second is bandwidth divided by
the bytes each token must read. A mixture-of-experts model activates only a few experts per token,
so compute scales with the active parameters while memory must hold them all.
def route(hidden, experts, top_k=8):
    scores = [expert.gate(hidden) for expert in experts]
    return sorted(range(len(scores)), key=lambda i: -scores[i])[:top_k]
fn main() { let answer = 42; println!(\"{}\", answer); }
The coordinator runs attention and routing; expert nodes serve the experts over gRPC.
getUserName parseHTTPResponse XMLHttpRequest snake_case_name CONSTANT_VALUE 3.14159 2026-11-29
";

/// Merges asked of the trainer (it stops earlier when no pair is left, as make_models.py does).
pub const DEFAULT_MERGES: usize = 400;

/// GPT-2's reversible byte -> printable unicode character map.
pub fn bytes_to_unicode() -> [char; 256] {
    let mut out = ['\0'; 256];
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut n = 0u32;
    for b in 0u32..256 {
        let c = if printable(b) {
            b
        } else {
            n += 1;
            255 + n
        };
        out[b as usize] = char::from_u32(c).unwrap_or('\u{FFFD}');
    }
    out
}

/// GPT-2 style pre-split of make_models.py:
/// `'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+` (leftmost-first).
pub fn split_words(text: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let end_of = |i: usize| chars.get(i).map_or(text.len(), |c| c.0);
    let is_alpha = |c: char| c.is_ascii_alphabetic();
    let is_other = |c: char| !c.is_whitespace() && !c.is_ascii_alphanumeric();
    let mut words = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let at = |j: usize| chars.get(j).map(|c| c.1);
        let mut len = 0;
        if at(i) == Some('\'') {
            for suffix in ["s", "t", "re", "ve", "m", "ll", "d"] {
                if suffix
                    .chars()
                    .enumerate()
                    .all(|(k, s)| at(i + 1 + k) == Some(s))
                {
                    len = 1 + suffix.len();
                    break;
                }
            }
        }
        let run = |start: usize, pred: &dyn Fn(char) -> bool| {
            let mut j = start;
            while at(j).is_some_and(pred) {
                j += 1;
            }
            j - start
        };
        if len == 0 {
            let sp = usize::from(at(i) == Some(' '));
            let alpha = run(i + sp, &is_alpha);
            if alpha > 0 {
                len = sp + alpha;
            } else if at(i + sp).is_some_and(|c| c.is_ascii_digit()) {
                len = sp + 1;
            } else {
                let other = run(i + sp, &is_other);
                if other > 0 {
                    len = sp + other;
                } else {
                    len = run(i, &|c: char| c.is_whitespace()).max(1);
                }
            }
        }
        words.push(&text[chars[i].0..end_of(i + len)]);
        i += len;
    }
    words
}

/// Trains the BPE: returns (tokens, merges) with tokens = the 256 byte tokens then one token per
/// new merge result, merges as "a b" strings, exactly as make_models.py's `train_bpe`.
pub fn train_bpe(text: &str, n_merges: usize) -> (Vec<String>, Vec<String>) {
    let b2u = bytes_to_unicode();
    // word (as symbols) -> frequency; a BTreeMap keeps every step deterministic
    let mut freq: BTreeMap<Vec<String>, u64> = BTreeMap::new();
    for w in split_words(text) {
        let key: Vec<String> = w.bytes().map(|b| b2u[b as usize].to_string()).collect();
        *freq.entry(key).or_insert(0) += 1;
    }
    let mut merges: Vec<(String, String)> = Vec::new();
    for _ in 0..n_merges {
        let mut pairs: HashMap<(&str, &str), u64> = HashMap::new();
        for (w, f) in &freq {
            for p in w.windows(2) {
                *pairs.entry((p[0].as_str(), p[1].as_str())).or_insert(0) += f;
            }
        }
        // Python: max(sorted(pairs), key=count) -> the first (smallest) pair among the most frequent
        let Some(best) = pairs
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(p, _)| (p.0.to_string(), p.1.to_string()))
        else {
            break;
        };
        let mut next: BTreeMap<Vec<String>, u64> = BTreeMap::new();
        for (w, f) in &freq {
            let mut out = Vec::with_capacity(w.len());
            let mut i = 0;
            while i < w.len() {
                if i + 1 < w.len() && w[i] == best.0 && w[i + 1] == best.1 {
                    out.push(format!("{}{}", w[i], w[i + 1]));
                    i += 2;
                } else {
                    out.push(w[i].clone());
                    i += 1;
                }
            }
            *next.entry(out).or_insert(0) += f;
        }
        freq = next;
        merges.push(best);
    }
    let mut tokens: Vec<String> = b2u.iter().map(|c| c.to_string()).collect();
    let mut seen: std::collections::HashSet<String> = tokens.iter().cloned().collect();
    for (a, b) in &merges {
        let t = format!("{a}{b}");
        if seen.insert(t.clone()) {
            tokens.push(t);
        }
    }
    let merges = merges
        .into_iter()
        .map(|(a, b)| format!("{a} {b}"))
        .collect();
    (tokens, merges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_matches_the_python_regex() {
        let check = |text: &str, expect: &[&str]| assert_eq!(split_words(text), expect, "{text:?}");
        check("Hello world", &["Hello", " world"]);
        check("it's 42", &["it", "'s", " 4", "2"]);
        check("a  b\n\nc", &["a", "  ", "b", "\n\n", "c"]);
        check("x = [y];", &["x", " =", " [", "y", "];"]);
        check("top_k=8)", &["top", "_", "k", "=", "8", ")"]);
        check("café", &["caf", "é"]);
    }

    #[test]
    fn byte_alphabet_is_gpt2() {
        let m = bytes_to_unicode();
        assert_eq!(m[b'A' as usize], 'A');
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        assert_eq!(m[0], 'Ā');
    }
}
