//! GGUF reader: one file or a split set (`NAME-00001-of-0000N.gguf`) memory-mapped read-only,
//! typed metadata ([`Metadata`], [`Value`]) and zero-copy tensor views ([`TensorInfo`] +
//! [`Gguf::tensor_data`]). Files are untrusted: parsing (in `parse`) checks every count, length,
//! shape, type and offset and reports problems as [`GgufError`] naming the file and byte offset.

mod error;
mod guard;
mod metadata;
mod parse;
mod split;
mod types;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use nightshift_kernels::GgmlType;

pub use error::{FormatError, GgufError, SplitError};
pub use guard::{spawn_watchdog, CHANGED_EXIT_CODE};
pub use metadata::{Metadata, Value};
pub use parse::{DEFAULT_ALIGNMENT, MAX_DIMS, MAX_NESTING};
pub use split::split_path;
pub use types::{type_layout, TypeLayout};

/// One tensor of the model: name, type, shape, and where its bytes are.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// ggml order: `dims[0]` is the row length (ne0).
    pub dims: Vec<u64>,
    shard: usize,
    offset: u64,
    size: u64,
}

impl TensorInfo {
    /// Index of the split file holding the tensor (0 for a single file).
    pub fn shard(&self) -> usize {
        self.shard
    }
    /// Absolute byte offset of the tensor inside its file.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Size of the tensor's data in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
    /// Number of elements (product of the dims; 1 for a 0-d tensor).
    pub fn n_elements(&self) -> u64 {
        // Checked when the file was parsed (the product fits in i64); saturating in case the
        // public dims were edited since.
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }
    /// ne[i] in ggml terms (1 beyond the stored dims).
    pub fn ne(&self, i: usize) -> u64 {
        self.dims.get(i).copied().unwrap_or(1)
    }
}

/// How the kernel should expect a region of the map to be read (madvise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessHint {
    Normal,
    /// Disable read-ahead: sparse reads, e.g. expert tensors.
    Random,
    /// Aggressive read-ahead.
    Sequential,
    /// Start reading the pages in now.
    WillNeed,
}

#[derive(Debug)]
struct Shard {
    path: PathBuf,
    map: Mmap,
    /// The open file behind `map`, registered with the SIGBUS guard (until `map` is gone).
    watch: guard::Watched,
    version: u32,
    alignment: u64,
    data_start: u64,
}

/// An opened GGUF model: one file or all files of a split set, seen as one.
#[derive(Debug)]
pub struct Gguf {
    shards: Vec<Shard>,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    fingerprint: u64,
}

fn map_file(path: &Path) -> Result<(Mmap, guard::Watched), GgufError> {
    let io = |source| GgufError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(GgufError::NotAFile {
            path: path.to_path_buf(),
            found: if meta.is_dir() {
                "a directory"
            } else {
                "a special file"
            },
        });
    }
    // SAFETY: the map is read-only and private to this process; model files are immutable
    // while served (replaced by atomic rename, which keeps the mapped inode). A file truncated
    // or rewritten in place faults on access: `guard` turns that SIGBUS into a message naming
    // the file and a clean exit.
    let map = unsafe { Mmap::map(&file) }.map_err(io)?;
    let watch = guard::Watched::new(path, file, meta.len(), map.as_ptr() as usize, map.len());
    Ok((map, watch))
}

fn open_shard(path: &Path) -> Result<(Shard, Metadata, Vec<parse::RawTensor>), GgufError> {
    let (map, watch) = map_file(path)?;
    let parsed = parse::parse(&map).map_err(|b| GgufError::Format {
        path: path.to_path_buf(),
        offset: b.offset,
        kind: b.kind,
    })?;
    let shard = Shard {
        path: path.to_path_buf(),
        watch,
        map,
        version: parsed.version,
        alignment: parsed.alignment,
        data_start: parsed.data_start,
    };
    Ok((shard, parsed.metadata, parsed.tensors))
}

