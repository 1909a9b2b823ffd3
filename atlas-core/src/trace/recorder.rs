//! The `Recorder`: what the coordinator's engine calls once per MoE layer per decode/prefill step
//! with the experts each token row was routed to. All memory is allocated up front (flat arrays
//! indexed by MoE-layer slot × expert, a fixed ring of window buckets, a fixed-size pair sketch per
//! layer), so a call never allocates and costs a few nanoseconds per (row, expert).
//!
//! Rolling window: `WINDOW_BUCKETS` buckets of `window_tokens / WINDOW_BUCKETS` tokens each; when the
//! current bucket is full at the start of a step (a call for the first MoE layer), the oldest one is
//! cleared and reused. A snapshot sums the buckets, so it covers between 7/8 and all of the window.
//!
//! Co-activation (on one token row in `pair_sample_every`): per layer a table of `pair_capacity` (a, b) counters probed at `PROBE` places; a miss
//! with no free place decrements the smallest counter (or takes its place when it is down to one),
//! a Misra–Gries style sketch that keeps the frequent pairs and forgets the rare ones.

use super::format::{Atlas, Counts, LayerPairs, NodeLoad, ATLAS_FORMAT_VERSION};
use crate::placement::ModelShape;

pub const WINDOW_BUCKETS: usize = 8;
const PROBE: usize = 4;
const NO_SLOT: u32 = u32::MAX;

/// How a `Recorder` is sized.
#[derive(Clone, Debug)]
pub struct RecorderConfig {
    /// Free text stored in the atlas (model file name or architecture).
    pub model: String,
    /// Experts chosen per token.
    pub top_k: usize,
    /// Rolling-window length in tokens (0 = no window).
    pub window_tokens: u64,
    /// Counters per layer in the co-activation sketch (rounded up to a power of two, min 64).
    pub pair_capacity: usize,
    /// Pairs per layer kept in a snapshot.
    pub pairs_per_layer: usize,
    /// Feed the pair sketch with one token row in this many (1 = every row; 0 = no pairs). The
    /// sketch's random-access updates are most of the recorder's cost; a sample finds the same
    /// frequent pairs.
    pub pair_sample_every: u32,
    /// Node names, indexed like `placement::NodeId`, for `record_node`.
    pub nodes: Vec<String>,
}

impl RecorderConfig {
    pub fn new(model: impl Into<String>, top_k: usize) -> RecorderConfig {
        RecorderConfig {
            model: model.into(),
            top_k,
            window_tokens: 65_536,
            pair_capacity: 4096,
            pairs_per_layer: 64,
            pair_sample_every: 4,
            nodes: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("layer {layer} is not a MoE layer of the recorded model")]
    NotMoeLayer { layer: usize },
    #[error("expert id {expert} out of range: expected < {n_experts}")]
    ExpertOutOfRange { expert: usize, n_experts: usize },
    #[error("routing arrays disagree: {experts} expert ids, {weights} weights, top_k {top_k}")]
    Shape {
        experts: usize,
        weights: usize,
        top_k: usize,
    },
    #[error("node id {node} out of range: expected < {n_nodes}")]
    NodeOutOfRange { node: usize, n_nodes: usize },
}

#[derive(Clone, Copy, Default)]
struct PairCell {
    key: u32,
    count: u32,
}

/// Accumulates routing statistics; `snapshot` turns them into an `Atlas`.
pub struct Recorder {
    cfg: RecorderConfig,
    shape: ModelShape,
    /// `slot_of[layer]` = position in `shape.moe_layers`, or `NO_SLOT`.
    slot_of: Vec<u32>,
    n_experts: usize,
    all_tokens: u64,
    /// (count, weight sum) per slot × expert, interleaved so one update touches one cache line.
    all: Vec<(u64, f64)>,
    bucket_len: u64,
    bucket: usize,
    bucket_tokens: [u64; WINDOW_BUCKETS],
    /// (count, weight sum) per bucket × slot × expert; empty when there is no window.
    buckets: Vec<(u32, f32)>,
    pair_mask: usize,
    pairs: Vec<PairCell>,
    /// xorshift32 state picking the sampled rows (a fixed stride would alias with batch layout).
    pair_rng: u32,
    node_rows: Vec<u64>,
}

impl Recorder {
    pub fn new(shape: ModelShape, cfg: RecorderConfig) -> Recorder {
        let n = shape.moe_layers.len();
        let e = shape.n_experts;
        let max_layer = shape.moe_layers.iter().copied().max().map_or(0, |m| m + 1);
        let mut slot_of = vec![NO_SLOT; max_layer];
        for (s, &l) in shape.moe_layers.iter().enumerate() {
            slot_of[l] = s as u32;
        }
        let cap = cfg.pair_capacity.max(64).next_power_of_two();
        // keys are a * n + b + 1 in a u32: no pairs for (absurdly) wide layers
        let pairs_on = cfg.pair_sample_every > 0 && (e as u64) * (e as u64) < u32::MAX as u64;
        let window = cfg.window_tokens > 0;
        Recorder {
            slot_of,
            n_experts: e,
            all_tokens: 0,
            all: vec![(0, 0.0); n * e],
            bucket_len: cfg.window_tokens.div_ceil(WINDOW_BUCKETS as u64).max(1),
            bucket: 0,
            bucket_tokens: [0; WINDOW_BUCKETS],
            buckets: if window {
                vec![(0, 0.0); WINDOW_BUCKETS * n * e]
            } else {
                Vec::new()
            },
            pair_mask: cap - 1,
            pairs: if pairs_on {
                vec![PairCell::default(); n * cap]
            } else {
                Vec::new()
            },
            pair_rng: 0x9E37_79B9,
            node_rows: vec![0; cfg.nodes.len()],
            shape,
            cfg,
        }
    }

