//! The block pool behind the paged KV cache: fixed-size blocks (`KvLayout::block` positions of
//! every layer) allocated from storage that grows in chunks up to a budget, reference counts so
//! sequences share blocks, and the prefix index: full blocks registered under the hash of their
//! token chain stay cached after their last sequence lets go and are evicted least recently used
//! when the pool needs room. Knows nothing of sequences; `KvCache` (the parent module) does.

use super::{KvLayout, KvType};
use nightshift_kernels::formats::{f32_to_f16, BlockQ8_0, QK};
use nightshift_kernels::scalar::legacy::quantize_q8_0;
use std::collections::{BTreeMap, HashMap};

/// Index of a block in its pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

/// Blocks allocated together when the storage grows (fewer allocations, no large up-front
/// commitment: memory is taken as the cache fills).
const CHUNK_BLOCKS: usize = 32;

/// Storage of some blocks, one element type. Offsets are counted in floats; a Q8_0 chunk holds
/// one block of 32 per 32 floats (every row is whole blocks: `KvType::check`).
enum Chunk {
    F32(Vec<f32>),
    F16(Vec<u16>),
    Q8_0(Vec<BlockQ8_0>),
}

impl Chunk {
    /// Bytes of storage this chunk holds.
    fn bytes(&self) -> usize {
        match self {
            Chunk::F32(v) => std::mem::size_of_val(&v[..]),
            Chunk::F16(v) => std::mem::size_of_val(&v[..]),
            Chunk::Q8_0(v) => std::mem::size_of_val(&v[..]),
        }
    }
}

/// The rows of one layer of one block, as stored.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    Q8_0(&'a [BlockQ8_0]),
}

/// An all-zero Q8_0 block (storage not written yet).
const Q8_ZERO: BlockQ8_0 = BlockQ8_0 {
    d: [0; 2],
    qs: [0; QK],
};

/// What a registered (cached) block holds: its hash, its parent's and its tokens, checked on
/// every lookup so a hash collision can never hand out another prefix's rows.
struct Cached {
    hash: u64,
    parent: u64,
    tokens: Box<[u32]>,
}

/// Counters of the pool since it was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolCounters {
    /// Cached blocks dropped from the index to make room.
    pub evictions: u64,
}

/// Reference-counted blocks with a prefix index and LRU eviction.
pub struct BlockPool {
    layout: KvLayout,
    ty: KvType,
    /// Most blocks the pool may hold (the budget).
    capacity: usize,
    chunks: Vec<Chunk>,
    refs: Vec<u32>,
    /// Allocated blocks holding nothing of value.
    free: Vec<BlockId>,
    cached: Vec<Option<Cached>>,
    index: HashMap<u64, BlockId>,
    /// Evictable blocks (registered, no reference) by the tick they were released at.
    lru: BTreeMap<u64, BlockId>,
    stamp: Vec<u64>,
    tick: u64,
    counters: PoolCounters,
}

impl BlockPool {
    /// A pool of at most `capacity` blocks; nothing is allocated yet.
    pub fn new(layout: KvLayout, ty: KvType, capacity: usize) -> BlockPool {
        BlockPool {
            layout,
            ty,
            capacity,
            chunks: Vec::new(),
            refs: Vec::new(),
            free: Vec::new(),
            cached: Vec::new(),
            index: HashMap::new(),
            lru: BTreeMap::new(),
            stamp: Vec::new(),
            tick: 0,
            counters: PoolCounters::default(),
        }
    }

    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    pub fn kv_type(&self) -> KvType {
        self.ty
    }

    /// Most blocks the pool may hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks allocated so far (storage taken).
    pub fn grown(&self) -> usize {
        self.refs.len()
    }

    /// Blocks referenced by at least one sequence.
    pub fn used(&self) -> usize {
        self.refs.iter().filter(|&&r| r > 0).count()
    }

    /// Unreferenced blocks kept for their prefix (evictable).
    pub fn cached_idle(&self) -> usize {
        self.lru.len()
    }

    /// Blocks an allocation can take now: free, not yet grown, or evictable.
    pub fn available(&self) -> usize {
        self.free.len() + (self.capacity - self.grown()) + self.lru.len()
    }

    pub fn counters(&self) -> PoolCounters {
        self.counters
    }

    pub fn refs(&self, b: BlockId) -> u32 {
        self.refs[b.0 as usize]
    }