/// FNV-1a, 64 bit: a stable hash (unlike std's hasher) for the model fingerprint.
pub(crate) fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Parses and checks one GGUF image held in memory (no split handling, nothing mapped): the
/// same checks as [`Gguf::open`], for fuzzing and tools. Errors name the file as `<memory>`.
pub fn check_image(buf: &[u8]) -> Result<(Metadata, Vec<TensorInfo>), GgufError> {
    let parsed = parse::parse(buf).map_err(|b| GgufError::Format {
        path: PathBuf::from("<memory>"),
        offset: b.offset,
        kind: b.kind,
    })?;
    let tensors = parsed
        .tensors
        .into_iter()
        .map(|t| TensorInfo {
            name: t.name,
            ty: t.ty,
            dims: t.dims,
            shard: 0,
            offset: t.start,
            size: t.size,
        })
        .collect();
    Ok((parsed.metadata, tensors))
}

impl Gguf {
    /// Opens a GGUF file. If it is one file of a split set (any of them), opens all the others
    /// next to it and presents them as one model; metadata comes from the first split.
    pub fn open(path: &Path) -> Result<Gguf, GgufError> {
        let (shard, metadata, raw) = open_shard(path)?;
        let parts = split::open_all(path, shard, metadata, raw, open_shard)?;
        let mut shards = Vec::with_capacity(parts.len());
        let mut tensors = Vec::new();
        let mut by_name = HashMap::new();
        let mut metadata = None;
        for (idx, (shard, md, raw)) in parts.into_iter().enumerate() {
            for t in raw {
                if by_name.insert(t.name.clone(), tensors.len()).is_some() {
                    return Err(GgufError::Split {
                        path: shard.path.clone(),
                        kind: SplitError::DuplicateTensor(t.name),
                    });
                }
                tensors.push(TensorInfo {
                    name: t.name,
                    ty: t.ty,
                    dims: t.dims,
                    shard: idx,
                    offset: t.start,
                    size: t.size,
                });
            }
            if metadata.is_none() {
                metadata = Some(md);
            }
            shards.push(shard);
        }
        let mut fingerprint = 0xcbf2_9ce4_8422_2325u64;
        for s in &shards {
            let end = (s.data_start as usize).min(s.map.len());
            fingerprint = fnv1a(fingerprint, &s.map[..end]);
        }
        Ok(Gguf {
            shards,
            metadata: metadata.unwrap_or_default(),
            tensors,
            by_name,
            fingerprint,
        })
    }

