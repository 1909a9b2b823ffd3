//! Sharing a prefix that is still being computed. Admission only finds blocks that are already
//! in the prefix index, so requests arriving together (a batch of reviews sharing a system
//! prompt) would each compute the shared blocks. Instead, every admitted sequence that reuses
//! prefixes *claims* the full blocks of its prompt that are neither cached nor claimed yet (by
//! chain hash: the sequence will compute them), and before each prefill chunk the scheduler asks
//! [`KvCache::attach`]: the sequence takes every further block of its prompt that has entered
//! the index since (shared, not copied), and is told to wait while its next block is claimed by
//! another live sequence that has not finished it. A waiting sequence computes nothing; when
//! the claimant's step commits the block it enters the index and the waiter takes it.
//!
//! A block's claim goes to the first sequence admitted with it, so a sequence only ever waits
//! for one admitted before it: the waits form no cycle, and the oldest sequence always
//! computes. A claimant that leaves drops its claims; its waiters then compute the blocks
//! themselves. Rows taken this way are the rows a cold computation writes (the blocks are the
//! claimant's, found by hash, parent and tokens like any prefix hit).

use super::{block_hash, KvCache};

/// What [`KvCache::attach`] found for a sequence prefilling its prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attached {
    /// Positions the sequence holds now (its next prompt position to compute).
    pub len: usize,
    /// Positions taken from the index by this call.
    pub taken: usize,
    /// The next block is being computed by another live sequence: compute nothing this step.
    pub wait: bool,
}

impl KvCache {
    /// Claims the full blocks of `prompt` past what `slot` holds that no live sequence has
    /// claimed and the index does not hold (admission calls it).
    pub(super) fn claim(&mut self, slot: usize, prompt: &[u32]) {
        let b = self.layout().block;
        let Some(s) = self.seqs.get(slot).and_then(|s| s.as_ref()) else {
            return;
        };
        let mut parent = s.chain.last().copied().unwrap_or(self.root);
        let mut claims = Vec::new();
        for (i, toks) in prompt.chunks_exact(b).enumerate().skip(s.chain.len()) {
            let h = block_hash(parent, toks);
            // a hit admission copies (it holds the last prompt position) is in the index
            let cached = i < s.blocks.len() || self.pool.lookup(h, parent, toks).is_some();
            parent = h;
            if cached {
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(e) = self.pending.entry(h) {
                e.insert(slot);
                claims.push(h);
            }
        }
        if let Some(s) = self.seqs.get_mut(slot).and_then(|s| s.as_mut()) {
            s.claims = claims;
        }
    }

    /// Drops the claims `slot` still holds (it left).
    pub(super) fn unclaim(&mut self, slot: usize, claims: &[u64]) {
        for h in claims {
            if self.pending.get(h) == Some(&slot) {
                self.pending.remove(h);
            }
        }
    }

    /// Before a prefill chunk of `slot`: takes every further block of its prompt found in the
    /// index (never its last prompt position, whose logits must be computed), and says whether
    /// its next block is claimed by another live sequence still computing it. Only a sequence
    /// admitted with prefix reuse, at a block boundary with no block allocated past its length
    /// and no unverified positions, takes anything. A taken block comes out of the sequence's
    /// reservation (it needs one block fewer).
    pub fn attach(&mut self, slot: usize) -> Attached {
        let b = self.layout().block;
        let root = self.root;
        let mut taken = 0;
        let mut wait = false;
        loop {
            let Some(s) = self.seqs.get(slot).and_then(|s| s.as_ref()) else {
                break;
            };
            let i = s.len / b;
            let aligned = s.len % b == 0
                && s.blocks.len() == i
                && s.chain.len() == i
                && s.unverified == 0
                && s.tokens.len() == s.len;
            // the last prompt position is always computed
            if !self.prefix || !aligned || (i + 1) * b >= s.prompt.len() {
                break;
            }
            let parent = s.chain.last().copied().unwrap_or(root);
            let toks = &s.prompt[i * b..(i + 1) * b];
            let h = block_hash(parent, toks);
            let Some(found) = self.pool.lookup(h, parent, toks) else {
                wait = self
                    .pending
                    .get(&h)
                    .is_some_and(|&o| o != slot && self.seq(o).is_some());
                break;
            };
            // an idle block leaves the evictable ones: it must not take a block promised to
            // another sequence
            let idle = self.pool.refs(found) == 0;
            if s.reserved == 0 && idle && self.pool.available() <= self.promised {
                break;
            }
            let toks = toks.to_vec();
            self.pool.retain(found);
            if let Some(s) = self.seqs.get_mut(slot).and_then(|s| s.as_mut()) {
                if s.reserved > 0 {
                    s.reserved -= 1;
                    self.promised -= 1;
                }
                s.blocks.push(found);
                s.chain.push(h);
                s.tokens.extend_from_slice(&toks);
                s.len += b;
            }
            taken += b;
        }
        self.hit_tokens += taken as u64;
        self.attached_tokens += taken as u64;
        let len = self.seq(slot).map_or(0, |s| s.len);
        if let Some(s) = self.seqs.get_mut(slot).and_then(|s| s.as_mut()) {
            // nothing is left to take once the prompt is past its last full block
            if (len / b + 1) * b >= s.prompt.len() {
                s.prompt = Vec::new();
            }
        }
        Attached { len, taken, wait }
    }

    /// Prompt blocks claimed by live sequences and not computed yet.
    pub fn pending_blocks(&self) -> usize {
        self.pending.len()
    }
}
