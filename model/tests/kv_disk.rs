//! The prefix cache's disk tier on the fixture models: an engine restarted on the same
//! directory takes a prompt's blocks from disk and gives the bits of the cold computation (F32
//! and F16, qwen3moe and deepseek2); corrupt, truncated and foreign files are skipped, never
//! loaded (a block computed again replaces them), and the directory stays within its bound.

use nightshift_model::kv::KvDiskOptions;
use nightshift_model::{Engine, KvType, Model, SeqId};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod fixture_util;
use fixture_util::kv::{same_bits, tokens};
use fixture_util::model;

const MODELS: [&str; 2] = ["tiny-qwen3moe-Q4_K_M.gguf", "tiny-deepseek2-Q4_K_M.gguf"];

fn engine(m: &Arc<Model>, ty: KvType, disk: Option<(&Path, u64)>) -> Engine {
    let mut e = fixture_util::kv::engine(m, ty, true);
    e.set_kv_disk(disk.map(|(dir, max_bytes)| KvDiskOptions {
        dir: dir.to_path_buf(),
        max_bytes,
    }))
    .expect("disk tier");
    e
}

/// Prefills the rest of `prompt`, then greedy-decodes 2 tokens: the logits rows.
fn finish(e: &mut Engine, seq: SeqId, prompt: &[u32], cached: usize) -> Vec<Vec<f32>> {
    fixture_util::kv::finish(e, seq, prompt, cached, 2)
}

/// Runs `prompt` on an engine over `dir` (its full blocks are written there) and drops it.
fn fill(m: &Arc<Model>, ty: KvType, dir: &Path, max: u64, prompt: &[u32]) {
    let mut e = engine(m, ty, Some((dir, max)));
    let (s, _) = e.admit(prompt, prompt.len() + 4, true).expect("admit");
    e.prefill(s, prompt).expect("prefill");
    e.remove_sequence(s);
}

/// A fresh engine over `dir`: the prompt's cached positions, its rows, and the files rejected.
fn restart(m: &Arc<Model>, ty: KvType, dir: &Path, prompt: &[u32]) -> (usize, Vec<Vec<f32>>, u64) {
    let mut e = engine(m, ty, Some((dir, 1 << 30)));
    let (s, cached) = e.admit(prompt, prompt.len() + 4, true).expect("admit");
    let rows = finish(&mut e, s, prompt, cached);
    (cached, rows, e.kv_stats().disk.rejected)
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").path())
        .collect();
    v.sort();
    v
}

/// The block files of `dir` in chain order (each file's parent field is the previous one's
/// hash field).
fn chain(dir: &Path) -> Vec<PathBuf> {
    let heads: Vec<(PathBuf, u64, u64)> = files(dir)
        .into_iter()
        .map(|p| {
            let b = std::fs::read(&p).expect("read");
            let hash = u64::from_le_bytes(b[40..48].try_into().expect("8 bytes"));
            let parent = u64::from_le_bytes(b[48..56].try_into().expect("8 bytes"));
            (p, hash, parent)
        })
        .collect();
    let mut out = Vec::new();
    let mut cur = heads
        .iter()
        .find(|(_, _, parent)| !heads.iter().any(|(_, h, _)| h == parent));
    while let Some((p, h, _)) = cur {
        out.push(p.clone());
        cur = heads.iter().find(|(_, _, parent)| parent == h);
    }
    out
}

/// A copy of `dir` in a new temporary directory.
fn copy(dir: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().expect("tempdir");
    for f in files(dir) {
        std::fs::copy(&f, to.path().join(f.file_name().expect("name"))).expect("copy");
    }
    to
}

#[test]
fn a_restarted_engine_takes_its_prefixes_from_disk_with_cold_bits() {
    for name in MODELS {
        let m = model(name);
        let vocab = m.config().n_vocab;
        for ty in [KvType::F32, KvType::F16, KvType::Q8_0] {
            let what = format!("{name} {ty:?}");
            let prompt = tokens(41, 31, vocab);
            let mut c = engine(&m, ty, None);
            let (s, _) = c.admit(&prompt, prompt.len() + 4, true).expect("admit");
            let want = finish(&mut c, s, &prompt, 0);
            let dir = tempfile::tempdir().expect("tempdir");
            fill(&m, ty, dir.path(), 1 << 30, &prompt);
            assert_eq!(
                files(dir.path()).len(),
                2,
                "{what}: two full blocks written"
            );
            let mut e = engine(&m, ty, Some((dir.path(), 1 << 30)));
            let (s, cached) = e.admit(&prompt, prompt.len() + 4, true).expect("admit");
            assert_eq!(cached, 32, "{what}: both blocks read back");
            assert_eq!(e.kv_stats().disk.loaded, 2, "{what}: loads counted");
            same_bits(&finish(&mut e, s, &prompt, cached), &want, &what);
            // the other cache type's files are foreign to this one: nothing loads
            let other = if ty == KvType::F32 {
                KvType::F16
            } else {
                KvType::F32
            };
            let (cached, _, rejected) = restart(&m, other, dir.path(), &prompt);
            assert_eq!(
                (cached, rejected),
                (0, 0),
                "{what}: other type, other hashes"
            );
        }
    }
}

