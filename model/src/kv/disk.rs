//! The disk tier of the prefix cache (`--kv-cache-dir`): every full block that enters the
//! prefix index is also written, once and in the background, to a file of its own named by its
//! chain hash, so a block evicted from memory, or lost with a restarted (even killed) server, is
//! read back on a hit instead of computed again. Writing when a block is registered rather than
//! when it is evicted costs a copy of the block on the engine thread and keeps eviction free.
//!
//! A file is checked before any of it is used: its magic and format version, the model's
//! weights fingerprint, the cache type and the block layout (another model's or another
//! configuration's file is *foreign*), its chain hash, parent hash and tokens (the ones looked
//! up), its length and a CRC-32 of everything. A file failing any check is skipped with a
//! warning, never loaded; a corrupt or truncated one is deleted. The directory is bounded
//! (`--kv-cache-dir-max`): least recently used files (written or read; file times carry the
//! order over restarts) are deleted first. Files are written to a temporary name and renamed,
//! so a reader never sees half a file.

use super::{KvLayout, KvType};
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::SystemTime;

/// Where and how large the disk tier is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvDiskOptions {
    pub dir: PathBuf,
    /// Most bytes of block files in `dir`.
    pub max_bytes: u64,
}

/// What a block file is checked against: the cache it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskKey {
    /// The model's weights fingerprint (`Gguf::weights_fingerprint`).
    pub model: u64,
    pub ty: KvType,
    pub layout: KvLayout,
}

const MAGIC: &[u8; 8] = b"NSKVBLK\0";
const VERSION: u32 = 1;
const EXT: &str = "nskv";
/// Magic, version, type, block, layers, K width, V width, model, hash, parent, token count.
const HEADER: usize = 8 + 4 * 6 + 8 * 3 + 4;
/// Writes queued for the writer thread at most (beyond that a block is simply not written).
const QUEUE: usize = 256;

fn type_code(ty: KvType) -> u32 {
    match ty {
        KvType::F32 => 0,
        KvType::F16 => 1,
        // 2 was Q8_0 before grouped-query rows were stored rotated (`KvType::rotation`): such
        // files are foreign now
        KvType::Q8_0 => 3,
    }
}