    pub fn shape(&self) -> &ModelShape {
        &self.shape
    }

    /// Records one step of one MoE layer: `experts` and `weights` are row-major `[rows × top_k]`
    /// (row r chose `experts[r*top_k..][..top_k]`). Checks everything before counting anything.
    pub fn record(
        &mut self,
        layer: usize,
        experts: &[usize],
        weights: &[f32],
    ) -> Result<(), RecordError> {
        let k = self.cfg.top_k;
        if k == 0 || experts.len() != weights.len() || experts.len() % k != 0 {
            return Err(RecordError::Shape {
                experts: experts.len(),
                weights: weights.len(),
                top_k: k,
            });
        }
        let slot = match self.slot_of.get(layer) {
            Some(&s) if s != NO_SLOT => s as usize,
            _ => return Err(RecordError::NotMoeLayer { layer }),
        };
        if let Some(&bad) = experts.iter().find(|&&x| x >= self.n_experts) {
            return Err(RecordError::ExpertOutOfRange {
                expert: bad,
                n_experts: self.n_experts,
            });
        }
        let rows = (experts.len() / k) as u64;
        if slot == 0 {
            self.start_tokens(rows);
        }
        let base = slot * self.n_experts;
        let window = !self.buckets.is_empty();
        let wbase = self.bucket * self.all.len() + base;
        for (row_e, row_w) in experts.chunks_exact(k).zip(weights.chunks_exact(k)) {
            for (&x, &w) in row_e.iter().zip(row_w) {
                let cell = &mut self.all[base + x];
                cell.0 += 1;
                cell.1 += w as f64;
                if window {
                    let cell = &mut self.buckets[wbase + x];
                    cell.0 += 1;
                    cell.1 += w;
                }
            }
            if !self.pairs.is_empty() {
                let mut x = self.pair_rng;
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                self.pair_rng = x;
                if (x >> 8) % self.cfg.pair_sample_every == 0 {
                    self.record_pairs(slot, row_e);
                }
            }
        }
        Ok(())
    }

    /// Adds `rows` (token rows shipped) to node `node`'s load.
    pub fn record_node(&mut self, node: usize, rows: u64) -> Result<(), RecordError> {
        let n_nodes = self.node_rows.len();
        let cell = self
            .node_rows
            .get_mut(node)
            .ok_or(RecordError::NodeOutOfRange { node, n_nodes })?;
        *cell += rows;
        Ok(())
    }

