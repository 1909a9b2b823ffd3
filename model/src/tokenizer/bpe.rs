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

/// No neighbour.
const NONE: u32 = u32::MAX;

/// One symbol of a word being merged: 16 bytes, so a pre-token of n characters costs at most
/// 16n bytes of symbols plus 16 bytes per heap entry (at most 3n entries): O(n) memory.
#[derive(Clone, Copy)]
struct Sym {
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
}

/// Splits the byte-level encoded `word` into its BPE symbols (byte ranges of `word`), in
/// O(n log n) for n characters: a heap of candidate merges, lowest rank then leftmost first.
pub fn merge_word(word: &str, merges: &Merges) -> Vec<(usize, usize)> {
    // Symbol offsets are u32: a (theoretical) word of 4 GiB or more is merged in pieces.
    const MAX: usize = u32::MAX as usize - 4;
    if word.len() > MAX {
        let mut cut = MAX;
        while !word.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut out = merge_word(&word[..cut], merges);
        out.extend(
            merge_word(&word[cut..], merges)
                .into_iter()
                .map(|(a, b)| (a + cut, b + cut)),
        );
        return out;
    }
    let mut syms: Vec<Sym> = Vec::with_capacity(word.len());
    for (i, (start, c)) in word.char_indices().enumerate() {
        syms.push(Sym {
            start: start as u32,
            len: c.len_utf8() as u32,
            prev: if i == 0 { NONE } else { i as u32 - 1 },
            next: NONE,
        });
        if i > 0 {
            syms[i - 1].next = i as u32;
        }
    }
    let text = |s: Sym| &word[s.start as usize..(s.start + s.len) as usize];
    // Heap of (rank, left index, left len, right len); an entry is stale once either side grew.
    let mut heap: BinaryHeap<Reverse<(u32, u32, u32, u32)>> = BinaryHeap::new();
    let mut key = String::new();
    let push = |heap: &mut BinaryHeap<_>, key: &mut String, syms: &[Sym], l: u32, r: u32| {
        let (a, b) = (syms[l as usize], syms[r as usize]);
        if let Some(rank) = merges.rank(key, text(a), text(b)) {
            heap.push(Reverse((rank, l, a.len, b.len)));
        }
    };
    for i in 1..syms.len() as u32 {
        push(&mut heap, &mut key, &syms, i - 1, i);
    }
    while let Some(Reverse((_, l, llen, rlen))) = heap.pop() {
        let r = syms[l as usize].next;
        if r == NONE {
            continue;
        }
        let (li, ri) = (l as usize, r as usize);
        if syms[li].len != llen || syms[ri].len != rlen || llen == 0 || rlen == 0 {
            continue;
        }
        syms[li].len += syms[ri].len;
        syms[ri].len = 0;
        syms[li].next = syms[ri].next;
        let (p, n) = (syms[li].prev, syms[li].next);
        if n != NONE {
            syms[n as usize].prev = l;
        }
        if p != NONE {
            push(&mut heap, &mut key, &syms, p, l);
        }
        if n != NONE {
            push(&mut heap, &mut key, &syms, l, n);
        }
    }
    syms.iter()
        .filter(|s| s.len > 0)
        .map(|s| (s.start as usize, (s.start + s.len) as usize))
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