/// The bytes of a block file.
pub fn encode(key: &DiskKey, hash: u64, parent: u64, tokens: &[u32], payload: &[u8]) -> Vec<u8> {
    let l = key.layout;
    let mut out = Vec::with_capacity(HEADER + 4 * tokens.len() + 8 + payload.len() + 4);
    out.extend_from_slice(MAGIC);
    for v in [
        VERSION,
        type_code(key.ty),
        l.block as u32,
        l.n_layer as u32,
        l.k_width as u32,
        l.v_width as u32,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [key.model, hash, parent] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Why a block file was not loaded.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// Damaged: wrong magic, length or checksum (the file is deleted).
    #[error("corrupt: {0}")]
    Corrupt(String),
    /// Written by another format version, model, cache type or layout (the file is left).
    #[error("foreign: {0}")]
    Foreign(String),
    /// A well-formed file of this cache that holds another prefix (a hash collision or a
    /// renamed file).
    #[error("holds another prefix: {0}")]
    Other(String),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

/// The payload of a block file, if it is a sound file of the cache `key` holding `tokens`
/// after the prefix `parent` under `hash`, with a payload of `payload_len` bytes.
pub fn decode<'a>(
    key: &DiskKey,
    hash: u64,
    parent: u64,
    tokens: &[u32],
    payload_len: usize,
    file: &'a [u8],
) -> Result<&'a [u8], Rejected> {
    let corrupt = |what: String| Err(Rejected::Corrupt(what));
    if file.len() < HEADER + 8 + 4 {
        return corrupt(format!(
            "expected at least {} bytes, found {}",
            HEADER + 12,
            file.len()
        ));
    }
    if &file[..8] != MAGIC {
        return corrupt("expected the NSKVBLK magic, found other bytes".into());
    }
    let (body, tail) = file.split_at(file.len() - 4);
    let crc = u32_at(tail, 0);
    let n_tok = u32_at(file, HEADER - 4) as usize;
    let tok_end = HEADER.saturating_add(n_tok.saturating_mul(4));
    if tok_end.saturating_add(8) > body.len() {
        return corrupt(format!(
            "expected {n_tok} tokens and a payload, found {} bytes",
            file.len()
        ));
    }
    let len = u64_at(file, tok_end) as usize;
    let want = tok_end + 8 + len + 4;
    if want != file.len() {
        return corrupt(format!(
            "expected {want} bytes (truncated or extended?), found {}",
            file.len()
        ));
    }
    let found = crc32fast::hash(body);
    if found != crc {
        return corrupt(format!("expected checksum {crc:08x}, found {found:08x}"));
    }
    let version = u32_at(file, 8);
    if version != VERSION {
        return Err(Rejected::Foreign(format!(
            "expected format version {VERSION}, found {version}"
        )));
    }
    let model = u64_at(file, 32);
    if model != key.model {
        return Err(Rejected::Foreign(format!(
            "expected model fingerprint {:016x}, found {model:016x}",
            key.model
        )));
    }
    let l = key.layout;
    let want_geom = [
        type_code(key.ty),
        l.block as u32,
        l.n_layer as u32,
        l.k_width as u32,
        l.v_width as u32,
    ];
    let geom: Vec<u32> = (0..5).map(|i| u32_at(file, 12 + 4 * i)).collect();
    if geom != want_geom {
        return Err(Rejected::Foreign(format!(
            "expected cache type and layout (type, block, layers, k, v) {want_geom:?}, found {geom:?}"
        )));
    }
    if len != payload_len {
        return Err(Rejected::Foreign(format!(
            "expected a payload of {payload_len} bytes, found {len}"
        )));
    }
    let (h, p) = (u64_at(file, 40), u64_at(file, 48));
    let toks_ok = n_tok == tokens.len()
        && tokens
            .iter()
            .enumerate()
            .all(|(i, &t)| u32_at(file, HEADER + 4 * i) == t);
    if h != hash || p != parent || !toks_ok {
        return Err(Rejected::Other(format!(
            "expected block {hash:016x} after {parent:016x}, found {h:016x} after {p:016x}"
        )));
    }
    Ok(&file[tok_end + 8..tok_end + 8 + len])
}

/// Work for the writer thread.
enum Op {
    Write(PathBuf, Vec<u8>),
    Remove(PathBuf),
    Touch(PathBuf),
}

/// One file of the tier.
struct Entry {
    size: u64,
    tick: u64,
}

/// Counters of the disk tier since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskCounters {
    /// Blocks queued for writing.
    pub written: u64,
    /// Blocks read back into the pool.
    pub loaded: u64,
    /// Files skipped (corrupt, foreign or holding another prefix).
    pub rejected: u64,
    /// Files deleted to keep the directory within its bound.
    pub removed: u64,
    /// Block files in the directory and their bytes.
    pub files: u64,
    pub bytes: u64,
}

/// The block files of one directory, their LRU order, and the writer thread.
pub struct DiskTier {
    dir: PathBuf,
    max_bytes: u64,
    key: DiskKey,
    files: HashMap<u64, Entry>,
    lru: BTreeMap<u64, u64>,
    tick: u64,
    bytes: u64,
    counters: DiskCounters,
    tx: Option<SyncSender<Op>>,
    writer: Option<JoinHandle<()>>,
}

fn file_hash(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(EXT)?.strip_suffix('.')?;
    (stem.len() == 16)
        .then(|| u64::from_str_radix(stem, 16).ok())
        .flatten()
}

impl DiskTier {
    /// Opens (creating it if needed) the tier in `o.dir` for the cache `key`: lists the block
    /// files there (oldest use first, by file time) and deletes the oldest beyond the bound.
    pub fn open(o: &KvDiskOptions, key: DiskKey) -> std::io::Result<DiskTier> {
        fs::create_dir_all(&o.dir)?;
        let mut found = Vec::new();
        for e in fs::read_dir(&o.dir)? {
            let e = e?;
            let name = e.file_name();
            let Some(hash) = name.to_str().and_then(file_hash) else {
                continue;
            };
            let meta = e.metadata()?;
            if !meta.is_file() {
                continue;
            }
            let when = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            found.push((when, hash, meta.len()));
        }
        found.sort();
        let (tx, rx) = sync_channel::<Op>(QUEUE);
        let writer = std::thread::Builder::new()
            .name("nightshift-kv-disk".into())
            .spawn(move || {
                for op in rx {
                    run_op(op);
                }
            })?;
        let mut t = DiskTier {
            dir: o.dir.clone(),
            max_bytes: o.max_bytes,
            key,
            files: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            bytes: 0,
            counters: DiskCounters::default(),
            tx: Some(tx),
            writer: Some(writer),
        };
        for (_, hash, size) in found {
            t.tick += 1;
            t.files.insert(hash, Entry { size, tick: t.tick });
            t.lru.insert(t.tick, hash);
            t.bytes += size;
        }
        t.shrink(0);
        Ok(t)
    }