    fn start_tokens(&mut self, rows: u64) {
        self.all_tokens += rows;
        if self.buckets.is_empty() {
            return;
        }
        if self.bucket_tokens[self.bucket] >= self.bucket_len {
            self.bucket = (self.bucket + 1) % WINDOW_BUCKETS;
            let len = self.all.len();
            self.buckets[self.bucket * len..(self.bucket + 1) * len].fill((0, 0.0));
            self.bucket_tokens[self.bucket] = 0;
        }
        self.bucket_tokens[self.bucket] += rows;
    }

    fn record_pairs(&mut self, slot: usize, row: &[usize]) {
        let cap = self.pair_mask + 1;
        let table = &mut self.pairs[slot * cap..(slot + 1) * cap];
        for i in 0..row.len() {
            for j in i + 1..row.len() {
                let (a, b) = if row[i] < row[j] {
                    (row[i], row[j])
                } else {
                    (row[j], row[i])
                };
                if a == b {
                    continue;
                }
                // key 0 marks an empty cell, so store (a * n + b) + 1.
                let key = (a * self.n_experts + b) as u32 + 1;
                bump(table, self.pair_mask, key);
            }
        }
    }

    /// The statistics so far as an `Atlas` (allocates; call it from the snapshot path, not per step).
    pub fn snapshot(&self) -> Atlas {
        let n = self.shape.moe_layers.len();
        let e = self.n_experts;
        let mut all_time = Counts::zeros(n, e);
        let mut window = Counts::zeros(n, e);
        all_time.tokens = self.all_tokens;
        for s in 0..n {
            for x in 0..e {
                let (c, w) = self.all[s * e + x];
                all_time.activations[s][x] = c;
                all_time.weight_sums[s][x] = w;
            }
        }
        if !self.buckets.is_empty() {
            let len = n * e;
            window.tokens = self.bucket_tokens.iter().sum();
            for b in 0..WINDOW_BUCKETS {
                for s in 0..n {
                    for x in 0..e {
                        let i = b * len + s * e + x;
                        let (c, w) = self.buckets[i];
                        window.activations[s][x] += c as u64;
                        window.weight_sums[s][x] += w as f64;
                    }
                }
            }
        }
        let cap = self.pair_mask + 1;
        let pairs = (0..n)
            .map(|s| {
                let cells = self.pairs.get(s * cap..(s + 1) * cap).unwrap_or(&[]);
                let mut top: Vec<(u32, u32, u64)> = cells
                    .iter()
                    .filter(|c| c.key != 0)
                    .map(|c| {
                        let k = (c.key - 1) as usize;
                        ((k / e) as u32, (k % e) as u32, c.count as u64)
                    })
                    .collect();
                top.sort_by(|x, y| y.2.cmp(&x.2).then(x.0.cmp(&y.0)).then(x.1.cmp(&y.1)));
                top.truncate(self.cfg.pairs_per_layer);
                LayerPairs {
                    layer: self.shape.moe_layers[s],
                    pairs: top,
                }
            })
            .collect();
        Atlas {
            format_version: ATLAS_FORMAT_VERSION,
            model: self.cfg.model.clone(),
            shape: self.shape.clone(),
            top_k: self.cfg.top_k,
            window_tokens: self.cfg.window_tokens,
            all_time,
            window,
            nodes: self
                .cfg
                .nodes
                .iter()
                .zip(&self.node_rows)
                .map(|(name, &rows)| NodeLoad {
                    name: name.clone(),
                    rows,
                })
                .collect(),
            pairs,
            temporal: None,
        }
    }
}

/// Counts `key` in the open-addressed sketch `table` (see the module docs).
#[inline]
fn bump(table: &mut [PairCell], mask: usize, key: u32) {
    let h = ((key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize;
    let mut min_at = h & mask;
    let mut min_count = u32::MAX;
    for p in 0..PROBE {
        let i = (h + p) & mask;
        let c = table[i];
        if c.key == key {
            table[i].count = c.count.saturating_add(1);
            return;
        }
        if c.key == 0 {
            table[i] = PairCell { key, count: 1 };
            return;
        }
        if c.count < min_count {
            min_count = c.count;
            min_at = i;
        }
    }
    let c = &mut table[min_at];
    if c.count <= 1 {
        *c = PairCell { key, count: 1 };
    } else {
        c.count -= 1;
    }
}
