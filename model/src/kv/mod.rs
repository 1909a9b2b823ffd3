//! The paged KV cache: every sequence's K rows (and V rows, except for MLA whose values are the
//! first `kv_lora_rank` floats of each latent K row) live in fixed-size blocks of
//! [`KvLayout::block`] positions x all layers, taken from one [`BlockPool`] sized by a memory
//! budget; a sequence holds a block table. Blocks are reference counted, so sequences share a
//! prefix without copies; a write into a shared (or cached) block copies it first.
//!
//! Prefix caching: every full block is registered under the hash of its token chain (parent
//! hash, its tokens; the root hash carries the model fingerprint, the cache type and the block
//! size), and a new sequence starts from the longest chain of cached blocks matching its prompt
//! (at most all but the last prompt position, whose logits must be computed). Blocks no sequence
//! holds stay cached until the pool needs room (least recently used first). Rows are stored as
//! f32, f16 or Q8_0 like llama.cpp's `type_k`/`type_v`; a cached row is exactly the row a cold
//! computation writes, so results are bit-identical either way.
//!
//! Admission reserves blocks: [`KvCache::admit`] promises a sequence every block it may need up
//! to its maximum length, so a step of admitted sequences never runs out of blocks.

pub mod disk;
pub mod pool;
mod share;

pub use disk::{DiskCounters, DiskKey, DiskTier, KvDiskOptions};
pub use pool::{BlockId, BlockPool, PoolCounters, Rows};
pub use share::Attached;

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::gguf::fnv1a;
use nightshift_kernels::formats::{f16_to_f32, BlockQ8_0, QK};
use nightshift_kernels::scalar::legacy::dequantize_q8_0;
use std::collections::HashMap;

/// Element type of the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    #[default]
    F32,
    F16,
    /// ggml's Q8_0 (blocks of 32 elements: an f16 scale and 32 i8, 34 bytes), llama.cpp's
    /// `-ctk q8_0 -ctv q8_0`; attention then follows ggml's flash-attention path
    /// (`nightshift_kernels::attn::q8`). Needs head sizes that are whole blocks.
    Q8_0,
}

impl KvType {
    /// Bytes `n` cached elements take (whole blocks of 32 for Q8_0: `check` makes every row
    /// whole blocks).
    pub fn bytes(self, n: usize) -> usize {
        match self {
            KvType::F32 => 4 * n,
            KvType::F16 => 2 * n,
            KvType::Q8_0 => n.div_ceil(QK) * std::mem::size_of::<BlockQ8_0>(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Parses a cache type name as `--kv-type` (and llama.cpp's `-ctk`) spells it.
    pub fn parse(s: &str) -> Result<KvType, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            _ => Err(format!("expected f32, f16 or q8_0, found {s:?}")),
        }
    }

    /// The chunks llama.cpp rotates a grouped-query model's rows by in a cache of this type
    /// (`nightshift_kernels::attn::rotate`): (K and q, V and the attention output), 0 for none.
    /// Only quantized caches are rotated, and never MLA's latent rows (llama.cpp's MLA attention
    /// does not apply the rotation it builds).
    pub fn rotation(self, c: &ModelConfig) -> (usize, usize) {
        use nightshift_kernels::attn::rotate::{k_chunk, v_chunk};
        if self != KvType::Q8_0 || !c.arch.is_gqa() {
            return (0, 0);
        }
        (k_chunk(c.head_k), v_chunk(c.head_v))
    }

    /// Whether a cache of this type can hold `layout`'s rows: Q8_0 needs every head's K and V
    /// rows to be whole blocks of 32 (llama.cpp refuses the same models).
    pub fn check(self, layout: &KvLayout, head_k: usize, head_v: usize) -> Result<(), ModelError> {
        if self != KvType::Q8_0 {
            return Ok(());
        }
        for (what, n) in [
            ("k head size", head_k),
            ("v head size", head_v),
            ("k row", layout.k_width),
            ("v row", layout.v_width),
        ] {
            if n % QK != 0 {
                return Err(ModelError::KvType(format!(
                    "expected a {what} that is a multiple of {QK} for a q8_0 kv cache, found {n}"
                )));
            }
        }
        Ok(())
    }
}

/// Geometry of the blocks: floats per position of each layer's K and V rows, positions per
/// block. A block stores, layer after layer, its `block` K rows then its `block` V rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layer: usize,
    pub k_width: usize,
    /// 0 for MLA (V is a view of the K rows).
    pub v_width: usize,
    pub block: usize,
}

impl KvLayout {
    /// Positions per block.
    pub const BLOCK: usize = 16;