    pub fn key(&self) -> DiskKey {
        self.key
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn counters(&self) -> DiskCounters {
        DiskCounters {
            files: self.files.len() as u64,
            bytes: self.bytes,
            ..self.counters
        }
    }

    fn path(&self, hash: u64) -> PathBuf {
        self.dir.join(format!("{hash:016x}.{EXT}"))
    }

    pub fn contains(&self, hash: u64) -> bool {
        self.files.contains_key(&hash)
    }

    fn send(&mut self, op: Op) -> bool {
        match self.tx.as_ref().map(|tx| tx.try_send(op)) {
            Some(Ok(())) => true,
            Some(Err(TrySendError::Full(_))) | Some(Err(TrySendError::Disconnected(_))) | None => {
                false
            }
        }
    }

    /// Marks `hash` as just used.
    fn touch(&mut self, hash: u64) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(e) = self.files.get_mut(&hash) {
            self.lru.remove(&e.tick);
            e.tick = tick;
            self.lru.insert(tick, hash);
        }
    }

    fn forget(&mut self, hash: u64) {
        if let Some(e) = self.files.remove(&hash) {
            self.lru.remove(&e.tick);
            self.bytes = self.bytes.saturating_sub(e.size);
        }
    }

    /// Deletes least recently used files until `extra` more bytes fit the bound.
    fn shrink(&mut self, extra: u64) {
        while self.bytes + extra > self.max_bytes {
            let Some((_, hash)) = self.lru.pop_first() else {
                break;
            };
            if let Some(e) = self.files.remove(&hash) {
                self.bytes = self.bytes.saturating_sub(e.size);
            }
            let p = self.path(hash);
            if !self.send(Op::Remove(p.clone())) {
                let _ = fs::remove_file(p);
            }
            self.counters.removed += 1;
        }
    }

    /// Queues the block registered under `hash` for writing (once: a block already on disk is
    /// only marked used). Skipped when the file would not fit the bound or the queue is full.
    pub fn store(&mut self, hash: u64, parent: u64, tokens: &[u32], payload: &[u8]) {
        if self.files.contains_key(&hash) {
            self.touch(hash);
            let p = self.path(hash);
            self.send(Op::Touch(p));
            return;
        }
        let bytes = encode(&self.key, hash, parent, tokens, payload);
        let size = bytes.len() as u64;
        if size > self.max_bytes {
            return;
        }
        self.shrink(size);
        let p = self.path(hash);
        if self.send(Op::Write(p, bytes)) {
            self.tick += 1;
            self.files.insert(
                hash,
                Entry {
                    size,
                    tick: self.tick,
                },
            );
            self.lru.insert(self.tick, hash);
            self.bytes += size;
            self.counters.written += 1;
        }
    }

    /// The payload of the block `hash` (holding `tokens` after `parent`), read and checked;
    /// None when there is no such file or it fails a check (then it is skipped with a warning,
    /// and deleted if damaged).
    pub fn load(
        &mut self,
        hash: u64,
        parent: u64,
        tokens: &[u32],
        payload_len: usize,
    ) -> Option<Vec<u8>> {
        if !self.files.contains_key(&hash) {
            return None;
        }
        let path = self.path(hash);
        let file = match fs::read(&path) {
            Ok(f) => f,
            // queued and not written yet, or deleted behind our back
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "kv cache dir: could not read a block file, skipped");
                self.forget(hash);
                return None;
            }
        };
        match decode(&self.key, hash, parent, tokens, payload_len, &file) {
            Ok(payload) => {
                let payload = payload.to_vec();
                self.touch(hash);
                self.send(Op::Touch(path));
                self.counters.loaded += 1;
                Some(payload)
            }
            Err(why) => {
                tracing::warn!(file = %path.display(), reason = %why, "kv cache dir: block file skipped, not loaded");
                self.counters.rejected += 1;
                self.forget(hash);
                if matches!(why, Rejected::Corrupt(_)) && !self.send(Op::Remove(path.clone())) {
                    let _ = fs::remove_file(path);
                }
                None
            }
        }
    }
}