    /// Whether `b` is registered in the prefix index.
    pub fn is_cached(&self, b: BlockId) -> bool {
        self.cached[b.0 as usize].is_some()
    }

    /// Whether a sequence holding `b` may write into it: it is the only holder and the block is
    /// not registered (a registered block's rows are promised to whoever looks its hash up).
    pub fn writable(&self, b: BlockId) -> bool {
        self.refs(b) == 1 && !self.is_cached(b)
    }

    /// A block with one reference: a free one, new storage, or the least recently used cached
    /// block (dropped from the index). None when every block is referenced, or the storage could
    /// not be allocated.
    pub fn alloc(&mut self) -> Option<BlockId> {
        let b = match self.free.pop() {
            Some(b) => b,
            None if self.grown() < self.capacity && self.grow() => self.free.pop()?,
            None => self.evict()?,
        };
        self.refs[b.0 as usize] = 1;
        Some(b)
    }

    /// Adds a chunk of storage; false if the allocation failed.
    fn grow(&mut self) -> bool {
        let n = CHUNK_BLOCKS.min(self.capacity - self.grown());
        let floats = n * self.layout.block_floats();
        let chunk = match self.ty {
            KvType::F32 => {
                let mut v: Vec<f32> = Vec::new();
                if v.try_reserve_exact(floats).is_err() {
                    return false;
                }
                v.resize(floats, 0.0);
                Chunk::F32(v)
            }
            KvType::F16 => {
                let mut v: Vec<u16> = Vec::new();
                if v.try_reserve_exact(floats).is_err() {
                    return false;
                }
                v.resize(floats, 0);
                Chunk::F16(v)
            }
            KvType::Q8_0 => {
                let mut v: Vec<BlockQ8_0> = Vec::new();
                if v.try_reserve_exact(floats / QK).is_err() {
                    return false;
                }
                v.resize(floats / QK, Q8_ZERO);
                Chunk::Q8_0(v)
            }
        };
        self.chunks.push(chunk);
        let first = self.grown();
        for i in (first..first + n).rev() {
            self.free.push(BlockId(i as u32));
        }
        self.refs.resize(first + n, 0);
        self.cached.resize_with(first + n, || None);
        self.stamp.resize(first + n, 0);
        true
    }

    /// Drops the least recently released cached block from the index and hands it out.
    fn evict(&mut self) -> Option<BlockId> {
        let (_, b) = self.lru.pop_first()?;
        if let Some(c) = self.cached[b.0 as usize].take() {
            self.index.remove(&c.hash);
        }
        self.counters.evictions += 1;
        Some(b)
    }

    /// One more holder of `b` (a cached idle block leaves the eviction order).
    pub fn retain(&mut self, b: BlockId) {
        let i = b.0 as usize;
        if self.refs[i] == 0 {
            self.lru.remove(&self.stamp[i]);
        }
        self.refs[i] += 1;
    }

    /// One holder less; the last one makes a registered block evictable (most recently used
    /// last) and any other block free.
    pub fn release(&mut self, b: BlockId) {
        let i = b.0 as usize;
        debug_assert!(self.refs[i] > 0, "release of an unreferenced block");
        self.refs[i] = self.refs[i].saturating_sub(1);
        if self.refs[i] > 0 {
            return;
        }
        if self.cached[i].is_some() {
            self.tick += 1;
            self.stamp[i] = self.tick;
            self.lru.insert(self.tick, b);
        } else {
            self.free.push(b);
        }
    }

    /// Registers the full block `b` as holding `tokens` after the prefix hashed `parent`, under
    /// `hash`. False (nothing changes) when another block already holds that prefix, or `b` is
    /// registered already.
    pub fn register(&mut self, b: BlockId, hash: u64, parent: u64, tokens: &[u32]) -> bool {
        let i = b.0 as usize;
        if self.cached[i].is_some() || self.index.contains_key(&hash) {
            return false;
        }
        self.index.insert(hash, b);
        self.cached[i] = Some(Cached {
            hash,
            parent,
            tokens: tokens.into(),
        });
        true
    }

    /// The cached block holding `tokens` after the prefix hashed `parent`, if any (the hash
    /// finds it, the parent hash and the tokens are compared).
    pub fn lookup(&self, hash: u64, parent: u64, tokens: &[u32]) -> Option<BlockId> {
        let &b = self.index.get(&hash)?;
        let c = self.cached[b.0 as usize].as_ref()?;
        (c.parent == parent && *c.tokens == *tokens).then_some(b)
    }