    pub fn for_model(c: &ModelConfig) -> KvLayout {
        let (k_width, v_width) = c.kv_floats_per_token();
        KvLayout {
            n_layer: c.n_layer,
            k_width,
            v_width,
            block: Self::BLOCK,
        }
    }

    /// Floats of one layer of one block.
    pub fn layer_floats(&self) -> usize {
        self.block * (self.k_width + self.v_width)
    }

    /// Floats of one block (all layers).
    pub fn block_floats(&self) -> usize {
        self.n_layer * self.layer_floats()
    }

    pub fn block_bytes(&self, ty: KvType) -> usize {
        ty.bytes(self.block_floats())
    }

    /// Bytes one position takes in every layer: the layout's theoretical cost per token.
    pub fn token_bytes(&self, ty: KvType) -> usize {
        self.n_layer * ty.bytes(self.k_width + self.v_width)
    }

    /// The `kv_budget_tokens` that hold `seqs` sequences of up to `positions` positions at
    /// once: each sequence takes whole blocks, so its last one may be partly filled.
    pub const fn budget_for(seqs: usize, positions: usize) -> usize {
        seqs * positions.next_multiple_of(Self::BLOCK)
    }

    /// Blocks covering `positions`.
    pub fn blocks_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.block)
    }
}

/// The cache of one sequence: its block table and the tokens of its positions.
pub struct SeqKv {
    /// Positions committed (attention of the next token sees 0..len).
    pub len: usize,
    blocks: Vec<BlockId>,
    /// Token of every committed position (hashed when a block fills).
    tokens: Vec<u32>,
    /// Chain hashes of the first `chain.len()` full blocks.
    chain: Vec<u64>,
    /// Blocks still promised to this sequence by admission.
    reserved: usize,
    /// Blocks admission promised in all (held + reserved); a truncation gives released blocks
    /// back to the reservation up to this.
    promised_total: usize,
    /// Trailing positions written by the last step as drafts, not verified yet: the blocks
    /// holding them are not entered in the prefix index until [`KvCache::truncate`] settles them.
    unverified: usize,
    /// The whole prompt while blocks of it may still be found computed by another sequence
    /// ([`KvCache::attach`]); empty when the sequence does not reuse prefixes.
    prompt: Vec<u32>,
    /// Chain hashes of prompt blocks this sequence claimed as pending (it computes them; other
    /// sequences wait for them instead of computing them again).
    claims: Vec<u64>,
}

/// What the pool looks like now (for metrics and the admin endpoint).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvStats {
    pub kv_type: KvType,
    /// Positions per block.
    pub block: usize,
    pub bytes_per_block: usize,
    /// Bytes one position takes (all layers).
    pub bytes_per_token: usize,
    /// Most blocks (the budget).
    pub capacity_blocks: usize,
    /// Blocks whose storage is allocated, and the bytes that storage takes (measured: the pool's
    /// buffers, to compare with `bytes_per_block`).
    pub allocated_blocks: usize,
    pub allocated_bytes: usize,
    /// Blocks held by live sequences.
    pub used_blocks: usize,
    /// Unreferenced blocks kept for their prefix (evictable).
    pub cached_blocks: usize,
    /// Blocks neither used nor cached (including storage not allocated yet).
    pub free_blocks: usize,
    /// Blocks promised to admitted sequences and not taken yet.
    pub reserved_blocks: usize,
    /// Live sequences and the positions they hold.
    pub sequences: usize,
    pub positions: usize,
    pub prefix_cache: bool,
    /// Prompts looked up in the prefix cache, their positions, and the positions found cached.
    pub lookups: u64,
    pub lookup_tokens: u64,
    pub hit_tokens: u64,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
    /// Prompt positions a running sequence took from blocks another sequence computed after
    /// it was admitted (in-flight prefix sharing; also counted in `hit_tokens`).
    pub attached_tokens: u64,
    /// Prompt blocks claimed by a live sequence and not computed yet.
    pub pending_blocks: usize,
    /// The disk tier (`--kv-cache-dir`), all zero without one.
    pub disk: DiskCounters,
}

