//! Byte-level BPE as llama.cpp's `llm_tokenizer_bpe_session` does it: GPT-2's byte<->unicode
//! mapping, then per word repeatedly merge the adjacent pair with the lowest merge rank (leftmost
//! first on ties), and finally look each symbol up in the vocabulary (falling back to its single
//! bytes when a symbol is not a token).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// GPT-2's printable stand-in for every byte: printable Latin-1 bytes map to themselves, the
/// other 68 bytes to U+0100.. in byte order.
pub fn byte_to_char_table() -> [char; 256] {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            n += 1;
            255 + n
        };
        table[b as usize] = char::from_u32(c).unwrap_or('\u{fffd}');
    }
    table
}

/// The inverse of [`byte_to_char_table`].
pub fn char_to_byte_map() -> HashMap<char, u8> {
    byte_to_char_table()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// Merge ranks keyed by "left right" (the merge line as stored in the GGUF).
#[derive(Debug, Default)]
pub struct Merges {
    ranks: HashMap<String, u32>,
}

impl Merges {
    /// Adds merge line `line` with rank `rank`; lines without a separating space (after the first
    /// character, as llama.cpp splits them) are ignored, as llama.cpp does.
    pub fn insert(&mut self, line: &str, rank: u32) -> bool {
        let first = line.chars().next().map_or(0, char::len_utf8);
        if first == 0 || !line[first..].contains(' ') {
            return false;
        }
        self.ranks.entry(line.to_string()).or_insert(rank);
        true
    }

    fn rank(&self, key: &mut String, left: &str, right: &str) -> Option<u32> {
        key.clear();
        key.push_str(left);
        key.push(' ');
        key.push_str(right);
        self.ranks.get(key.as_str()).copied()
    }
}

#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// Splits the byte-level encoded `word` into its BPE symbols (byte ranges of `word`).
pub fn merge_word(word: &str, merges: &Merges) -> Vec<(usize, usize)> {
    let mut syms: Vec<Sym> = Vec::with_capacity(word.len());
    for (i, (start, c)) in word.char_indices().enumerate() {
        syms.push(Sym {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: None,
        });
        if i > 0 {
            syms[i - 1].next = Some(i);
        }
    }
    // Heap of (rank, left index, left len, right len); an entry is stale once either side grew.
    let mut heap = BinaryHeap::new();
    let mut key = String::new();
    let push = |heap: &mut BinaryHeap<_>, key: &mut String, syms: &[Sym], l: usize, r: usize| {
        let (a, b) = (syms[l], syms[r]);
        let left = &word[a.start..a.start + a.len];
        let right = &word[b.start..b.start + b.len];
        if let Some(rank) = merges.rank(key, left, right) {
            heap.push(Reverse((rank, l, a.len, b.len)));
        }
    };
    for i in 1..syms.len() {
        push(&mut heap, &mut key, &syms, i - 1, i);
    }
    while let Some(Reverse((_, l, llen, rlen))) = heap.pop() {
        let Some(r) = syms[l].next else { continue };
        if syms[l].len != llen || syms[r].len != rlen || llen == 0 || rlen == 0 {
            continue;
        }
        syms[l].len += syms[r].len;
        syms[r].len = 0;
        syms[l].next = syms[r].next;
        if let Some(n) = syms[r].next {
            syms[n].prev = Some(l);
        }
        if let Some(p) = syms[l].prev {
            push(&mut heap, &mut key, &syms, p, l);
        }
        if let Some(n) = syms[l].next {
            push(&mut heap, &mut key, &syms, l, n);
        }
    }
    syms.iter()
        .filter(|s| s.len > 0)
        .map(|s| (s.start, s.start + s.len))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table() {
        let t = byte_to_char_table();
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[0], 'Ā');
        assert_eq!(char_to_byte_map().len(), 256);
    }

    #[test]
    fn merges_lowest_rank_first_leftmost_on_ties() {
        let mut m = Merges::default();
        m.insert("a a", 0);
        m.insert("b c", 1);
        m.insert("aa b", 2);
        let check = |w: &str, expect: &[&str]| {
            let got: Vec<&str> = merge_word(w, &m)
                .into_iter()
                .map(|(a, b)| &w[a..b])
                .collect();
            assert_eq!(got, expect, "{w}");
        };
        check("aaa", &["aa", "a"]);
        check("aabc", &["aa", "bc"]);
        check("aab", &["aab"]);
        check("", &[]);
        check("é", &["é"]);
    }
}
