//! The cache's bookkeeping without a model: prefix hits and their limits, copy-on-write of a
//! shared or cached block, reservations that keep admitted sequences from running out, the
//! rollback of a failed step, and eviction of idle prefixes when the pool needs room.

use super::*;

const BLOCK: usize = 4;

fn cache(blocks: usize, prefix: bool) -> KvCache {
    let layout = KvLayout {
        n_layer: 2,
        k_width: 2,
        v_width: 1,
        block: BLOCK,
    };
    KvCache::new(layout, KvType::F32, blocks, 0xfeed, prefix)
}

/// Runs one "step": positions `len..len + tokens.len()` of `slot` get K rows `[token, pos]` and
/// V rows `[-token]` in every layer.
fn step(c: &mut KvCache, slot: usize, tokens: &[u32]) -> Result<(), ModelError> {
    let len = c.seq(slot).expect("live").len;
    let p = c.prepare(&[(slot, len + tokens.len())])?;
    for (i, &t) in tokens.iter().enumerate() {
        for layer in 0..2 {
            let k = [t as f32, (len + i) as f32];
            c.write(slot, len + i, layer, &k, Some(&[-(t as f32)]));
        }
    }
    let toks: Vec<(usize, u32)> = tokens.iter().map(|&t| (slot, t)).collect();
    c.commit(p, &toks);
    Ok(())
}

/// The K rows of positions `0..n` of layer 1, gathered.
fn k_rows(c: &KvCache, slot: usize, n: usize) -> Vec<f32> {
    let mut out = Vec::new();
    c.gather(slot, 1, n, false, &mut out);
    out
}

fn expected_rows(tokens: &[u32]) -> Vec<f32> {
    tokens
        .iter()
        .enumerate()
        .flat_map(|(p, &t)| [t as f32, p as f32])
        .collect()
}

#[test]
fn a_repeated_prompt_reuses_its_full_blocks_and_computes_the_rest() {
    let mut c = cache(16, true);
    let prompt: Vec<u32> = (100..110).collect(); // 2 full blocks + 2
    let (a, cached) = c.admit(&prompt, 12, true).expect("room");
    assert_eq!(cached, 0);
    step(&mut c, a, &prompt).expect("step");
    c.remove(a);
    assert_eq!(
        c.stats().cached_blocks,
        2,
        "the two full blocks stay cached"
    );
    let (b, cached) = c.admit(&prompt, 12, true).expect("room");
    assert_eq!(cached, 8);
    assert_eq!(k_rows(&c, b, 8), expected_rows(&prompt[..8]));
    step(&mut c, b, &prompt[8..]).expect("rest");
    assert_eq!(k_rows(&c, b, 10), expected_rows(&prompt));
    let st = c.stats();
    assert_eq!((st.lookups, st.lookup_tokens, st.hit_tokens), (2, 20, 8));
    // a different second block: only the first one is shared
    let mut other = prompt.clone();
    other[5] = 7;
    let (_, cached) = c.admit(&other, 12, true).expect("room");
    assert_eq!(cached, 4);
    // a request that asks for no reuse computes everything and is not counted as a lookup
    let (_, cached) = c.admit(&prompt, 12, false).expect("room");
    assert_eq!((cached, c.stats().lookups), (0, 3));
}

#[test]
fn prefix_caching_off_never_hits() {
    let mut c = cache(16, false);
    let prompt: Vec<u32> = (0..8).collect();
    let (a, _) = c.admit(&prompt, 8, true).expect("room");
    step(&mut c, a, &prompt).expect("step");
    c.remove(a);
    assert_eq!(c.stats().cached_blocks, 0);
    assert_eq!(c.admit(&prompt, 8, true).expect("room").1, 0);
}

#[test]
fn a_fully_cached_prompt_recomputes_its_last_position_in_a_copy() {
    let mut c = cache(16, true);
    let prompt: Vec<u32> = (0..8).collect(); // exactly 2 blocks
    let (a, _) = c.admit(&prompt, 8, true).expect("room");
    step(&mut c, a, &prompt).expect("step");
    let (b, cached) = c.admit(&prompt, 8, true).expect("room");
    assert_eq!(cached, 7, "the last prompt position is always computed");
    let shared = c.seq(b).expect("b").blocks.clone();
    assert_eq!(shared, c.seq(a).expect("a").blocks, "both blocks shared");
    step(&mut c, b, &prompt[7..]).expect("last");
    let sb = c.seq(b).expect("b").blocks.clone();
    assert_eq!(sb[0], shared[0]);
    assert_ne!(sb[1], shared[1], "the cached block was copied, not written");
    assert_eq!(k_rows(&c, b, 8), expected_rows(&prompt));
    assert_eq!(k_rows(&c, a, 8), expected_rows(&prompt));
}

