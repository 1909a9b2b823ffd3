//! Streaming detokenization: token pieces are raw bytes and a multi-byte UTF-8 character may be
//! split across tokens, so [`StreamDecoder`] holds back an incomplete trailing sequence until the
//! next token completes it, and replaces bytes that can never become valid UTF-8 with U+FFFD.

use super::Tokenizer;

/// Feeds token ids one at a time and returns only complete UTF-8 text.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        StreamDecoder::default()
    }

    /// Adds token `id`; returns the text that became complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.push_bytes(tok.token_bytes(id))
    }

    /// Adds raw bytes; returns the text that became complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // `good` is the prefix from_utf8 just validated, so this never falls back.
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        // An invalid sequence: it can never complete.
                        Some(n) => {
                            out.push('\u{fffd}');
                            rest = &bad[n..];
                        }
                        // An incomplete sequence at the end: wait for more bytes.
                        None => {
                            rest = bad;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let len = self.pending.len();
        self.pending.drain(..len - keep);
        out
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Ends the stream: whatever is held back, lossily.
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_incomplete_characters() {
        let mut d = StreamDecoder::new();
        let emoji = "😀".as_bytes();
        assert_eq!(d.push_bytes(&emoji[..1]), "");
        assert_eq!(d.push_bytes(&emoji[1..3]), "");
        assert_eq!(d.pending(), 3);
        assert_eq!(d.push_bytes(&[emoji[3], b'a']), "😀a");
        assert_eq!(d.push_bytes(&[0xff, b'b']), "\u{fffd}b");
        assert_eq!(d.push_bytes(&[0xe6, 0x9d]), "");
        assert_eq!(d.flush(), "\u{fffd}");
        assert_eq!(d.pending(), 0);
    }
}
