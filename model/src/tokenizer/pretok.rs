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

/// DeepSeek LLM and Coder's CJK run (their tokenizers' own ranges, as llama.cpp lists them),
/// blanks taken out: llama.cpp matches it on text whose non-ASCII blanks became U+000B.
const DEEPSEEK_CJK: &str = r"[[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]--\s]+";

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
    /// DeepSeek LLM, V2 and V2-Lite (`deepseek2` files before V3).
    DeepseekLlm,
    /// DeepSeek-Coder and Coder-V2 (Coder-V2 is a `deepseek2` file).
    DeepseekCoder,
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
            Some("deepseek-llm") => PreTokenizer::DeepseekLlm,
            Some("deepseek-coder") => PreTokenizer::DeepseekCoder,
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
            // The letters are explicit ranges (the tokenizer's own, as llama.cpp lists them;
            // escaped, so no editor's Unicode normalization can change them); `\s+$` ends at
            // each piece's end, as llama.cpp applies every pattern per piece. llama.cpp runs
            // these patterns (no `\p{..}`) on text whose non-ASCII blanks became U+000B, so a
            // blank never matches an explicit range (U+3000 is in two): `--\s` takes them out.
            PreTokenizer::DeepseekLlm => vec![
                r"[\r\n]".into(),
                concat!(
                    r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}",
                    r"\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}",
                    r"\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}",
                    r"\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}",
                    r"\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}",
                    r"\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}",
                    r"\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}",
                    r"\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}",
                    r"\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}",
                    r"\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}",
                    r"\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}",
                    r"\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}",
                    r"\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}",
                    r"\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}",
                    r"\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+"
                )
                .into(),
                r"\s?[[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]--\s]+".into(),
                r"\s+$".into(),
                DEEPSEEK_CJK.into(),
                r"\p{N}+".into(),
            ],
            PreTokenizer::DeepseekCoder => vec![
                r"[\r\n]".into(),
                r"\s?\p{L}+".into(),
                r"\s?\p{P}+".into(),
                DEEPSEEK_CJK.into(),
                r"\p{N}".into(),
            ],
            PreTokenizer::DeepseekV3 => vec![
                r"\p{N}{1,3}".into(),
                r"[一-龥぀-ゟ゠-ヿ]+".into(),
                // `~` is a symbol (\p{S}), as in llama.cpp's ASCII category table since it
                // gained `~` (llama-cpp-sys-2 0.1.161, llama-cpp-python 0.3.36; older builds
                // left it out of both \p{P} and \p{S}).
                r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##.into(),
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
            &["a", " ~~", " b", ",", " ", "東京"],
        );
        check(Gpt2, "it's 42", &["it", "'s", " 42"]);
        // DeepSeek LLM / V2: ids checked against llama.cpp's on 20 strings (README)
        check(DeepseekLlm, "Hello world", &["Hello", " world"]);
        check(DeepseekLlm, "a  \n\n b", &["a", "  ", "\n", "\n", " b"]);
        check(DeepseekLlm, "12345 it's", &["12345", " it", "'", "s"]);
        check(DeepseekLlm, "東京abc ώ", &["東京", "abc", " ώ"]);
        check(
            DeepseekCoder,
            "x = f(12);",
            &["x", " =", " f", "(", "1", "2", ");"],
        );
    }
}