#[test]
fn forks_share_blocks_and_copy_the_partial_one_on_write() {
    let mut c = cache(16, true);
    let (a, _) = c.admit(&[1, 2, 3, 4, 5, 6], 10, true).expect("room");
    step(&mut c, a, &[1, 2, 3, 4, 5, 6]).expect("step");
    let b = c.fork(a).expect("fork");
    assert_eq!(c.pool().refs(c.seq(a).expect("a").blocks[1]), 2);
    step(&mut c, b, &[9]).expect("b writes");
    step(&mut c, a, &[8]).expect("a writes");
    assert_eq!(k_rows(&c, a, 7), expected_rows(&[1, 2, 3, 4, 5, 6, 8]));
    assert_eq!(k_rows(&c, b, 7), expected_rows(&[1, 2, 3, 4, 5, 6, 9]));
    let (ba, bb) = (
        c.seq(a).expect("a").blocks.clone(),
        c.seq(b).expect("b").blocks.clone(),
    );
    assert_eq!(ba[0], bb[0], "the full block stays shared");
    assert_ne!(ba[1], bb[1]);
}

#[test]
fn admission_reserves_blocks_so_admitted_sequences_never_run_out() {
    let mut c = cache(4, true);
    // 10 positions at most: 3 blocks promised
    let (a, _) = c.admit(&[1, 2], 10, true).expect("room");
    assert_eq!(c.stats().reserved_blocks, 3);
    assert!(
        matches!(c.admit(&[3, 4], 8, true), Err(ModelError::KvFull(_))),
        "2 blocks cannot be promised with 1 spare"
    );
    let (b, _) = c.admit(&[3], 4, true).expect("one block fits");
    // a sequence without a reservation cannot take promised blocks
    let free = c.add();
    assert!(matches!(
        step(&mut c, free, &[1]),
        Err(ModelError::KvFull(_))
    ));
    assert_eq!(c.seq(free).expect("free").len, 0);
    step(&mut c, a, &(0..10).collect::<Vec<u32>>()).expect("a within its promise");
    step(&mut c, b, &[1, 2, 3, 4]).expect("b within its promise");
    assert_eq!(c.stats().reserved_blocks, 0);
    c.remove(a);
    assert_eq!(c.stats().used_blocks, 1);
}

#[test]
fn a_rolled_back_step_gives_its_blocks_and_reservation_back() {
    let mut c = cache(8, true);
    let (a, _) = c.admit(&[1, 2, 3], 12, true).expect("room");
    let before = c.stats();
    let p = c.prepare(&[(a, 9)]).expect("prepare");
    assert_eq!(c.stats().used_blocks, 3);
    c.rollback(p);
    // the storage grown for the step stays allocated (free blocks); everything else is back
    let after = c.stats();
    assert_eq!(after.allocated_blocks, 8);
    let after = KvStats {
        allocated_blocks: before.allocated_blocks,
        allocated_bytes: before.allocated_bytes,
        ..after
    };
    assert_eq!(after, before);
    assert_eq!(c.seq(a).expect("a").len, 0);
}

#[test]
fn idle_prefixes_are_evicted_tail_first_when_the_pool_needs_room() {
    let mut c = cache(3, true);
    let prompt: Vec<u32> = (0..12).collect();
    let (a, _) = c.admit(&prompt, 12, true).expect("room");
    step(&mut c, a, &prompt).expect("step");
    c.remove(a);
    assert_eq!(c.stats().cached_blocks, 3);
    // one block needed: the chain's tail goes first, the head stays findable
    let (b, _) = c.admit(&[50], 4, true).expect("eviction makes room");
    step(&mut c, b, &[50]).expect("step");
    assert_eq!(c.stats().evictions, 1);
    c.remove(b);
    let (_, cached) = c.admit(&prompt, 12, true).expect("room");
    assert_eq!(cached, 8, "the first two blocks survived");
}

/// Like `step`, the last `drafts` tokens being unverified drafts.
fn step_drafts(c: &mut KvCache, slot: usize, tokens: &[u32], drafts: usize) {
    let len = c.seq(slot).expect("live").len;
    let p = c.prepare(&[(slot, len + tokens.len())]).expect("room");
    for (i, &t) in tokens.iter().enumerate() {
        for layer in 0..2 {
            let k = [t as f32, (len + i) as f32];
            c.write(slot, len + i, layer, &k, Some(&[-(t as f32)]));
        }
    }
    let toks: Vec<(usize, u32)> = tokens.iter().map(|&t| (slot, t)).collect();
    c.commit_drafts(p, &toks, &[(slot, drafts)]);
}