    /// The metadata of the model (of the first split for a split set).
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// All tensors, in file order (split by split).
    pub fn tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        self.tensors.iter()
    }

    /// Number of tensors.
    pub fn n_tensors(&self) -> usize {
        self.tensors.len()
    }

    /// The exact bytes of a tensor, straight from the map. Empty if `t` did not come from this
    /// model and does not fit it.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let Some(shard) = self.shards.get(t.shard) else {
            return &[];
        };
        let (Ok(start), Ok(size)) = (usize::try_from(t.offset), usize::try_from(t.size)) else {
            return &[];
        };
        start
            .checked_add(size)
            .and_then(|end| shard.map.get(start..end))
            .unwrap_or(&[])
    }

    /// `general.architecture`.
    pub fn arch(&self) -> Result<&str, GgufError> {
        self.metadata
            .get_str("general.architecture")?
            .ok_or_else(|| GgufError::MissingKey {
                key: "general.architecture".into(),
            })
    }

    /// A cheap identity of the model: FNV-1a of the header bytes (metadata and tensor infos) of
    /// every split. Two files with the same header and tensor layout share it.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// [`Gguf::fingerprint`] strengthened with the weights: every file's length and 16 pieces
    /// of 4 KiB spread over its tensor data (a few pages read). Files kept across restarts (the
    /// KV cache's disk tier) use it, so regenerated weights behind the same metadata are told
    /// apart.
    pub fn weights_fingerprint(&self) -> u64 {
        let mut h = fnv1a(self.fingerprint, b"weights");
        for s in &self.shards {
            h = fnv1a(h, &(s.map.len() as u64).to_le_bytes());
            let start = (s.data_start as usize).min(s.map.len());
            let span = s.map.len() - start;
            for i in 0..16 {
                let at = start + span / 16 * i;
                let end = (at + 4096).min(s.map.len());
                h = fnv1a(h, &s.map[at..end]);
            }
        }
        h
    }

    /// Whether every file is still as long as when it was mapped: a file truncated (or
    /// rewritten in place) under the map faults on the next read of a lost page. Cheap (one
    /// fstat per file); servers poll it to stop cleanly before a request touches such a page.
    pub fn check_unchanged(&self) -> Result<(), GgufError> {
        match guard::check_files(self.shards.iter().map(|s| &s.watch)) {
            None => Ok(()),
            Some(detail) => Err(GgufError::Changed { detail }),
        }
    }

    /// The files of the model, in split order.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }

    /// GGUF version of the first file.
    pub fn version(&self) -> u32 {
        self.shards.first().map_or(0, |s| s.version)
    }

    /// Data alignment of the first file (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.shards
            .first()
            .map_or(DEFAULT_ALIGNMENT, |s| s.alignment)
    }

    /// Tells the kernel how a tensor's pages will be read. Advisory: errors are ignored.
    pub fn advise_tensor(&self, t: &TensorInfo, hint: AccessHint) {
        if let Some(shard) = self.shards.get(t.shard) {
            advise(&shard.map, t.offset as usize, t.size as usize, hint);
        }
    }

    /// Drops this process's mapping of the whole pages inside `bytes` (a slice of this model's
    /// map, e.g. an expert tensor that has just been copied into resident memory), so they stop
    /// counting in the process's RSS; a later read refaults them from the page cache or the
    /// file. Slices outside the map are ignored. Returns the bytes released.
    pub fn release_mapped(&self, bytes: &[u8]) -> usize {
        let Some((map, offset)) = self.locate(bytes) else {
            return 0;
        };
        release(map, offset, bytes.len())
    }

    /// Tells the kernel how the pages of `bytes` (a slice of this model's map, e.g. one expert's
    /// matrix) will be read: `WillNeed` starts reading them into the page cache. Advisory:
    /// slices outside the map and errors are ignored.
    pub fn advise_bytes(&self, bytes: &[u8], hint: AccessHint) {
        if let Some((map, offset)) = self.locate(bytes) {
            advise(map, offset, bytes.len(), hint);
        }
    }

    /// Whether every page of `bytes` (a slice of this model's map) is in the page cache
    /// (`mincore`); None for slices outside the map, on errors and off unix.
    pub fn is_cached(&self, bytes: &[u8]) -> Option<bool> {
        let (map, offset) = self.locate(bytes)?;
        cached(map, offset, bytes.len())
    }

    /// Drops the page-cache pages of `bytes` (a slice of this model's map whose content now lives
    /// elsewhere, e.g. resident expert copies), so a memory-limited process does not keep both.
    /// Affects every process reading the file; advisory: errors and foreign slices are ignored.
    pub fn evict_cached(&self, bytes: &[u8]) {
        let start = bytes.as_ptr() as usize;
        let Some(shard) = self.shards.iter().find(|s| {
            let base = s.map.as_ptr() as usize;
            start >= base && start + bytes.len() <= base + s.map.len()
        }) else {
            return;
        };
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            // the map covers the whole file from offset 0
            let offset = (start - shard.map.as_ptr() as usize) as libc::off_t;
            // SAFETY: a valid open descriptor of the mapped file; fadvise only drops clean
            // cached pages (the mapping refaults them from the file if read again).
            let _ = unsafe {
                libc::posix_fadvise(
                    shard.watch.file().as_raw_fd(),
                    offset,
                    bytes.len() as libc::off_t,
                    libc::POSIX_FADV_DONTNEED,
                )
            };
        }
        #[cfg(not(target_os = "linux"))]
        let _ = shard;
    }

    /// Where `bytes` (a slice of this model's map) are in the files: the index of the file in
    /// [`Gguf::paths`]' order and the byte offset in it (None for slices outside the map).
    pub fn file_span(&self, bytes: &[u8]) -> Option<(usize, u64)> {
        let start = bytes.as_ptr() as usize;
        let i = self.shards.iter().position(|s| {
            let base = s.map.as_ptr() as usize;
            start >= base && start + bytes.len() <= base + s.map.len()
        })?;
        // each map covers its whole file from offset 0
        Some((i, (start - self.shards[i].map.as_ptr() as usize) as u64))
    }

    /// The shard map holding `bytes` and their offset in it.
    fn locate(&self, bytes: &[u8]) -> Option<(&Mmap, usize)> {
        let start = bytes.as_ptr() as usize;
        let shard = self.shards.iter().find(|s| {
            let base = s.map.as_ptr() as usize;
            start >= base && start + bytes.len() <= base + s.map.len()
        })?;
        Some((&shard.map, start - shard.map.as_ptr() as usize))
    }

    /// Tells the kernel how all the model's pages will be read. Advisory: errors are ignored.
    pub fn advise_all(&self, hint: AccessHint) {
        for s in &self.shards {
            advise(&s.map, 0, s.map.len(), hint);
        }
    }
}

