//! Deterministic fuzzing of the GGUF parser in the normal test run: thousands of byte flips,
//! overwrites with boundary values and truncations of small built files and of a real fixture's
//! header, each of which must parse or fail with a typed error (never panic), and any accepted
//! file must describe tensors that lie inside it. The `gguf` target of `fuzz/` does the same
//! open-ended (a time-bounded stable driver in the test run, libFuzzer in `fuzz/libfuzzer`).

mod gguf_util;

use nightshift_kernels::rng::SplitMix64;
use std::path::Path;

use gguf_util::Builder;
use nightshift_model::gguf::{check_image, Value};

/// splitmix64: a tiny deterministic generator, so failures reproduce.
struct Rng(SplitMix64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Parses `bytes` and checks whatever it accepted is self-consistent. Returns true if accepted.
fn parse_ok(bytes: &[u8]) -> bool {
    match check_image(bytes) {
        Ok((md, tensors)) => {
            for (key, _) in md.iter() {
                let _ = (md.get_u32(key), md.get_f32(key), md.get_str(key));
                let _ = (
                    md.get_str_array(key),
                    md.get_i32_array(key),
                    md.get_f32_array(key),
                );
            }
            for t in &tensors {
                assert!(t.offset() + t.size() <= bytes.len() as u64, "{}", t.name);
            }
            true
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            false
        }
    }
}

/// Mutates `buf[..region]` `cases` times (restoring it after each case) and truncates it.
fn fuzz(name: &str, buf: &mut [u8], region: usize, cases: usize, seed: u64) -> (usize, usize) {
    let mut rng = Rng(SplitMix64::new(seed));
    let region = region.min(buf.len());
    let mut accepted = 0;
    let specials: [u64; 8] = [
        0,
        1,
        0xff,
        0x7fff_ffff,
        0xffff_ffff,
        1 << 32,
        i64::MAX as u64,
        u64::MAX,
    ];
    for case in 0..cases {
        let kind = rng.below(4);
        let mut saved = Vec::new();
        match kind {
            // 1-4 random byte flips.
            0 | 1 => {
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(region);
                    saved.push((at, buf[at]));
                    buf[at] ^= 1 << rng.below(8);
                }
            }
            // A boundary value written over 8 bytes.
            2 => {
                let at = rng.below(region.saturating_sub(8).max(1));
                let v = specials[rng.below(specials.len())].to_le_bytes();
                for (i, b) in v.iter().enumerate().take(buf.len() - at) {
                    saved.push((at + i, buf[at + i]));
                    buf[at + i] = *b;
                }
            }
            // A truncation.
            _ => {
                let len = rng.below(buf.len());
                let ok = std::panic::catch_unwind(|| parse_ok(&buf[..len]));
                assert!(
                    ok.is_ok(),
                    "{name}: case {case} (truncate to {len}) panicked"
                );
                accepted += ok.unwrap_or(false) as usize;
                continue;
            }
        }
        let snapshot: &[u8] = buf;
        let ok = std::panic::catch_unwind(|| parse_ok(snapshot));
        assert!(
            ok.is_ok(),
            "{name}: case {case} (mutation {saved:?}) panicked"
        );
        accepted += ok.unwrap_or(false) as usize;
        for (at, b) in saved.into_iter().rev() {
            buf[at] = b;
        }
    }
    (accepted, cases)
}

#[test]
fn fuzz_built_files() {
    let mut nested = Value::U32(9);
    for _ in 0..3 {
        nested = Value::Array(vec![nested.clone(), nested]);
    }
    let (mut small, _) = Builder::new()
        .kv("general.architecture", Value::Str("fuzz".into()))
        .kv("general.alignment", Value::U32(32))
        .kv("a.f", Value::F32(1.5))
        .kv(
            "a.list",
            Value::Array(vec![Value::Str("x".into()), Value::Str("yz".into())]),
        )
        .kv("a.nested", nested)
        .f32_tensor("t0", &[4, 2])
        .tensor("t1", &[32, 2], 8, vec![0; 68])
        .f32_tensor("t2", &[3])
        .build();
    assert!(parse_ok(&small));
    let len = small.len();
    let (accepted, total) = fuzz("built", &mut small, len, 4000, 0x5eed);
    // Some flips land in tensor data or padding and must still be accepted.
    assert!(accepted > 0 && accepted < total, "{accepted}/{total}");
}

#[test]
fn fuzz_fixture_header() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-deepseek2-Q2_K.gguf");
    let mut bytes = std::fs::read(path).unwrap();
    assert!(parse_ok(&bytes));
    // The header (metadata with the vocabulary, tensor infos) is the first ~16 KiB.
    let (accepted, total) = fuzz("fixture", &mut bytes, 16_384, 2000, 0xf17e);
    assert!(accepted > 0 && accepted < total, "{accepted}/{total}");
}
