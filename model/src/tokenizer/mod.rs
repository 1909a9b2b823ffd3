//! Tokenizer from `tokenizer.ggml.*`: byte-level BPE (`model = "gpt2"`) with llama.cpp's
//! pre-tokenizers (`pretok`), merges (`bpe`), special-token partitioning and end-of-generation
//! detection, plus [`StreamDecoder`] for streaming text that never splits a UTF-8 character.
//! Encoding follows llama.cpp's `llama_vocab::tokenize` so ids match it exactly.

mod bpe;
mod content;
mod pretok;
mod stream;

use std::collections::{HashMap, HashSet};

use crate::gguf::{Gguf, GgufError};

pub use content::Protect;
pub use pretok::PreTokenizer;
pub use stream::StreamDecoder;

/// Why a tokenizer could not be built from a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("metadata key {0} is missing")]
    MissingKey(&'static str),
    #[error("expected tokenizer.ggml.model \"gpt2\" (byte-level bpe), found {0:?}")]
    UnsupportedModel(String),
    #[error("unsupported tokenizer.ggml.pre {0:?}: expected one of default, gpt-2, llama3, qwen2, deepseek-v3, kimi-k2")]
    UnsupportedPre(String),
    #[error("tokenizer.ggml.token_type has {found} entries, expected one per token ({expected})")]
    TokenTypeCount { expected: usize, found: usize },
    #[error("pre-tokenizer regex: {0}")]
    Regex(String),
    #[error("vocabulary is empty")]
    EmptyVocab,
}

/// A token's type as stored in `tokenizer.ggml.token_type` (llama.cpp's llama_token_type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_i32(v: i32) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// Token texts llama.cpp treats as end of generation (and as control tokens) wherever they occur.
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// A byte-level BPE tokenizer loaded from a GGUF file.
#[derive(Debug)]
pub struct Tokenizer {
    texts: Vec<String>,
    types: Vec<TokenType>,
    /// Raw bytes of every token's piece (byte-decoded for normal tokens, as is for specials).
    pieces: Vec<Vec<u8>>,
    by_text: HashMap<String, u32>,
    merges: bpe::Merges,
    splitter: pretok::Splitter,
    pre: PreTokenizer,
    byte_chars: [char; 256],
    /// Special tokens matched in text before BPE, longest first.
    specials: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eog: HashSet<u32>,
    add_bos: bool,
    add_eos: bool,
}

fn token_id(g: &Gguf, key: &'static str, n: usize) -> Result<Option<u32>, TokenizerError> {
    // llama.cpp ignores an out-of-range id (keeps its default); so do we.
    Ok(g.metadata().get_u32(key)?.filter(|&id| (id as usize) < n))
}

