//! The atlas file: a snapshot of expert routing statistics, written by the coordinator's
//! `Recorder` (periodically and at shutdown) and read by `nightshift-atlas report` and `plan`.
//!
//! Layout (format version 1): one ASCII header line, then a UTF-8 JSON body of exactly `len` bytes:
//!
//! ```text
//! NSATLAS 1 len=<body bytes, decimal> crc32=<CRC-32 (IEEE) of the body, 8 lower-case hex digits>\n
//! {"format_version":1,"model":"...","shape":{"moe_layers":[...],"n_experts":384,"expert_bytes":...},
//!  "top_k":8,"window_tokens":65536,
//!  "all_time":{"tokens":T,"activations":[[per expert]...per MoE layer],"weight_sums":[[...]...]},
//!  "window":{ same, over roughly the last window_tokens tokens },
//!  "nodes":[{"name":"node0","rows":R}...],
//!  "pairs":[{"layer":L,"pairs":[[a,b,count]...]}...],
//!  "temporal":{"lag1_tokens":[..],"lag1_shared":[..],"window_tokens":[..],"window_shared":[..],
//!              "window":8,"trace":[[ids of decode tokens]...per MoE layer]}}
//!   (optional: see `temporal`; `trace` optional inside it)
//! ```
//!
//! `activations[s][e]` counts the token rows routed to expert `e` of MoE layer `shape.moe_layers[s]`;
//! `weight_sums` adds their routing weights; `pairs` holds, per MoE layer, the most frequent expert
//! pairs chosen together for one token (approximate counts from a fixed-size sketch, a < b). The
//! header makes truncation and corruption detectable before any JSON is trusted; the body is then
//! checked for consistent dimensions, so nothing downstream indexes out of range. A bare body
//! (what `GET /v1/atlas` serves) is read too, with the same checks.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::placement::ModelShape;

use super::temporal::Temporal;

pub const ATLAS_MAGIC: &str = "NSATLAS";
pub const ATLAS_FORMAT_VERSION: u32 = 1;

/// Counts over some span of tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    /// Tokens (rows routed through the first MoE layer) in this span.
    pub tokens: u64,
    /// `activations[slot][expert]`.
    pub activations: Vec<Vec<u64>>,
    /// `weight_sums[slot][expert]`: sum of routing weights of those activations.
    pub weight_sums: Vec<Vec<f64>>,
}

impl Counts {
    pub fn zeros(n_slots: usize, n_experts: usize) -> Counts {
        Counts {
            tokens: 0,
            activations: vec![vec![0; n_experts]; n_slots],
            weight_sums: vec![vec![0.0; n_experts]; n_slots],
        }
    }

    pub fn total_activations(&self) -> u64 {
        self.activations.iter().flatten().sum()
    }
}

/// Rows routed to one node (as reported by the coordinator's expert client).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLoad {
    pub name: String,
    pub rows: u64,
}

/// Top co-activated expert pairs of one MoE layer: `(a, b, count)` with `a < b`, by count desc.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerPairs {
    pub layer: usize,
    pub pairs: Vec<(u32, u32, u64)>,
}

/// One atlas snapshot. See the module docs for the file layout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Atlas {
    pub format_version: u32,
    /// Free text naming the model the atlas was recorded on (e.g. its file name or architecture).
    pub model: String,
    pub shape: ModelShape,
    pub top_k: usize,
    /// Configured rolling-window length in tokens.
    pub window_tokens: u64,
    pub all_time: Counts,
    /// Roughly the last `window_tokens` tokens (whole buckets; between 7/8 and 8/8 of it once full).
    pub window: Counts,
    pub nodes: Vec<NodeLoad>,
    pub pairs: Vec<LayerPairs>,
    /// Temporal locality per MoE layer (`temporal`), when routing was seen one sequence at a
    /// time in token order (`nightshift-atlas record --model`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temporal: Option<Temporal>,
}

#[derive(Debug, thiserror::Error)]
pub enum AtlasError {
    #[error("cannot access atlas file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("not an atlas file: expected a header line starting with \"{ATLAS_MAGIC} \", found {found:?}")]
    NotAtlas { found: String },
    #[error("malformed atlas header: expected \"{ATLAS_MAGIC} <version> len=<n> crc32=<8 hex>\", found {found:?}")]
    BadHeader { found: String },
    #[error("unsupported atlas format version: expected {expected}, found {found}")]
    UnsupportedVersion { expected: u32, found: u32 },
    #[error("atlas body truncated or padded: header says {expected} bytes, found {found}")]
    Length { expected: u64, found: u64 },
    #[error("atlas body corrupt: header crc32 {expected:08x}, body crc32 {found:08x}")]
    Checksum { expected: u32, found: u32 },
    #[error("atlas body is not valid json at line {line}, column {column}: {message}")]
    Json {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("inconsistent atlas: {field}: expected {expected}, found {found}")]
    Inconsistent {
        field: String,
        expected: String,
        found: String,
    },
}