    /// Bytes of storage allocated so far (what the pool really holds, for the admin endpoint:
    /// divided by the positions of the blocks grown, the measured cost per token).
    pub fn storage_bytes(&self) -> usize {
        self.chunks.iter().map(Chunk::bytes).sum()
    }

    /// Copies every row of `src` into `dst` (copy-on-write).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId) {
        let n = self.layout.block_floats();
        let (cs, os) = self.locate(src);
        let (cd, od) = self.locate(dst);
        if cs == cd {
            match &mut self.chunks[cs] {
                Chunk::F32(v) => v.copy_within(os..os + n, od),
                Chunk::F16(v) => v.copy_within(os..os + n, od),
                Chunk::Q8_0(v) => v.copy_within(os / QK..(os + n) / QK, od / QK),
            }
            return;
        }
        let (a, b) = if cs < cd {
            let (l, r) = self.chunks.split_at_mut(cd);
            (&l[cs], &mut r[0])
        } else {
            let (l, r) = self.chunks.split_at_mut(cs);
            (&r[0], &mut l[cd])
        };
        match (a, b) {
            (Chunk::F32(s), Chunk::F32(d)) => d[od..od + n].copy_from_slice(&s[os..os + n]),
            (Chunk::F16(s), Chunk::F16(d)) => d[od..od + n].copy_from_slice(&s[os..os + n]),
            (Chunk::Q8_0(s), Chunk::Q8_0(d)) => {
                d[od / QK..(od + n) / QK].copy_from_slice(&s[os / QK..(os + n) / QK])
            }
            _ => unreachable!("one pool holds one element type"),
        }
    }

    /// Bytes of one block's storage (every layer's rows, as stored).
    pub fn block_byte_len(&self) -> usize {
        self.layout.block_bytes(self.ty)
    }

    /// A copy of block `b`'s storage as little-endian bytes (for the disk tier).
    pub fn block_bytes(&self, b: BlockId) -> Vec<u8> {
        let n = self.layout.block_floats();
        let (c, off) = self.locate(b);
        match &self.chunks[c] {
            Chunk::F32(v) => v[off..off + n]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            Chunk::F16(v) => v[off..off + n]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            Chunk::Q8_0(v) => v[off / QK..(off + n) / QK]
                .iter()
                .flat_map(|b| b.d.into_iter().chain(b.qs.iter().map(|&q| q as u8)))
                .collect(),
        }
    }

    /// Overwrites block `b`'s storage with `bytes` from [`BlockPool::block_bytes`]; false
    /// (nothing written) when the length is not one block's.
    pub fn set_block_bytes(&mut self, b: BlockId, bytes: &[u8]) -> bool {
        if bytes.len() != self.block_byte_len() {
            return false;
        }
        let n = self.layout.block_floats();
        let (c, off) = self.locate(b);
        match &mut self.chunks[c] {
            Chunk::F32(v) => {
                for (d, s) in v[off..off + n].iter_mut().zip(bytes.chunks_exact(4)) {
                    *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                }
            }
            Chunk::F16(v) => {
                for (d, s) in v[off..off + n].iter_mut().zip(bytes.chunks_exact(2)) {
                    *d = u16::from_le_bytes([s[0], s[1]]);
                }
            }
            Chunk::Q8_0(v) => {
                let each = std::mem::size_of::<BlockQ8_0>();
                for (d, s) in v[off / QK..(off + n) / QK]
                    .iter_mut()
                    .zip(bytes.chunks_exact(each))
                {
                    d.d = [s[0], s[1]];
                    for (q, &b) in d.qs.iter_mut().zip(&s[2..]) {
                        *q = b as i8;
                    }
                }
            }
        }
        true
    }

    /// Chunk and element offset of block `b`.
    fn locate(&self, b: BlockId) -> (usize, usize) {
        let i = b.0 as usize;
        (
            i / CHUNK_BLOCKS,
            (i % CHUNK_BLOCKS) * self.layout.block_floats(),
        )
    }

    /// Element offset of row `row` of layer `layer`'s K (or V) rows inside a chunk.
    fn row_offset(&self, b: BlockId, layer: usize, row: usize, v: bool) -> (usize, usize) {
        let l = &self.layout;
        let (c, base) = self.locate(b);
        let lbase = base + layer * l.layer_floats();
        let off = if v {
            lbase + l.block * l.k_width + row * l.v_width
        } else {
            lbase + row * l.k_width
        };
        (c, off)
    }

    /// Stores `src` (`k_width` floats, or `v_width` with `v`) as row `row` of `layer` in `b`,
    /// rounded to f16 for an F16 pool (like ggml_cpy), quantized to Q8_0 blocks for a Q8_0 pool
    /// (ggml_set_rows through the type's `from_float`: the reference quantizer's bits).
    pub fn write(&mut self, b: BlockId, layer: usize, row: usize, v: bool, src: &[f32]) {
        let (c, off) = self.row_offset(b, layer, row, v);
        match &mut self.chunks[c] {
            Chunk::F32(d) => d[off..off + src.len()].copy_from_slice(src),
            Chunk::F16(d) => {
                for (d, &s) in d[off..off + src.len()].iter_mut().zip(src) {
                    *d = f32_to_f16(s);
                }
            }
            Chunk::Q8_0(d) => quantize_q8_0(src, &mut d[off / QK..(off + src.len()) / QK]),
        }
    }

    /// All `block` K rows (or V rows with `v`) of `layer` in `b`.
    pub fn rows(&self, b: BlockId, layer: usize, v: bool) -> Rows<'_> {
        let l = &self.layout;
        let (c, off) = self.row_offset(b, layer, 0, v);
        let n = l.block * if v { l.v_width } else { l.k_width };
        match &self.chunks[c] {
            Chunk::F32(d) => Rows::F32(&d[off..off + n]),
            Chunk::F16(d) => Rows::F16(&d[off..off + n]),
            Chunk::Q8_0(d) => Rows::Q8_0(&d[off / QK..(off + n) / QK]),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Reference counts, copy-on-write, LRU eviction and the budget, on a pool small enough to
    //! fill.

    use super::*;

    fn layout() -> KvLayout {
        KvLayout {
            n_layer: 2,
            k_width: 3,
            v_width: 2,
            block: 4,
        }
    }

    fn f32_rows(p: &BlockPool, b: BlockId, layer: usize, v: bool) -> Vec<f32> {
        match p.rows(b, layer, v) {
            Rows::F32(r) => r.to_vec(),
            Rows::F16(_) | Rows::Q8_0(_) => panic!("expected f32 rows"),
        }
    }

    #[test]
    fn budget_bounds_allocation_and_release_frees() {
        let mut p = BlockPool::new(layout(), KvType::F32, 3);
        assert_eq!(p.available(), 3);
        let a: Vec<BlockId> = (0..3).map(|_| p.alloc().expect("room")).collect();
        assert_eq!(p.alloc(), None, "a fourth block is beyond the budget");
        assert_eq!((p.used(), p.available()), (3, 0));
        p.release(a[1]);
        assert_eq!((p.used(), p.available()), (2, 1));
        assert_eq!(p.alloc(), Some(a[1]), "the freed block is reused");
    }

    #[test]
    fn refcounts_keep_shared_blocks_until_the_last_holder() {
        let mut p = BlockPool::new(layout(), KvType::F32, 2);
        let b = p.alloc().expect("room");
        p.retain(b);
        assert_eq!(p.refs(b), 2);
        assert!(!p.writable(b), "a shared block is not writable");
        p.release(b);
        assert!(p.writable(b));
        assert_eq!(p.available(), 1);
        p.release(b);
        assert_eq!(p.available(), 2);
    }

    #[test]
    fn copy_on_write_copies_every_row_of_every_layer() {
        for ty in [KvType::F32, KvType::F16] {
            // 40 blocks: the copy crosses storage chunks too
            let mut p = BlockPool::new(layout(), ty, 40);
            let blocks: Vec<BlockId> = (0..40).map(|_| p.alloc().expect("room")).collect();
            let (src, near, far) = (blocks[1], blocks[2], blocks[39]);
            for layer in 0..2 {
                for row in 0..4 {
                    let k = [layer as f32, row as f32, 0.5];
                    p.write(src, layer, row, false, &k);
                    p.write(src, layer, row, true, &[-(row as f32), 2.0]);
                }
            }
            for dst in [near, far] {
                p.copy_block(src, dst);
                for layer in 0..2 {
                    for v in [false, true] {
                        match (p.rows(src, layer, v), p.rows(dst, layer, v)) {
                            (Rows::F32(a), Rows::F32(b)) => assert_eq!(a, b),
                            (Rows::F16(a), Rows::F16(b)) => assert_eq!(a, b),
                            _ => panic!("mixed types"),
                        }
                    }
                }
            }
        }
    }

    /// A Q8_0 pool stores each row as its quantized blocks, copies blocks whole across storage
    /// chunks, and holds 34 bytes per 32 elements.
    #[test]
    fn q8_0_rows_are_quantized_blocks() {
        let l = KvLayout {
            n_layer: 2,
            k_width: 64,
            v_width: 32,
            block: 4,
        };
        let mut p = BlockPool::new(l, KvType::Q8_0, 40);
        let blocks: Vec<BlockId> = (0..40).map(|_| p.alloc().expect("room")).collect();
        let (src, far) = (blocks[1], blocks[39]);
        let k: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.37).collect();
        p.write(src, 1, 2, false, &k);
        p.write(src, 1, 3, true, &k[..32]);
        let mut want = vec![Q8_ZERO; 2];
        quantize_q8_0(&k, &mut want);
        let Rows::Q8_0(rows) = p.rows(src, 1, false) else {
            panic!("expected q8_0 rows");
        };
        assert_eq!(&rows[4..6], &want[..], "row 2 is blocks 4 and 5");
        let Rows::Q8_0(rows) = p.rows(src, 1, true) else {
            panic!("expected q8_0 rows");
        };
        assert_eq!(rows[3], want[0]);
        p.copy_block(src, far);
        for layer in 0..2 {
            for v in [false, true] {
                match (p.rows(src, layer, v), p.rows(far, layer, v)) {
                    (Rows::Q8_0(a), Rows::Q8_0(b)) => assert_eq!(a, b),
                    _ => panic!("expected q8_0 rows"),
                }
            }
        }
        assert_eq!(p.storage_bytes(), 40 * l.block_bytes(KvType::Q8_0));
        assert_eq!(l.block_bytes(KvType::Q8_0), 2 * 4 * 96 / 32 * 34);
    }

    #[test]
    fn rows_land_where_written() {
        let mut p = BlockPool::new(layout(), KvType::F32, 2);
        let b = p.alloc().expect("room");
        p.write(b, 1, 2, false, &[1.0, 2.0, 3.0]);
        p.write(b, 1, 3, true, &[4.0, 5.0]);
        let k = f32_rows(&p, b, 1, false);
        assert_eq!(&k[6..9], &[1.0, 2.0, 3.0]);
        assert_eq!(&f32_rows(&p, b, 1, true)[6..8], &[4.0, 5.0]);
        assert!(f32_rows(&p, b, 0, false).iter().all(|&x| x == 0.0));
    }

    #[test]
    fn cached_blocks_survive_release_and_are_evicted_least_recently_used() {
        let mut p = BlockPool::new(layout(), KvType::F32, 3);
        let toks = |i: u32| [i, i + 1, i + 2, i + 3];
        let (a, b, c) = (p.alloc().unwrap(), p.alloc().unwrap(), p.alloc().unwrap());
        assert!(p.register(a, 10, 0, &toks(0)));
        assert!(p.register(b, 11, 10, &toks(4)));
        assert!(!p.register(c, 11, 10, &toks(4)), "one block per prefix");
        // released in the order b, a: b is the least recently used
        p.release(b);
        p.release(a);
        assert_eq!((p.cached_idle(), p.used()), (2, 1));
        assert_eq!(p.lookup(10, 0, &toks(0)), Some(a));
        assert_eq!(p.lookup(10, 0, &toks(1)), None, "tokens are compared");
        assert_eq!(p.lookup(10, 7, &toks(0)), None, "the parent is compared");
        // a hit takes the block out of the eviction order
        p.retain(a);
        assert_eq!(p.cached_idle(), 1);
        p.release(a);
        // the pool is full: the next allocation evicts b (released before a)
        let d = p.alloc().expect("eviction makes room");
        assert_eq!(d, b);
        assert_eq!(
            p.lookup(11, 10, &toks(4)),
            None,
            "evicted blocks leave the index"
        );
        assert!(!p.is_cached(d) && p.writable(d));
        assert_eq!(p.counters().evictions, 1);
        let e = p.alloc().expect("a is evictable");
        assert_eq!(e, a);
        assert_eq!(p.alloc(), None, "everything is referenced now");
    }
}