#[test]
fn corrupt_truncated_and_foreign_files_are_skipped() {
    let m = model(MODELS[0]);
    let vocab = m.config().n_vocab;
    let ty = KvType::F32;
    let prompt = tokens(57, 41, vocab); // 3 full blocks
    let mut c = engine(&m, ty, None);
    let (s, _) = c.admit(&prompt, prompt.len() + 4, true).expect("admit");
    let want = finish(&mut c, s, &prompt, 0);
    let dir = tempfile::tempdir().expect("tempdir");
    fill(&m, ty, dir.path(), 1 << 30, &prompt);
    let blocks = chain(dir.path());
    assert_eq!(blocks.len(), 3, "three chained block files");
    let fresh = |what: &str, damage: &dyn Fn(&[PathBuf]), cached_want: usize| {
        let d = copy(dir.path());
        damage(&chain(d.path()));
        let (cached, rows, rejected) = restart(&m, ty, d.path(), &prompt);
        assert_eq!(
            cached, cached_want,
            "{what}: the blocks before the bad one only"
        );
        assert_eq!(rejected, 1, "{what}: one file rejected");
        same_bits(&rows, &want, what);
        // the block computed again replaced the bad file
        let (cached, rows, rejected) = restart(&m, ty, d.path(), &prompt);
        assert_eq!((cached, rejected), (48, 0), "{what}: every block loads now");
        same_bits(&rows, &want, what);
    };
    fresh(
        "a flipped payload byte",
        &|b| {
            let mut f = std::fs::read(&b[1]).expect("read");
            let at = f.len() - 100;
            f[at] ^= 1;
            std::fs::write(&b[1], f).expect("write");
        },
        16,
    );
    fresh(
        "a truncated file",
        &|b| {
            let f = std::fs::read(&b[0]).expect("read");
            std::fs::write(&b[0], &f[..f.len() / 2]).expect("write");
        },
        0,
    );
    fresh(
        "another model's file under the expected name",
        &|b| {
            let mut f = std::fs::read(&b[2]).expect("read");
            f[32] ^= 0xff; // the model fingerprint
            let n = f.len() - 4;
            let crc = crc32(&f[..n]);
            f[n..].copy_from_slice(&crc.to_le_bytes());
            std::fs::write(&b[2], f).expect("write");
        },
        32,
    );
}

/// CRC-32 (IEEE), bit by bit: the checksum the block files carry.
fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

#[test]
fn the_directory_stays_within_its_bound() {
    let m = model(MODELS[1]);
    let vocab = m.config().n_vocab;
    let probe = tempfile::tempdir().expect("tempdir");
    fill(
        &m,
        KvType::F16,
        probe.path(),
        1 << 30,
        &tokens(17, 51, vocab),
    );
    let one = std::fs::metadata(&files(probe.path())[0])
        .expect("meta")
        .len();
    let max = 2 * one + one / 2;
    let dir = tempfile::tempdir().expect("tempdir");
    for seed in 0..3 {
        fill(
            &m,
            KvType::F16,
            dir.path(),
            max,
            &tokens(49, 60 + seed, vocab),
        );
        let sizes: Vec<u64> = files(dir.path())
            .iter()
            .map(|f| std::fs::metadata(f).expect("meta").len())
            .collect();
        let total: u64 = sizes.iter().sum();
        assert!(total <= max, "{total} bytes on disk, bound {max}");
        assert_eq!(sizes.len(), 2, "the two most recent blocks are kept");
    }
    // the newest prompt's last blocks are what is left: its first block was evicted
    let p = tokens(49, 62, vocab);
    let (cached, _, _) = restart(&m, KvType::F16, dir.path(), &p);
    assert_eq!(
        cached, 0,
        "block 0 of the last prompt was evicted first (oldest)"
    );
}
