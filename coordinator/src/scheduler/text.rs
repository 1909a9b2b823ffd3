//! Incremental output text for one sequence: turns the raw bytes of sampled tokens into UTF-8
//! text that is safe to send (a multi-byte character split across tokens is held until it is
//! complete) and enforces stop strings (a stop string is never emitted, even when it is split
//! across tokens: text that could still become the start of a stop string is held back).

/// What pushing one token's bytes produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Text that can be sent now (possibly empty).
    Text(String),
    /// A stop string matched: the text before it that was not sent yet; generation must end.
    Stop(String),
}

/// The per-sequence text state: pending UTF-8 bytes, held-back text and the stop strings.
#[derive(Debug, Default)]
pub struct TextStream {
    bytes: Vec<u8>,
    held: String,
    stops: Vec<String>,
    /// The stop string that ended the stream, once one has.
    matched: Option<String>,
}

impl TextStream {
    /// A stream with these stop strings (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> TextStream {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        TextStream {
            bytes: Vec::new(),
            held: String::new(),
            stops,
            matched: None,
        }
    }

    /// The stop string that ended the stream (the earliest in the text; of several starting
    /// there, the first given).
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Appends the bytes of one token and returns what can be sent.
    pub fn push(&mut self, token_bytes: &[u8]) -> Pushed {
        self.bytes.extend_from_slice(token_bytes);
        let text = take_utf8(&mut self.bytes, false);
        self.held.push_str(&text);
        self.settle()
    }

    /// Ends the stream (EOS, length): flushes incomplete UTF-8 lossily and all held text.
    pub fn finish(&mut self) -> String {
        let tail = take_utf8(&mut self.bytes, true);
        self.held.push_str(&tail);
        // A stop string may still complete with the flushed bytes.
        match self.settle() {
            Pushed::Stop(t) => t,
            Pushed::Text(mut t) => {
                t.push_str(&std::mem::take(&mut self.held));
                t
            }
        }
    }

    fn settle(&mut self) -> Pushed {
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, stop)) = first {
            self.matched = Some(stop.clone());
            let before = self.held[..at].to_string();
            self.held.clear();
            return Pushed::Stop(before);
        }
        let keep = self.held_suffix_len();
        let emit_to = self.held.len() - keep;
        let out = self.held[..emit_to].to_string();
        self.held.drain(..emit_to);
        Pushed::Text(out)
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of a stop string.
    fn held_suffix_len(&self) -> usize {
        let len = self.held.len();
        let max = self.stops.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut k = max.saturating_sub(1).min(len);
        while k > 0 {
            let start = len - k;
            if self.held.is_char_boundary(start) {
                let suffix = &self.held[start..];
                if self.stops.iter().any(|s| s.starts_with(suffix)) {
                    return k;
                }
            }
            k -= 1;
        }
        0
    }
}

/// Takes the longest complete UTF-8 prefix out of `buf`; invalid sequences become U+FFFD; an
/// incomplete sequence at the end stays in `buf` unless `flush` (then it becomes U+FFFD too).
fn take_utf8(buf: &mut Vec<u8>, flush: bool) -> String {
    let mut out = String::new();
    loop {
        match std::str::from_utf8(buf) {
            Ok(s) => {
                out.push_str(s);
                buf.clear();
                return out;
            }
            Err(e) => {
                let valid = e.valid_up_to();
                // from_utf8 said the first `valid` bytes are UTF-8, so this never falls back.
                out.push_str(std::str::from_utf8(&buf[..valid]).unwrap_or_default());
                match e.error_len() {
                    Some(n) => {
                        out.push('\u{FFFD}');
                        buf.drain(..valid + n);
                    }
                    None if flush => {
                        out.push('\u{FFFD}');
                        buf.clear();
                        return out;
                    }
                    None => {
                        buf.drain(..valid);
                        return out;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` one token at a time; returns (everything emitted, stopped?).
    fn run(stops: &[&str], pieces: &[&[u8]]) -> (String, bool) {
        let mut ts = TextStream::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            match ts.push(p) {
                Pushed::Text(t) => out.push_str(&t),
                Pushed::Stop(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&ts.finish());
        (out, false)
    }

    fn check(stops: &[&str], pieces: &[&[u8]], expect: (&str, bool)) {
        let got = run(stops, pieces);
        assert_eq!(
            (got.0.as_str(), got.1),
            expect,
            "stops {stops:?} pieces {pieces:?}"
        );
    }

    #[test]
    fn stop_strings_and_utf8() {
        check(&[], &[b"hel", b"lo"], ("hello", false));
        check(&["lo"], &[b"hel", b"lo"], ("hel", true));
        // split across three tokens
        check(&["END"], &[b"abc E", b"N", b"D more"], ("abc ", true));
        // a partial match that does not complete is released
        check(&["END"], &[b"abc EN", b"X"], ("abc ENX", false));
        // held text flushed at the end
        check(&["END"], &[b"abc EN"], ("abc EN", false));
        // earliest of several stops wins
        check(&["b", "a"], &[b"xxab"], ("xx", true));
        // a multi-byte char split over tokens: "é" = c3 a9
        check(&[], &[b"caf", &[0xc3], &[0xa9], b"!"], ("café!", false));
        // incomplete at the end becomes U+FFFD, invalid byte too
        check(&[], &[b"a", &[0xc3]], ("a\u{FFFD}", false));
        check(&[], &[&[0xff], b"b"], ("\u{FFFD}b", false));
        // stop string containing multi-byte text
        check(&["é!"], &[b"caf", &[0xc3], &[0xa9], b"!"], ("caf", true));
        // stop at the very beginning
        check(&["\n"], &[b"\nfoo"], ("", true));
    }

    #[test]
    fn nothing_of_a_stop_string_is_emitted_before_it_completes() {
        let mut ts = TextStream::new(vec!["<|end|>".into()]);
        assert_eq!(ts.push(b"hi <|"), Pushed::Text("hi ".into()));
        assert_eq!(ts.push(b"en"), Pushed::Text(String::new()));
        assert_eq!(ts.push(b"d|>tail"), Pushed::Stop(String::new()));
    }

    #[test]
    fn the_matched_stop_is_the_earliest_in_the_text() {
        let mut ts = TextStream::new(vec!["END".into(), "\n\n".into()]);
        assert_eq!(ts.matched(), None);
        assert_eq!(ts.push(b"ab\n\nc END"), Pushed::Stop("ab".into()));
        assert_eq!(ts.matched(), Some("\n\n"));
        // a stop completed by the final flush counts too
        let mut ts = TextStream::new(vec!["xy".into()]);
        assert_eq!(ts.push(b"1x"), Pushed::Text("1".into()));
        assert_eq!(ts.push(b"y"), Pushed::Stop(String::new()));
        assert_eq!(ts.matched(), Some("xy"));
    }
}