impl Tokenizer {
    /// Builds the tokenizer from the `tokenizer.ggml.*` keys of `g`.
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer, TokenizerError> {
        let md = g.metadata();
        let model = md
            .get_str("tokenizer.ggml.model")?
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.model"))?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.to_string()));
        }
        let pre = PreTokenizer::from_name(md.get_str("tokenizer.ggml.pre")?)?;
        let tokens = md
            .get_str_array("tokenizer.ggml.tokens")?
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.tokens"))?;
        if tokens.is_empty() {
            return Err(TokenizerError::EmptyVocab);
        }
        let n = tokens.len();
        let mut types = match md.get_i32_array("tokenizer.ggml.token_type")? {
            Some(t) if t.len() != n => {
                return Err(TokenizerError::TokenTypeCount {
                    expected: n,
                    found: t.len(),
                })
            }
            Some(t) => t.into_iter().map(TokenType::from_i32).collect(),
            None => vec![TokenType::Normal; n],
        };
        let texts: Vec<String> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if t.is_empty() {
                    format!("[EMPTY_{i}]")
                } else {
                    t.to_string()
                }
            })
            .collect();
        let mut by_text = HashMap::with_capacity(n);
        for (i, t) in texts.iter().enumerate() {
            // Later duplicates win, as in llama.cpp's token_to_id map.
            by_text.insert(t.clone(), i as u32);
        }
        let mut merges = bpe::Merges::default();
        if let Some(lines) = md.get_str_array("tokenizer.ggml.merges")? {
            for (rank, line) in lines.iter().enumerate() {
                merges.insert(line, rank as u32);
            }
        } else {
            return Err(TokenizerError::MissingKey("tokenizer.ggml.merges"));
        }

        // gpt2 defaults as in llama.cpp, then the file's keys.
        let default_special = (n > 11).then_some(11);
        let bos = token_id(g, "tokenizer.ggml.bos_token_id", n)?.or(default_special);
        let eos = token_id(g, "tokenizer.ggml.eos_token_id", n)?.or(default_special);
        let mut eot = token_id(g, "tokenizer.ggml.eot_token_id", n)?;
        let eom = token_id(g, "tokenizer.ggml.eom_token_id", n)?;
        let add_bos = md
            .get_bool("tokenizer.ggml.add_bos_token")?
            .unwrap_or(pre == PreTokenizer::Llama3);
        let add_eos = md
            .get_bool("tokenizer.ggml.add_eos_token")?
            .unwrap_or(false);

        let mut eog = HashSet::new();
        for name in EOG_NAMES {
            if let Some(&id) = by_text.get(*name) {
                eog.insert(id);
                if types[id as usize] != TokenType::Control {
                    types[id as usize] = TokenType::Control;
                }
                if eot.is_none()
                    && *name != "<|return|>"
                    && *name != "<|call|>"
                    && *name != "<|eom_id|>"
                {
                    eot = Some(id);
                }
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());

        let byte_chars = bpe::byte_to_char_table();
        let char_bytes = bpe::char_to_byte_map();
        let pieces = texts
            .iter()
            .zip(&types)
            .map(|(t, ty)| match ty {
                TokenType::Normal => t
                    .chars()
                    .flat_map(|c| match char_bytes.get(&c) {
                        Some(&b) => vec![b],
                        None => c.to_string().into_bytes(),
                    })
                    .collect(),
                TokenType::Control | TokenType::UserDefined | TokenType::Unknown => {
                    t.as_bytes().to_vec()
                }
                _ => Vec::new(),
            })
            .collect();
        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                matches!(
                    types[i as usize],
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                )
            })
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(texts[i as usize].len()));

        Ok(Tokenizer {
            splitter: pretok::Splitter::new(pre)?,
            texts,
            types,
            pieces,
            by_text,
            merges,
            pre,
            byte_chars,
            specials,
            bos,
            eos,
            eot,
            eog,
            add_bos,
            add_eos,
        })
    }

    /// Token ids of `text`. `add_bos` asks for the special prefix/suffix tokens, which are added
    /// only if the vocabulary says so too (`tokenizer.ggml.add_bos_token` / `add_eos_token`),
    /// as llama.cpp's `add_special`. With `parse_special`, control tokens written in the text
    /// (e.g. `<|im_start|>`) become their ids; user-defined tokens always do.
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        self.encode_parts(text, add_bos, parse_special, &[])
    }

    /// `encode`, with no special token overlapping a byte range of `plain` (`content.rs`).
    fn encode_parts(
        &self,
        text: &str,
        add_bos: bool,
        parse_special: bool,
        plain: &[std::ops::Range<usize>],
    ) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos && self.add_bos {
            out.extend(self.bos);
        }
        for frag in self.partition(text, parse_special, plain) {
            match frag {
                Frag::Token(id) => out.push(id),
                Frag::Text(s) => self.encode_text(s, &mut out),
            }
        }
        if add_bos && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Splits `text` around special tokens, longest token first (llama.cpp's st_partition);
    /// an occurrence overlapping a byte range of `plain` stays text.
    fn partition<'t>(
        &self,
        text: &'t str,
        parse_special: bool,
        plain: &[std::ops::Range<usize>],
    ) -> Vec<Frag<'t>> {
        let mut frags = vec![Frag::Text(text)];
        if text.is_empty() {
            return Vec::new();
        }
        for &id in &self.specials {
            let ty = self.types[id as usize];
            if !parse_special && matches!(ty, TokenType::Control | TokenType::Unknown) {
                continue;
            }
            let pat = self.texts[id as usize].as_str();
            if !frags
                .iter()
                .any(|f| matches!(f, Frag::Text(s) if s.contains(pat)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Frag::Text(s) = f else {
                    next.push(f);
                    continue;
                };
                // Byte offset of this fragment in `text`.
                let base = s.as_ptr() as usize - text.as_ptr() as usize;
                let (mut kept, mut from) = (0, 0);
                while let Some(rel) = s[from..].find(pat) {
                    let at = from + rel;
                    if content::overlaps(plain, base + at, base + at + pat.len()) {
                        from = at + s[at..].chars().next().map_or(1, char::len_utf8);
                        continue;
                    }
                    if at > kept {
                        next.push(Frag::Text(&s[kept..at]));
                    }
                    next.push(Frag::Token(id));
                    kept = at + pat.len();
                    from = kept;
                }
                if kept < s.len() {
                    next.push(Frag::Text(&s[kept..]));
                }
            }
            frags = next;
        }
        frags
    }

    fn encode_text(&self, text: &str, out: &mut Vec<u32>) {
        let mut word = String::new();
        for (a, b) in self.splitter.split(text) {
            word.clear();
            for &byte in &text.as_bytes()[a..b] {
                word.push(self.byte_chars[byte as usize]);
            }
            if self.pre.ignore_merges() {
                if let Some(&id) = self.by_text.get(word.as_str()) {
                    out.push(id);
                    continue;
                }
            }
            for (s, e) in bpe::merge_word(&word, &self.merges) {
                let sym = &word[s..e];
                match self.by_text.get(sym) {
                    Some(&id) => out.push(id),
                    None => {
                        // llama.cpp falls back to tokens for the single bytes of the symbol.
                        for i in 0..sym.len() {
                            if let Some(&id) = sym.get(i..i + 1).and_then(|b| self.by_text.get(b)) {
                                out.push(id);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Raw bytes of a token's piece (empty for an unknown id or an unused token).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], |p| p.as_slice())
    }

    /// The token's text as stored in the vocabulary (byte-level encoded for normal tokens).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The id of the token whose stored text is `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.by_text.get(text).copied()
    }

    /// The token's type (None for an unknown id).
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// True for control, user-defined and unknown tokens.
    pub fn is_special(&self, id: u32) -> bool {
        matches!(
            self.token_type(id),
            Some(TokenType::Control | TokenType::UserDefined | TokenType::Unknown)
        )
    }

    /// The text of `ids`, special tokens included; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| self.token_bytes(id).iter().copied())
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Like [`Tokenizer::decode`] but control tokens render as nothing.
    pub fn decode_skip_control(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .filter(|&&id| self.token_type(id) != Some(TokenType::Control))
            .flat_map(|&id| self.token_bytes(id).iter().copied())
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn vocab_size(&self) -> usize {
        self.texts.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token (`tokenizer.ggml.eot_token_id`, else detected by name as llama.cpp does).
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// End of generation: eos, eot, eom, and the tokens llama.cpp recognises by name
    /// (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// All end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.eog.iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// `tokenizer.ggml.add_bos_token` (llama.cpp's default when absent).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }
}

enum Frag<'t> {
    Text(&'t str),
    Token(u32),
}