fn inconsistent(
    field: impl Into<String>,
    expected: impl ToString,
    found: impl ToString,
) -> AtlasError {
    AtlasError::Inconsistent {
        field: field.into(),
        expected: expected.to_string(),
        found: found.to_string(),
    }
}

impl Atlas {
    /// An empty atlas for `shape` (all counts zero).
    pub fn empty(
        model: impl Into<String>,
        shape: ModelShape,
        top_k: usize,
        window_tokens: u64,
    ) -> Atlas {
        let n = shape.moe_layers.len();
        let e = shape.n_experts;
        Atlas {
            format_version: ATLAS_FORMAT_VERSION,
            model: model.into(),
            top_k,
            window_tokens,
            all_time: Counts::zeros(n, e),
            window: Counts::zeros(n, e),
            nodes: Vec::new(),
            pairs: shape
                .moe_layers
                .iter()
                .map(|&layer| LayerPairs {
                    layer,
                    pairs: Vec::new(),
                })
                .collect(),
            shape,
            temporal: None,
        }
    }

    /// Serialises to the file layout (header + JSON body).
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serialising plain structs of numbers and strings cannot fail; a NaN weight sum (which
        // JSON cannot hold) is written as null and rejected again on read.
        let body = serde_json::to_vec(self).unwrap_or_default();
        let crc = crc32fast::hash(&body);
        let mut out = format!(
            "{ATLAS_MAGIC} {ATLAS_FORMAT_VERSION} len={} crc32={crc:08x}\n",
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(&body);
        out
    }

    /// Parses and checks a whole file image: the file layout, or the bare JSON body as
    /// `GET /v1/atlas` serves it (`curl URL/v1/atlas > x.atlas`; without the header there is no
    /// length or checksum, but the body gets every other check).
    pub fn from_bytes(bytes: &[u8]) -> Result<Atlas, AtlasError> {
        if bytes.trim_ascii_start().starts_with(b"{") {
            return Atlas::from_json(bytes);
        }
        let nl = bytes.iter().position(|&b| b == b'\n');
        let head_end = nl.unwrap_or(bytes.len().min(80));
        let head = String::from_utf8_lossy(&bytes[..head_end]).into_owned();
        let mut words = head.split(' ');
        if words.next() != Some(ATLAS_MAGIC) {
            return Err(AtlasError::NotAtlas {
                found: head.chars().take(40).collect(),
            });
        }
        let bad = || AtlasError::BadHeader {
            found: head.clone(),
        };
        let Some(nl) = nl else { return Err(bad()) };
        let version: u32 = words.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
        if version != ATLAS_FORMAT_VERSION {
            return Err(AtlasError::UnsupportedVersion {
                expected: ATLAS_FORMAT_VERSION,
                found: version,
            });
        }
        let len: u64 = words
            .next()
            .and_then(|w| w.strip_prefix("len="))
            .and_then(|v| v.parse().ok())
            .ok_or_else(bad)?;
        let crc = words
            .next()
            .and_then(|w| w.strip_prefix("crc32="))
            .filter(|v| v.len() == 8)
            .and_then(|v| u32::from_str_radix(v, 16).ok())
            .ok_or_else(bad)?;
        if words.next().is_some() {
            return Err(bad());
        }
        let body = &bytes[nl + 1..];
        if body.len() as u64 != len {
            return Err(AtlasError::Length {
                expected: len,
                found: body.len() as u64,
            });
        }
        let found = crc32fast::hash(body);
        if found != crc {
            return Err(AtlasError::Checksum {
                expected: crc,
                found,
            });
        }
        Atlas::from_json(body)
    }

    /// Parses and checks a JSON body.
    fn from_json(body: &[u8]) -> Result<Atlas, AtlasError> {
        let atlas: Atlas = serde_json::from_slice(body).map_err(|e| AtlasError::Json {
            line: e.line(),
            column: e.column(),
            message: e
                .to_string()
                .split(" at line ")
                .next()
                .unwrap_or_default()
                .to_string(),
        })?;
        atlas.check()?;
        Ok(atlas)
    }

    pub fn load(path: &Path) -> Result<Atlas, AtlasError> {
        let bytes = std::fs::read(path).map_err(|source| AtlasError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Atlas::from_bytes(&bytes)
    }

    /// Writes the snapshot atomically (temp file + rename).
    pub fn save_atomic(&self, path: &Path) -> Result<(), AtlasError> {
        crate::fsutil::write_atomic(path, &self.to_bytes()).map_err(|source| AtlasError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Dimension and value checks: everything indexed later is in range.
    pub fn check(&self) -> Result<(), AtlasError> {
        if self.format_version != ATLAS_FORMAT_VERSION {
            return Err(AtlasError::UnsupportedVersion {
                expected: ATLAS_FORMAT_VERSION,
                found: self.format_version,
            });
        }
        let n = self.shape.moe_layers.len();
        let e = self.shape.n_experts;
        if n == 0 {
            return Err(inconsistent(
                "shape.moe_layers",
                "at least one MoE layer",
                "none",
            ));
        }
        if e == 0 || e > u32::MAX as usize {
            return Err(inconsistent("shape.n_experts", "1..=4294967295", e));
        }
        if let Some(&l) = self
            .shape
            .moe_layers
            .iter()
            .find(|&&l| l > crate::placement::MAX_LAYER_INDEX)
        {
            return Err(inconsistent(
                "shape.moe_layers",
                format!("layer indices <= {}", crate::placement::MAX_LAYER_INDEX),
                l,
            ));
        }
        let mut sorted = self.shape.moe_layers.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != n {
            return Err(inconsistent(
                "shape.moe_layers",
                "distinct layer indices",
                format!("{:?}", self.shape.moe_layers),
            ));
        }
        if self.top_k == 0 || self.top_k > e {
            return Err(inconsistent("top_k", format!("1..={e}"), self.top_k));
        }
        for (name, c) in [("all_time", &self.all_time), ("window", &self.window)] {
            // Every sum taken later (totals, coverage, Gini, loads) is at most this one.
            let mut total = 0u64;
            if c.activations.len() != n {
                return Err(inconsistent(
                    format!("{name}.activations"),
                    format!("{n} layers"),
                    c.activations.len(),
                ));
            }
            if c.weight_sums.len() != n {
                return Err(inconsistent(
                    format!("{name}.weight_sums"),
                    format!("{n} layers"),
                    c.weight_sums.len(),
                ));
            }
            for s in 0..n {
                if c.activations[s].len() != e {
                    return Err(inconsistent(
                        format!("{name}.activations[{s}]"),
                        format!("{e} experts"),
                        c.activations[s].len(),
                    ));
                }
                if c.weight_sums[s].len() != e {
                    return Err(inconsistent(
                        format!("{name}.weight_sums[{s}]"),
                        format!("{e} experts"),
                        c.weight_sums[s].len(),
                    ));
                }
                if c.activations[s]
                    .iter()
                    .try_fold(0u64, |acc, &x| acc.checked_add(x))
                    .and_then(|layer| total.checked_add(layer))
                    .map(|t| total = t)
                    .is_none()
                {
                    return Err(inconsistent(
                        format!("{name}.activations[{s}]"),
                        "counts whose sum over the atlas fits in 64 bits",
                        "a sum that overflows",
                    ));
                }
                if let Some(x) = c.weight_sums[s]
                    .iter()
                    .find(|x| !x.is_finite() || **x < 0.0)
                {
                    return Err(inconsistent(
                        format!("{name}.weight_sums[{s}]"),
                        "finite non-negative sums",
                        x,
                    ));
                }
            }
        }
        if self
            .nodes
            .iter()
            .try_fold(0u64, |acc, nl| acc.checked_add(nl.rows))
            .is_none()
        {
            return Err(inconsistent(
                "nodes",
                "rows whose sum fits in 64 bits",
                "a sum that overflows",
            ));
        }
        if self.pairs.len() > n {
            return Err(inconsistent(
                "pairs",
                format!("at most {n} layers"),
                self.pairs.len(),
            ));
        }
        for (i, lp) in self.pairs.iter().enumerate() {
            if !self.shape.moe_layers.contains(&lp.layer) {
                return Err(inconsistent(
                    format!("pairs[{i}].layer"),
                    "a MoE layer",
                    lp.layer,
                ));
            }
            if let Some(&(a, b, _)) = lp
                .pairs
                .iter()
                .find(|&&(a, b, _)| a >= b || b as usize >= e)
            {
                return Err(inconsistent(
                    format!("pairs[{i}]"),
                    format!("a < b < {e}"),
                    format!("({a}, {b})"),
                ));
            }
        }
        if let Some(t) = &self.temporal {
            t.check(n, e, self.top_k)
                .map_err(|(field, expected, found)| inconsistent(field, expected, found))?;
        }
        Ok(())
    }

    /// Counts to plan and report from: the window if it has tokens, else all-time.
    pub fn preferred_counts(&self) -> &Counts {
        if self.window.tokens > 0 {
            &self.window
        } else {
            &self.all_time
        }
    }
}