impl Drop for DiskTier {
    /// Finishes the queued writes.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// Runs one queued operation; failures are logged (a block not written is computed again).
fn run_op(op: Op) {
    match op {
        Op::Write(path, bytes) => {
            let tmp = path.with_extension("tmp");
            let res = fs::File::create(&tmp)
                .and_then(|mut f| f.write_all(&bytes))
                .and_then(|()| fs::rename(&tmp, &path));
            if let Err(e) = res {
                let _ = fs::remove_file(&tmp);
                tracing::warn!(file = %path.display(), error = %e, "kv cache dir: could not write a block file");
            }
        }
        Op::Remove(path) => {
            let _ = fs::remove_file(path);
        }
        Op::Touch(path) => {
            if let Ok(f) = fs::File::options().append(true).open(&path) {
                let _ = f.set_modified(SystemTime::now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The file format's checks, one field at a time, and the directory's bound.

    use super::*;

    fn key() -> DiskKey {
        DiskKey {
            model: 0xabcd,
            ty: KvType::F16,
            layout: KvLayout {
                n_layer: 2,
                k_width: 3,
                v_width: 1,
                block: 4,
            },
        }
    }

    const TOKS: [u32; 4] = [5, 6, 7, 8];

    fn file() -> Vec<u8> {
        encode(&key(), 11, 10, &TOKS, &[1, 2, 3, 4, 5, 6])
    }

    fn reseal(f: &mut Vec<u8>) {
        let n = f.len() - 4;
        let crc = crc32fast::hash(&f[..n]);
        f[n..].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn a_sound_file_gives_its_payload() {
        let f = file();
        assert_eq!(
            decode(&key(), 11, 10, &TOKS, 6, &f),
            Ok(&[1u8, 2, 3, 4, 5, 6][..])
        );
    }

    #[test]
    fn damaged_files_are_corrupt() {
        let f = file();
        for cut in [0, 10, HEADER, f.len() - 1] {
            assert!(
                matches!(
                    decode(&key(), 11, 10, &TOKS, 6, &f[..cut]),
                    Err(Rejected::Corrupt(_))
                ),
                "truncated at {cut}"
            );
        }
        for at in [0, 9, 30, HEADER + 2, f.len() - 3, f.len() - 1] {
            let mut g = f.clone();
            g[at] ^= 0x20;
            assert!(
                matches!(
                    decode(&key(), 11, 10, &TOKS, 6, &g),
                    Err(Rejected::Corrupt(_))
                ),
                "byte {at} flipped"
            );
        }
        let mut g = f.clone();
        g.push(0);
        assert!(matches!(
            decode(&key(), 11, 10, &TOKS, 6, &g),
            Err(Rejected::Corrupt(_))
        ));
    }

    #[test]
    fn other_models_types_layouts_and_versions_are_foreign() {
        let mut k = key();
        k.model = 0xabce;
        let f = encode(&k, 11, 10, &TOKS, &[0; 6]);
        assert!(matches!(
            decode(&key(), 11, 10, &TOKS, 6, &f),
            Err(Rejected::Foreign(_))
        ));
        let mut k = key();
        k.ty = KvType::F32;
        let f = encode(&k, 11, 10, &TOKS, &[0; 6]);
        assert!(matches!(
            decode(&key(), 11, 10, &TOKS, 6, &f),
            Err(Rejected::Foreign(_))
        ));
        let mut k = key();
        k.layout.k_width = 4;
        let f = encode(&k, 11, 10, &TOKS, &[0; 6]);
        assert!(matches!(
            decode(&key(), 11, 10, &TOKS, 6, &f),
            Err(Rejected::Foreign(_))
        ));
        let mut f = file();
        f[8] = 2;
        reseal(&mut f);
        assert!(matches!(
            decode(&key(), 11, 10, &TOKS, 6, &f),
            Err(Rejected::Foreign(_))
        ));
        assert!(matches!(
            decode(&key(), 11, 10, &TOKS, 8, &file()),
            Err(Rejected::Foreign(_))
        ));
    }

    #[test]
    fn another_prefix_is_not_loaded() {
        let f = file();
        for (h, p, t) in [(12, 10, TOKS), (11, 9, TOKS), (11, 10, [5, 6, 7, 9])] {
            assert!(matches!(
                decode(&key(), h, p, &t, 6, &f),
                Err(Rejected::Other(_))
            ));
        }
    }

    #[test]
    fn the_directory_keeps_its_bound_least_recently_used_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let one = file().len() as u64;
        let o = KvDiskOptions {
            dir: dir.path().to_path_buf(),
            max_bytes: 3 * one,
        };
        let mut t = DiskTier::open(&o, key()).expect("open");
        for h in 0..3u64 {
            t.store(h, 10, &TOKS, &[1, 2, 3, 4, 5, 6]);
        }
        // block 0 is used again: block 1 is now the oldest
        t.store(0, 10, &TOKS, &[1, 2, 3, 4, 5, 6]);
        t.store(3, 10, &TOKS, &[1, 2, 3, 4, 5, 6]);
        assert!(t.contains(0) && !t.contains(1) && t.contains(2) && t.contains(3));
        assert_eq!(t.counters().removed, 1);
        drop(t);
        let on_disk: Vec<u64> = fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").metadata().expect("meta").len())
            .collect();
        assert_eq!(on_disk.len(), 3);
        assert!(on_disk.iter().sum::<u64>() <= 3 * one);
        // reopened with a smaller bound: the oldest files go
        let small = KvDiskOptions {
            max_bytes: 2 * one,
            ..o
        };
        let t = DiskTier::open(&small, key()).expect("reopen");
        assert_eq!(t.counters().files, 2);
        drop(t);
        assert_eq!(fs::read_dir(dir.path()).expect("list").count(), 2);
    }
}

impl super::KvCache {
    /// Adds the disk tier (blocks registered from now on are written to it; lookups read from
    /// it). Its key must be this cache's type and layout.
    pub fn set_disk(&mut self, tier: DiskTier) -> Result<(), crate::ModelError> {
        let k = tier.key();
        if k.ty != self.kv_type() || k.layout != self.layout() {
            return Err(crate::ModelError::Batch(format!(
                "expected a kv disk tier for {} blocks of {:?}, found one for {} blocks of {:?}",
                self.kv_type().name(),
                self.layout(),
                k.ty.name(),
                k.layout
            )));
        }
        self.disk = Some(tier);
        Ok(())
    }

    /// Before a lookup of `prompt`: reads the blocks of its longest cached chain that are on
    /// disk and not in memory back into the pool, as cached idle blocks (the lookup then finds
    /// them). Stops at the first block in neither, or when the pool has no block nobody was
    /// promised; the chain's blocks already in memory are held meanwhile so a read never
    /// evicts them.
    pub(super) fn fetch_from_disk(&mut self, prompt: &[u32]) {
        if self.disk.is_none() {
            return;
        }
        let b = self.layout().block;
        let len = self.pool.block_byte_len();
        let mut parent = self.root;
        let mut held = Vec::new();
        for toks in prompt.chunks_exact(b) {
            let h = super::block_hash(parent, toks);
            if let Some(id) = self.pool.lookup(h, parent, toks) {
                self.pool.retain(id);
                held.push(id);
                parent = h;
                continue;
            }
            let Some(d) = self.disk.as_mut() else { break };
            if !d.contains(h) || self.pool.available() <= self.promised {
                break;
            }
            let Some(payload) = d.load(h, parent, toks, len) else {
                break;
            };
            let Some(id) = self.pool.alloc() else { break };
            held.push(id);
            if !self.pool.set_block_bytes(id, &payload) || !self.pool.register(id, h, parent, toks)
            {
                break;
            }
            parent = h;
        }
        // the chain's head released last: its tail is evicted first
        for id in held.into_iter().rev() {
            self.pool.release(id);
        }
    }
}
