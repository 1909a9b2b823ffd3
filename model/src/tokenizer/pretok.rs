//! Pre-tokenizers: how llama.cpp splits text into words before BPE, per `tokenizer.ggml.pre`.
//! Each kind is a list of regexes applied in turn (each splits every piece the previous one
//! produced; matches and the gaps between them both become pieces), as llama.cpp's
//! `unicode_regex_split` does. llama.cpp runs some kinds through hand-written scanners instead of
//! its regex; the patterns here are written to give the same pieces as those scanners (notably
//! kimi-k2: one run of non-Han letters is one word, no camelCase split).

use fancy_regex::Regex;

use super::TokenizerError;

/// `(?:'s|'t|'re|'ve|'m|'ll|'d)` with ASCII-only case folding, as llama.cpp writes it.
const CONTRACTIONS: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";

/// The Han ranges of llama.cpp's `unicode_cpt_is_han` (CJK unified ideographs, extensions A-F,
/// compatibility ideographs and their supplement).
const HAN: &str = r"\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F}\x{2B740}-\x{2B81F}\x{2B820}-\x{2CEAF}\x{2CEB0}-\x{2EBEF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}";

/// The pre-tokenizers we implement, named as in `tokenizer.ggml.pre`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// llama.cpp's fallback when the key is missing or "default".
    Default,
    Gpt2,
    Llama3,
    Qwen2,
    DeepseekV3,
    KimiK2,
}

impl PreTokenizer {
    /// The kind for a `tokenizer.ggml.pre` value (None: missing key).
    pub fn from_name(name: Option<&str>) -> Result<PreTokenizer, TokenizerError> {
        Ok(match name {
            None | Some("default") => PreTokenizer::Default,
            Some("gpt-2") => PreTokenizer::Gpt2,
            Some("llama3" | "llama-v3" | "llama-bpe") => PreTokenizer::Llama3,
            Some("qwen2" | "deepseek-r1-qwen" | "megrez") => PreTokenizer::Qwen2,
            Some("deepseek-v3") => PreTokenizer::DeepseekV3,
            Some("kimi-k2") => PreTokenizer::KimiK2,
            Some(other) => return Err(TokenizerError::UnsupportedPre(other.to_string())),
        })
    }

    /// llama.cpp's `ignore_merges`: a word that is itself a token is not merged from bytes.
    pub fn ignore_merges(self) -> bool {
        self == PreTokenizer::Llama3
    }

    fn patterns(self) -> Vec<String> {
        let main_llama3 = |digits: &str| {
            format!(
                r"{CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{digits}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            )
        };
        match self {
            PreTokenizer::Default => vec![
                r"[\p{P}\$\+<=>\^~\|]+".into(),
                // llama.cpp runs this one through its gpt2 scanner, which ends in `|\s+`.
                r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+".into(),
                r"\p{N}+".into(),
                r"[0-9][0-9][0-9]".into(),
            ],
            PreTokenizer::Gpt2 => {
                vec![r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+".into()]
            }
            PreTokenizer::Llama3 => vec![main_llama3("{1,3}")],
            PreTokenizer::Qwen2 => vec![main_llama3("")],
            PreTokenizer::DeepseekV3 => vec![
                r"\p{N}{1,3}".into(),
                r"[一-龥぀-ゟ゠-ヿ]+".into(),
                // llama.cpp's ASCII tables leave `~` out of both \p{P} and \p{S}; so do we.
                r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}[\p{P}\p{S}--~]]?[\p{L}\p{M}]+| ?[\p{P}\p{S}--~]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##.into(),
            ],
            PreTokenizer::KimiK2 => vec![format!(
                r"[{HAN}]+|[^\r\n\p{{L}}\p{{N}}]?[^\P{{L}}{HAN}]+{CONTRACTIONS}?|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            )],
        }
    }
}

/// A compiled pre-tokenizer.
#[derive(Debug)]
pub struct Splitter {
    regexes: Vec<Regex>,
}

impl Splitter {
    pub fn new(kind: PreTokenizer) -> Result<Splitter, TokenizerError> {
        let regexes = kind
            .patterns()
            .iter()
            .map(|p| Regex::new(p).map_err(|e| TokenizerError::Regex(format!("{kind:?}: {e}"))))
            .collect::<Result<_, _>>()?;
        Ok(Splitter { regexes })
    }

    /// Splits `text` into words (byte ranges of `text`, in order, covering all of it).
    pub fn split(&self, text: &str) -> Vec<(usize, usize)> {
        let mut pieces = vec![(0, text.len())];
        for re in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for &(start, end) in &pieces {
                let chunk = &text[start..end];
                let mut at = 0;
                for m in re.find_iter(chunk) {
                    // A backtracking limit hit on hostile input: keep the rest as one piece.
                    let Ok(m) = m else { break };
                    if m.start() > at {
                        next.push((start + at, start + m.start()));
                    }
                    if m.end() > m.start() {
                        next.push((start + m.start(), start + m.end()));
                    }
                    at = m.end();
                }
                if at < chunk.len() {
                    next.push((start + at, end));
                }
            }
            pieces = next;
        }
        pieces
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(kind: PreTokenizer, text: &str, expect: &[&str]) {
        let s = Splitter::new(kind).unwrap();
        let got: Vec<&str> = s
            .split(text)
            .into_iter()
            .map(|(a, b)| &text[a..b])
            .collect();
        assert_eq!(got, expect, "{kind:?} {text:?}");
    }

    #[test]
    fn splits() {
        use PreTokenizer::*;
        check(Qwen2, "Hello world", &["Hello", " world"]);
        check(Qwen2, "12345 it's", &["1", "2", "3", "4", "5", " it", "'s"]);
        check(Qwen2, "a  \n\n b", &["a", "  \n\n", " b"]);
        check(Qwen2, "x   y", &["x", "  ", " y"]);
        check(Qwen2, "(a)", &["(a", ")"]);
        check(Qwen2, "東京 😀!", &["東京", " 😀!"]);
        check(Llama3, "12345", &["123", "45"]);
        check(
            KimiK2,
            "getUserName 東京abc",
            &["getUserName", " ", "東京", "abc"],
        );
        check(
            KimiK2,
            "I'LL 12345\n\nx",
            &["I'LL", " ", "123", "45", "\n\n", "x"],
        );
        check(KimiK2, " 深度学习", &[" ", "深度学习"]);
        check(DeepseekV3, "abc 12345", &["abc", " ", "123", "45"]);
        check(
            DeepseekV3,
            "a ~~ b, 東京",
            &["a", " ", "~~", " b", ",", " ", "東京"],
        );
        check(Gpt2, "it's 42", &["it", "'s", " 42"]);
    }
}