/// Blocks taken by one `prepare` for one sequence, so a failed step can give them back.
struct Grown {
    slot: usize,
    /// Table length before.
    before: usize,
    /// Blocks copied on write (kept: their rows below `len` are the shared ones).
    copied: usize,
    /// Blocks taken from the sequence's reservation.
    from_reserve: usize,
}

/// What `prepare` did, for `commit` or `rollback`.
pub struct Prepared(Vec<Grown>);

/// The pool and the block tables of the live sequences (by slot; the engine maps ids to slots).
pub struct KvCache {
    pool: BlockPool,
    seqs: Vec<Option<SeqKv>>,
    prefix: bool,
    root: u64,
    /// Sum of the live sequences' `reserved`; never above `pool.available()`.
    promised: usize,
    lookups: u64,
    lookup_tokens: u64,
    hit_tokens: u64,
    /// Pending prompt blocks: chain hash -> slot of the live sequence that will compute it.
    pending: HashMap<u64, usize>,
    attached_tokens: u64,
    /// Where registered blocks are also written, and read back from on a miss.
    disk: Option<DiskTier>,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The chain hash of a block holding `tokens` after the prefix hashed `parent` (FNV-1a: stable
/// across builds, so a disk tier could keep it).
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = fnv1a(FNV_OFFSET, &parent.to_le_bytes());
    for t in tokens {
        h = fnv1a(h, &t.to_le_bytes());
    }
    h
}

impl KvCache {
    /// A cache of at most `capacity_blocks` blocks for the model with `fingerprint`; `prefix`
    /// turns prefix caching on.
    pub fn new(
        layout: KvLayout,
        ty: KvType,
        capacity_blocks: usize,
        fingerprint: u64,
        prefix: bool,
    ) -> KvCache {
        let mut root = fnv1a(FNV_OFFSET, &fingerprint.to_le_bytes());
        root = fnv1a(root, ty.name().as_bytes());
        root = fnv1a(root, &(layout.block as u64).to_le_bytes());
        KvCache {
            pool: BlockPool::new(layout, ty, capacity_blocks),
            seqs: Vec::new(),
            prefix,
            root,
            promised: 0,
            lookups: 0,
            lookup_tokens: 0,
            hit_tokens: 0,
            pending: HashMap::new(),
            attached_tokens: 0,
            disk: None,
        }
    }

    pub fn layout(&self) -> KvLayout {
        self.pool.layout()
    }

    pub fn kv_type(&self) -> KvType {
        self.pool.kv_type()
    }

