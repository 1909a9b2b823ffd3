//! Split GGUF sets as written by llama.cpp's gguf-split: files named `PREFIX-00001-of-0000N.gguf`,
//! each carrying `split.no` (0-based), `split.count` and, in the first, `split.tensors.count`.
//! Opening any one file finds the others by name; they must agree on all three keys.

use std::path::{Path, PathBuf};

use super::metadata::Metadata;
use super::parse::RawTensor;
use super::{GgufError, Shard, SplitError};

/// The path of split `no` (1-based, as in the name) of `count` for `prefix`:
/// `PREFIX-0000no-of-0count.gguf`.
pub fn split_path(prefix: &Path, no: u32, count: u32) -> PathBuf {
    let mut s = prefix.as_os_str().to_os_string();
    s.push(format!("-{no:05}-of-{count:05}.gguf"));
    PathBuf::from(s)
}

/// (prefix, 1-based number, count) if `path` is named like a split file.
fn parse_split_name(path: &Path) -> Option<(PathBuf, u64, u64)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (head, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = head.rsplit_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) || prefix.is_empty() {
        return None;
    }
    Some((
        path.with_file_name(prefix),
        no.parse().ok()?,
        count.parse().ok()?,
    ))
}

fn split_key(path: &Path, md: &Metadata, key: &str) -> Result<Option<u64>, GgufError> {
    match md.get(key) {
        None => Ok(None),
        Some(v) => match v.as_i128().and_then(|i| u64::try_from(i).ok()) {
            Some(n) => Ok(Some(n)),
            None => Err(GgufError::Split {
                path: path.to_path_buf(),
                kind: SplitError::KeyType {
                    key: key.to_string(),
                    found: v.describe(),
                },
            }),
        },
    }
}

type Part = (Shard, Metadata, Vec<RawTensor>);

/// All parts of the model `path` belongs to, in split order (just the one file if it is not
/// split). `first` is `path` already opened; `open` opens the others.
pub(super) fn open_all(
    path: &Path,
    shard: Shard,
    metadata: Metadata,
    tensors: Vec<RawTensor>,
    open: impl Fn(&Path) -> Result<Part, GgufError>,
) -> Result<Vec<Part>, GgufError> {
    let err = |p: &Path, kind| GgufError::Split {
        path: p.to_path_buf(),
        kind,
    };
    let count = split_key(path, &metadata, "split.count")?.unwrap_or(1);
    if count == 0 || count > 9999 {
        return Err(err(path, SplitError::BadCount(count)));
    }
    if count == 1 {
        return Ok(vec![(shard, metadata, tensors)]);
    }
    let Some((prefix, _, name_count)) = parse_split_name(path) else {
        return Err(err(path, SplitError::UnnamedSplit { count }));
    };
    if name_count != count {
        return Err(err(
            path,
            SplitError::CountMismatch {
                expected: name_count,
                found: count,
            },
        ));
    }
    let given_no = split_key(path, &metadata, "split.no")?;
    let mut given = Some((shard, metadata, tensors));
    let mut parts = Vec::with_capacity(count as usize);
    for i in 0..count {
        let p = split_path(&prefix, (i + 1) as u32, count as u32);
        let part = match given_no {
            Some(n) if n == i && given.is_some() => given
                .take()
                .ok_or_else(|| err(path, SplitError::BadCount(count)))?,
            _ => open(&p)?,
        };
        let md = &part.1;
        let found_count = split_key(&part.0.path, md, "split.count")?.unwrap_or(1);
        if found_count != count {
            return Err(err(
                &part.0.path,
                SplitError::CountMismatch {
                    expected: count,
                    found: found_count,
                },
            ));
        }
        let no = split_key(&part.0.path, md, "split.no")?.unwrap_or(0);
        if no != i {
            return Err(err(
                &part.0.path,
                SplitError::NumberMismatch {
                    expected: i,
                    found: no,
                },
            ));
        }
        parts.push(part);
    }
    if let Some(expected) = split_key(&parts[0].0.path, &parts[0].1, "split.tensors.count")? {
        let found: u64 = parts.iter().map(|p| p.2.len() as u64).sum();
        if found != expected {
            return Err(err(
                &parts[0].0.path,
                SplitError::TensorCountMismatch { expected, found },
            ));
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names() {
        let check = |p: &str, expect: Option<(&str, u64, u64)>| {
            let got = parse_split_name(Path::new(p));
            let want = expect.map(|(a, b, c)| (PathBuf::from(a), b, c));
            assert_eq!(got, want, "{p}");
        };
        check("/m/kimi-00001-of-00003.gguf", Some(("/m/kimi", 1, 3)));
        check(
            "/m/kimi-k2-Q4_K-00002-of-00013.gguf",
            Some(("/m/kimi-k2-Q4_K", 2, 13)),
        );
        check("/m/kimi.gguf", None);
        check("/m/kimi-0001-of.gguf", None);
        check("/m/-00001-of-00002.gguf", None);
        check("/m/x-00001-of-00002.bin", None);
        assert_eq!(
            split_path(Path::new("/m/kimi"), 2, 13),
            PathBuf::from("/m/kimi-00002-of-00013.gguf")
        );
    }
}