#[cfg(unix)]
fn advise(map: &Mmap, offset: usize, len: usize, hint: AccessHint) {
    use memmap2::Advice;
    if len == 0 || offset.checked_add(len).is_none_or(|end| end > map.len()) {
        return;
    }
    let advice = match hint {
        AccessHint::Normal => Advice::Normal,
        AccessHint::Random => Advice::Random,
        AccessHint::Sequential => Advice::Sequential,
        AccessHint::WillNeed => Advice::WillNeed,
    };
    // Advisory only: a failing madvise changes performance, never results.
    let _ = map.advise_range(advice, offset, len);
}

#[cfg(not(unix))]
fn advise(_map: &Mmap, _offset: usize, _len: usize, _hint: AccessHint) {}

/// Whether all pages covering `offset .. offset + len` of `map` are resident (`mincore`).
#[cfg(unix)]
fn cached(map: &Mmap, offset: usize, len: usize) -> Option<bool> {
    if len == 0 || offset.checked_add(len).is_none_or(|end| end > map.len()) {
        return None;
    }
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    let base = map.as_ptr() as usize;
    let first = (base + offset) / page * page;
    let end = (base + offset + len).div_ceil(page) * page;
    let mut vec = vec![0u8; (end - first) / page];
    // SAFETY: the map starts on a page boundary, so `first .. end` (the pages holding the
    // range, which lies inside the map) is mapped; `vec` has one byte per page of it, as mincore
    // writes. mincore only reads the page tables and the page cache.
    let r = unsafe {
        libc::mincore(
            first as *mut libc::c_void,
            end - first,
            vec.as_mut_ptr().cast(),
        )
    };
    (r == 0).then(|| vec.iter().all(|b| b & 1 == 1))
}

#[cfg(not(unix))]
fn cached(_map: &Mmap, _offset: usize, _len: usize) -> Option<bool> {
    None
}

/// `madvise(MADV_DONTNEED)` on the whole pages inside `offset .. offset + len` of `map` (pages
/// shared with bytes outside the range are kept). Returns the bytes released (0 on failure).
#[cfg(unix)]
fn release(map: &Mmap, offset: usize, len: usize) -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let base = map.as_ptr() as usize;
    let first = (base + offset).div_ceil(page) * page - base;
    let end = ((base + offset + len) / page * page).saturating_sub(base);
    if end <= first || end > map.len() {
        return 0;
    }
    // SAFETY: the map is a read-only shared mapping of a file; MADV_DONTNEED only drops this
    // process's page-table entries for the range, and a later read refaults the same bytes from
    // the page cache or the file, so no reader (including concurrent ones) can observe a change.
    match unsafe {
        map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, end - first)
    } {
        Ok(()) => end - first,
        Err(_) => 0,
    }
}

#[cfg(not(unix))]
fn release(_map: &Mmap, _offset: usize, _len: usize) -> usize {
    0
}