    pub fn prefix_enabled(&self) -> bool {
        self.prefix
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn seq(&self, slot: usize) -> Option<&SeqKv> {
        self.seqs.get(slot).and_then(|s| s.as_ref())
    }

    pub fn live(&self) -> usize {
        self.seqs.iter().filter(|s| s.is_some()).count()
    }

    /// Positions held by live sequences (a shared block counts once per sequence).
    pub fn positions(&self) -> usize {
        self.seqs.iter().flatten().map(|s| s.len).sum()
    }

    pub fn stats(&self) -> KvStats {
        let l = self.layout();
        let ty = self.kv_type();
        let used = self.pool.used();
        let cached = self.pool.cached_idle();
        KvStats {
            kv_type: ty,
            block: l.block,
            bytes_per_block: l.block_bytes(ty),
            bytes_per_token: l.token_bytes(ty),
            capacity_blocks: self.pool.capacity(),
            allocated_blocks: self.pool.grown(),
            allocated_bytes: self.pool.storage_bytes(),
            used_blocks: used,
            cached_blocks: cached,
            free_blocks: self.pool.capacity() - used - cached,
            reserved_blocks: self.promised,
            sequences: self.live(),
            positions: self.positions(),
            prefix_cache: self.prefix,
            lookups: self.lookups,
            lookup_tokens: self.lookup_tokens,
            hit_tokens: self.hit_tokens,
            evictions: self.pool.counters().evictions,
            attached_tokens: self.attached_tokens,
            pending_blocks: self.pending.len(),
            disk: self.disk.as_ref().map(|d| d.counters()).unwrap_or_default(),
        }
    }

    fn insert(&mut self, s: SeqKv) -> usize {
        match self.seqs.iter().position(|s| s.is_none()) {
            Some(i) => {
                self.seqs[i] = Some(s);
                i
            }
            None => {
                self.seqs.push(Some(s));
                self.seqs.len() - 1
            }
        }
    }

    /// An empty sequence with no reservation (its blocks are taken step by step while there
    /// are some to spare); returns its slot.
    pub fn add(&mut self) -> usize {
        self.insert(SeqKv {
            len: 0,
            blocks: Vec::new(),
            tokens: Vec::new(),
            chain: Vec::new(),
            reserved: 0,
            promised_total: 0,
            unverified: 0,
            prompt: Vec::new(),
            claims: Vec::new(),
        })
    }

    /// A sequence for `prompt` that may grow to `max_len` positions: starts from the longest
    /// cached prefix of the prompt (never its last position; none without `reuse`) and reserves
    /// every further block it may need. Returns its slot and the cached positions, or `KvFull`
    /// (nothing changes) when the pool cannot promise the blocks now.
    pub fn admit(
        &mut self,
        prompt: &[u32],
        max_len: usize,
        reuse: bool,
    ) -> Result<(usize, usize), ModelError> {
        let l = self.layout();
        let max_len = max_len.max(prompt.len());
        let mut hits = Vec::new();
        let mut chain = Vec::new();
        let lookup = self.prefix && reuse;
        if lookup {
            self.fetch_from_disk(prompt);
        }
        if lookup && !prompt.is_empty() {
            let mut parent = self.root;
            for toks in prompt.chunks_exact(l.block) {
                let h = block_hash(parent, toks);
                match self.pool.lookup(h, parent, toks) {
                    Some(b) => {
                        hits.push(b);
                        chain.push(h);
                        parent = h;
                    }
                    None => break,
                }
            }
        }
        let cached = (hits.len() * l.block).min(prompt.len().saturating_sub(1));
        // the last hit block is written into (copied) when it holds the last prompt position
        let copy = usize::from(hits.len() * l.block > cached);
        let need = l.blocks_for(max_len) - hits.len() + copy;
        let idle_hits = hits.iter().filter(|&&b| self.pool.refs(b) == 0).count();
        let spare = self.pool.available().saturating_sub(self.promised);
        if idle_hits + need > spare {
            return Err(ModelError::KvFull(format!(
                "expected {need} free kv blocks for a sequence of up to {max_len} positions, \
                 found {} spare of {}",
                spare.saturating_sub(idle_hits),
                self.pool.capacity()
            )));
        }
        for &b in &hits {
            self.pool.retain(b);
        }
        chain.truncate(cached / l.block);
        if lookup {
            self.lookups += 1;
            self.lookup_tokens += prompt.len() as u64;
            self.hit_tokens += cached as u64;
        }
        self.promised += need;
        let promised_total = need + hits.len();
        let slot = self.insert(SeqKv {
            len: cached,
            blocks: hits,
            tokens: prompt[..cached].to_vec(),
            chain,
            reserved: need,
            promised_total,
            unverified: 0,
            prompt: if lookup { prompt.to_vec() } else { Vec::new() },
            claims: Vec::new(),
        });
        if self.prefix {
            self.claim(slot, prompt);
        }
        Ok((slot, cached))
    }

    /// A new sequence sharing every block of `slot` (copy-on-write when either writes into the
    /// partly filled last one); it has no reservation.
    pub fn fork(&mut self, slot: usize) -> Option<usize> {
        let s = self.seq(slot)?;
        let copy = SeqKv {
            len: s.len,
            blocks: s.blocks.clone(),
            tokens: s.tokens.clone(),
            chain: s.chain.clone(),
            reserved: 0,
            promised_total: 0,
            unverified: s.unverified,
            prompt: Vec::new(),
            claims: Vec::new(),
        };
        for &b in &copy.blocks {
            self.pool.retain(b);
        }
        Some(self.insert(copy))
    }

    /// Drops a sequence: its blocks go back (cached ones stay in the index, the last block
    /// released first so a chain's tail is evicted before its head), its reservation too.
    pub fn remove(&mut self, slot: usize) {
        let Some(s) = self.seqs.get_mut(slot).and_then(|s| s.take()) else {
            return;
        };
        for &b in s.blocks.iter().rev() {
            self.pool.release(b);
        }
        self.promised = self.promised.saturating_sub(s.reserved);
        self.unclaim(slot, &s.claims);
    }

    /// Makes every block that positions `len..end` of each `(slot, end)` fall in present and
    /// writable (new blocks, copies of shared ones). `KvFull` (nothing changes) when the pool
    /// cannot give them without breaking another sequence's reservation.
    pub fn prepare(&mut self, grow: &[(usize, usize)]) -> Result<Prepared, ModelError> {
        let l = self.layout();
        let mut plans = Vec::with_capacity(grow.len());
        let mut extra = 0;
        for &(slot, end) in grow {
            let s = self
                .seq(slot)
                .ok_or_else(|| ModelError::Batch("unknown slot".into()))?;
            if end <= s.len {
                continue;
            }
            let first = s.len / l.block;
            let copies = (first..l.blocks_for(end).min(s.blocks.len()))
                .filter(|&i| !self.pool.writable(s.blocks[i]))
                .count();
            let fresh = l.blocks_for(end).saturating_sub(s.blocks.len());
            let k = copies + fresh;
            let from_reserve = k.min(s.reserved);
            extra += k - from_reserve;
            plans.push((slot, end, from_reserve));
        }
        let spare = self.pool.available().saturating_sub(self.promised);
        if extra > spare {
            return Err(ModelError::KvFull(format!(
                "expected {extra} more kv blocks, found {spare} spare of {}",
                self.pool.capacity()
            )));
        }
        let mut done = Prepared(Vec::with_capacity(plans.len()));
        for (slot, end, from_reserve) in plans {
            if let Some(s) = self.seqs[slot].as_mut() {
                s.reserved -= from_reserve;
            }
            self.promised -= from_reserve;
            let mut g = Grown {
                slot,
                before: self.seq(slot).map_or(0, |s| s.blocks.len()),
                copied: 0,
                from_reserve,
            };
            let res = self.grow_one(slot, end, &mut g);
            done.0.push(g);
            if let Err(e) = res {
                self.rollback(done);
                return Err(e);
            }
        }
        Ok(done)
    }

    /// Copies and appends the blocks of one sequence (see `prepare`).
    fn grow_one(&mut self, slot: usize, end: usize, g: &mut Grown) -> Result<(), ModelError> {
        let l = self.layout();
        let oom = || ModelError::KvFull("could not allocate kv cache storage".into());
        let Some(s) = self.seqs[slot].as_ref() else {
            return Ok(());
        };
        let first = s.len / l.block;
        let last = l.blocks_for(end);
        for i in first..last.min(g.before) {
            let old = self.seqs[slot]
                .as_ref()
                .map(|s| s.blocks[i])
                .ok_or_else(oom)?;
            if self.pool.writable(old) {
                continue;
            }
            let new = self.pool.alloc().ok_or_else(oom)?;
            self.pool.copy_block(old, new);
            self.pool.release(old);
            if let Some(s) = self.seqs[slot].as_mut() {
                s.blocks[i] = new;
            }
            g.copied += 1;
        }
        for _ in g.before..last {
            let b = self.pool.alloc().ok_or_else(oom)?;
            if let Some(s) = self.seqs[slot].as_mut() {
                s.blocks.push(b);
            }
        }
        Ok(())
    }

    /// Undoes a `prepare` after a failed step: appended blocks go back, and the reservation
    /// they came from. Copies made on write stay (their rows below `len` are unchanged).
    pub fn rollback(&mut self, p: Prepared) {
        for g in p.0 {
            let Some(s) = self.seqs[g.slot].as_mut() else {
                continue;
            };
            let pushed: Vec<BlockId> = s.blocks.drain(g.before.min(s.blocks.len())..).collect();
            let back = g.from_reserve.saturating_sub(g.copied).min(pushed.len());
            s.reserved += back;
            self.promised += back;
            for b in pushed.into_iter().rev() {
                self.pool.release(b);
            }
        }
    }

    /// Commits a successful step: `toks` are the `(slot, token)` of the batch in order (each
    /// sequence's positions continuing its `len`); newly full blocks enter the prefix index.
    pub fn commit(&mut self, p: Prepared, toks: &[(usize, u32)]) {
        self.commit_drafts(p, toks, &[]);
    }

    /// [`KvCache::commit`] for a step in which the last `n` positions of each `(slot, n)` of
    /// `drafts` are draft tokens awaiting verification: they count in `len` (their rows are
    /// written) but no block holding one enters the prefix index until [`KvCache::truncate`]
    /// keeps or drops them. **A block is never registered with tokens that were rejected.**
    pub fn commit_drafts(
        &mut self,
        _p: Prepared,
        toks: &[(usize, u32)],
        drafts: &[(usize, usize)],
    ) {
        let mut touched: Vec<usize> = Vec::new();
        for &(slot, token) in toks {
            if let Some(s) = self.seqs[slot].as_mut() {
                s.tokens.push(token);
                s.len = s.tokens.len();
                if !touched.contains(&slot) {
                    touched.push(slot);
                }
            }
        }
        for &(slot, n) in drafts {
            if let Some(s) = self.seqs.get_mut(slot).and_then(|s| s.as_mut()) {
                s.unverified = n.min(s.len);
            }
        }
        for slot in touched {
            self.register_full(slot);
        }
    }

    /// Enters the full blocks of `slot` holding only verified positions in the prefix index.
    fn register_full(&mut self, slot: usize) {
        if !self.prefix {
            return;
        }
        let l = self.layout();
        let Some(s) = self.seqs.get_mut(slot).and_then(|s| s.as_mut()) else {
            return;
        };
        let settled = s.len - s.unverified;
        while s.chain.len() < settled / l.block {
            let i = s.chain.len();
            let parent = if i == 0 { self.root } else { s.chain[i - 1] };
            let toks = &s.tokens[i * l.block..(i + 1) * l.block];
            let h = block_hash(parent, toks);
            if self.pool.register(s.blocks[i], h, parent, toks) {
                if let Some(d) = self.disk.as_mut() {
                    d.store(h, parent, toks, &self.pool.block_bytes(s.blocks[i]));
                }
            }
            s.chain.push(h);
            if self.pending.get(&h) == Some(&slot) {
                self.pending.remove(&h);
            }
        }
    }

    /// Cuts `slot` back to its first `len` positions (rejected draft tokens): blocks wholly past
    /// `len` go back to the pool (and to the sequence's reservation, up to what admission
    /// promised it), the positions kept are verified, and their newly full blocks enter the
    /// prefix index. A partly kept block is not registered; its rows past `len` are written
    /// again by the next step. `len` at or past the current length only settles the drafts.
    pub fn truncate(&mut self, slot: usize, len: usize) {
        let l = self.layout();
        let Some(s) = self.seqs.get_mut(slot).and_then(|s| s.as_mut()) else {
            return;
        };
        if len < s.len {
            s.tokens.truncate(len);
            s.len = len;
            // a registered block is full of verified tokens, so it lies below the drafts;
            // truncating below verified positions drops the chain entries past `len` too
            s.chain.truncate(len / l.block);
            let keep = l.blocks_for(len);
            let gone: Vec<BlockId> = s.blocks.drain(keep.min(s.blocks.len())..).collect();
            let room = s.promised_total.saturating_sub(s.blocks.len() + s.reserved);
            let n_gone = gone.len();
            for b in gone.into_iter().rev() {
                self.pool.release(b);
            }
            // never promise more than the pool has (a shared block released stays in use)
            let spare = self.pool.available().saturating_sub(self.promised);
            let back = n_gone.min(room).min(spare);
            self.promised += back;
            if let Some(s) = self.seqs.get_mut(slot).and_then(|s| s.as_mut()) {
                s.reserved += back;
            }
        }
        if let Some(s) = self.seqs.get_mut(slot).and_then(|s| s.as_mut()) {
            s.unverified = 0;
        }
        self.register_full(slot);
    }

    /// Stores the K row (and V row) of position `pos` of the sequence in `slot` for `layer`;
    /// `prepare` made its block present and writable.
    pub fn write(&mut self, slot: usize, pos: usize, layer: usize, k: &[f32], v: Option<&[f32]>) {
        let l = self.layout();
        let Some(b) = self
            .seq(slot)
            .and_then(|s| s.blocks.get(pos / l.block).copied())
        else {
            debug_assert!(false, "write outside the prepared blocks");
            return;
        };
        self.pool.write(b, layer, pos % l.block, false, k);
        if let Some(v) = v {
            self.pool.write(b, layer, pos % l.block, true, v);
        }
    }

    /// The F32 K (or V) rows of `layer` of the blocks covering positions `0..n` of `slot`, one
    /// slice per block (the last may hold rows beyond `n`). Empty for another pool type.
    pub fn segments(&self, slot: usize, layer: usize, n: usize, v: bool) -> Vec<&[f32]> {
        let l = self.layout();
        let Some(s) = self.seq(slot) else {
            return Vec::new();
        };
        s.blocks[..l.blocks_for(n).min(s.blocks.len())]
            .iter()
            .filter_map(|&b| match self.pool.rows(b, layer, v) {
                Rows::F32(r) => Some(r),
                Rows::F16(_) | Rows::Q8_0(_) => None,
            })
            .collect()
    }

    /// [`KvCache::segments`] of a Q8_0 pool: the blocks of 32 of each cache block's K (or V)
    /// rows. Empty for another pool type.
    pub fn segments_q8(&self, slot: usize, layer: usize, n: usize, v: bool) -> Vec<&[BlockQ8_0]> {
        let l = self.layout();
        let Some(s) = self.seq(slot) else {
            return Vec::new();
        };
        s.blocks[..l.blocks_for(n).min(s.blocks.len())]
            .iter()
            .filter_map(|&b| match self.pool.rows(b, layer, v) {
                Rows::Q8_0(r) => Some(r),
                Rows::F32(_) | Rows::F16(_) => None,
            })
            .collect()
    }

    /// Positions `0..n` of `slot`'s K (or V) rows of `layer`, converted to f32 into `out`
    /// (contiguous, `n` rows).
    pub fn gather(&self, slot: usize, layer: usize, n: usize, v: bool, out: &mut Vec<f32>) {
        let l = self.layout();
        let width = if v { l.v_width } else { l.k_width };
        out.clear();
        let Some(s) = self.seq(slot) else {
            return;
        };
        for (i, &b) in s.blocks[..l.blocks_for(n).min(s.blocks.len())]
            .iter()
            .enumerate()
        {
            let rows = (n - i * l.block).min(l.block) * width;
            match self.pool.rows(b, layer, v) {
                Rows::F32(r) => out.extend_from_slice(&r[..rows]),
                Rows::F16(r) => out.extend(r[..rows].iter().map(|&h| f16_to_f32(h))),
                Rows::Q8_0(r) => {
                    let at = out.len();
                    out.resize(at + rows, 0.0);
                    dequantize_q8_0(&r[..rows / QK], &mut out[at..]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