#[test]
fn truncation_drops_rejected_drafts_and_gives_their_blocks_back() {
    let mut c = cache(16, true);
    let prompt: Vec<u32> = (1..=3).collect();
    let (a, _) = c.admit(&prompt, 12, true).expect("room");
    step(&mut c, a, &prompt).expect("prompt");
    let before = c.stats();
    assert_eq!(before.reserved_blocks, 2, "3 blocks promised, 1 taken");
    // the decode token then 5 drafts: positions 3..9 take blocks 1 and 2
    step_drafts(&mut c, a, &[4, 50, 51, 52, 53, 54], 5);
    assert_eq!(c.stats().reserved_blocks, 0);
    // block 0 (1 2 3 4) holds verified tokens only and is indexed; the drafts' blocks are not
    let cached: Vec<bool> = c
        .seq(a)
        .expect("live")
        .blocks
        .iter()
        .map(|&b| c.pool().is_cached(b))
        .collect();
    assert_eq!(cached, [true, false, false]);
    // one draft accepted: positions 0..5 stay, block 2 goes back to the reservation
    c.truncate(a, 5);
    let s = c.stats();
    assert_eq!(c.seq(a).expect("live").len, 5);
    assert_eq!(s.reserved_blocks, 1);
    assert_eq!(s.used_blocks, 2);
    step(&mut c, a, &[60, 61, 62]).expect("next step");
    assert_eq!(
        k_rows(&c, a, 8),
        expected_rows(&[1, 2, 3, 4, 50, 60, 61, 62])
    );
    c.remove(a);
    let (b, cached) = c
        .admit(&[1, 2, 3, 4, 50, 51, 52, 53, 9], 12, true)
        .expect("room");
    assert_eq!(cached, 4, "block 0 is cached, block 1 held rejected drafts");
    c.remove(b);
    let (b, cached) = c
        .admit(&[1, 2, 3, 4, 50, 60, 61, 62, 9], 12, true)
        .expect("room");
    assert_eq!(cached, 8, "the verified tokens of block 1 are cached");
    c.remove(b);
}

/// A Q8_0 cache takes rows of whole blocks only (as llama.cpp, which refuses other head sizes),
/// costs 34 bytes per 32 elements, and gives back the dequantized rows it was written.
#[test]
fn q8_0_cache_checks_head_sizes_and_stores_blocks() {
    let l = KvLayout {
        n_layer: 2,
        k_width: 64,
        v_width: 64,
        block: BLOCK,
    };
    assert!(KvType::Q8_0.check(&l, 32, 32).is_ok());
    let err = KvType::Q8_0
        .check(&KvLayout { k_width: 48, ..l }, 48, 32)
        .expect_err("48 is not whole blocks");
    assert!(
        err.to_string().contains("multiple of 32") && err.to_string().contains("found 48"),
        "{err}"
    );
    assert!(KvType::F16
        .check(&KvLayout { k_width: 48, ..l }, 48, 32)
        .is_ok());
    assert_eq!(KvType::parse("Q8_0"), Ok(KvType::Q8_0));
    assert!(KvType::parse("q4_0").is_err());
    let mut c = KvCache::new(l, KvType::Q8_0, 4, 1, false);
    let (s, _) = c.admit(&[1, 2, 3, 4, 5], 6, false).expect("room");
    let p = c.prepare(&[(s, 5)]).expect("blocks");
    let row: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 7.0).collect();
    for pos in 0..5 {
        for layer in 0..2 {
            c.write(s, pos, layer, &row, Some(&row));
        }
    }
    c.commit(p, &[(s, 1), (s, 2), (s, 3), (s, 4), (s, 5)]);
    let mut back = Vec::new();
    c.gather(s, 1, 5, true, &mut back);
    assert_eq!(back.len(), 5 * 64);
    let worst = back
        .iter()
        .zip(row.iter().cycle())
        .fold(0f32, |w, (a, b)| w.max((a - b).abs()));
    assert!(worst > 0.0 && worst <= 9.0 / 127.0, "q8_0 rounding {worst}");
    let st = c.stats();
    // theoretical (layout) and measured (the storage allocated) bytes per position agree
    assert_eq!(st.bytes_per_token, 2 * 128 / 32 * 34);
    assert_eq!(
        st.allocated_bytes,
        st.allocated_blocks * BLOCK * st.bytes_per_token
    );
    assert_eq!(c.segments_q8(s, 0, 5, false).len(), 2);
    assert!(
        c.segments(s, 0, 5, false).is_empty(),
        "no f32 rows in a q8_0 pool"
    );
}

#[test]
fn a_budget_for_n_sequences_admits_all_n() {
    let layout = KvLayout {
        n_layer: 1,
        k_width: 2,
        v_width: 1,
        block: KvLayout::BLOCK,
    };
    let admits = |budget: usize| {
        let mut c = KvCache::new(layout, KvType::F32, layout.blocks_for(budget), 1, false);
        (0..4)
            .take_while(|&i| c.admit(&[i], 194, false).is_ok())
            .count()
    };
    // 194 positions take 13 blocks of 16: positions x sequences leaves the fourth out
    assert_eq!(admits(4 * 194), 3);
    assert_eq!(admits(KvLayout::budget_for(4, 194)), 4);
}
