//! Shared calls: one layer call split between the nodes on this machine as they go, instead of
//! in advance.
//!
//! A split fixed in advance (`balance::plan`) lasts as long as its slowest share, and on one
//! machine whose cores also run the coordinator no cost model predicts the shares' times well
//! (an expert routed 3 rows is not 3x one routed 1 row, a node may be descheduled for a slice).
//! When two or more nodes reached through shared memory hold every expert of a call (the local
//! cluster's default placement replicates every expert), the whole call is posted to each of
//! them under a fresh tag of the claim board (`nightshift_proto::shm::board`), its expert groups
//! ordered longest first; each node takes groups from the board until none are left and answers
//! the pairs it computed. The nodes finish within about one group of each other. The groups of
//! experts the last prefetch hints sent to one of them (`hints::take_targets`) are that node's alone,
//! first in its request: it read them ahead, and another node taking one would read it again.
//! A node that does not answer leaves them `missing`, as any group it took.
//!
//! Outputs are still one row per pair, summed by the engine in top-k order, so results are
//! bit-identical to any other split. A node that fails or dies leaves the groups it took
//! unanswered: they come back as `missing`, and the ordinary rounds retry them on the other
//! replicas with that node excluded. So does a node still silent at its hedge point (stopped,
//! descheduled for long) while another node answered: the call stops waiting for it (`hedged`),
//! it is marked suspect, and its region is left to a background waiter (`shm_link::linger`).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use nightshift_atlas_core::placement::{NodeId, Placement};
use nightshift_model::{ActRows, ExpertPair};

use super::balance::expert_cost;
use super::call::{record_spread, Share};
use super::hints::{self, Hints};
use super::{hedge, lock, shm_link, LinkState, Shared};

/// What a shared call left to the ordinary rounds.
pub(super) struct SharedRound {
    /// Pairs (indices into the call's `pairs`) nobody answered, ascending.
    pub(super) missing: Vec<usize>,
    /// Nodes whose part failed, with the reason.
    pub(super) failed: Vec<(NodeId, String)>,
    /// Nodes given up on at their hedge point (no answer yet; not failed).
    pub(super) hedged: Vec<NodeId>,
}

/// Runs `todo` (indices into `pairs`) as a shared call and writes the answered outputs into
/// `out` (each taker's prefetch hint riding with its request, the other nodes' sent alone), or
/// returns `None` (nothing done) when no two reachable nodes on this machine hold all
/// of its experts, it has fewer than two experts, the board is off, or another caller's shared
/// call holds the board (one board, one call at a time: starting a call ends the claims of the
/// one before).
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    s: &Arc<Shared>,
    placement: &Placement,
    layer: usize,
    acts: &ActRows,
    pairs: &[ExpertPair],
    todo: &[usize],
    mut hints: Option<&mut Hints>,
    out: &mut [f32],
) -> Option<SharedRound> {
    // taken whether or not this call is shared: they were for this call only
    let targets = hints::take_targets(s, layer);
    let board = s.board.as_ref()?;
    // Released on every return below.
    struct Held<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Held<'_> {
        fn drop(&mut self) {
            self.0.store(false, Ordering::Release);
        }
    }
    if s.board_busy.swap(true, Ordering::AcqRel) {
        return None;
    }
    let _held = Held(&s.board_busy);
    let mut groups: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for &pi in todo {
        groups.entry(pairs[pi].expert).or_default().push(pi);
    }
    if groups.len() < 2 {
        return None;
    }
    let takers: Vec<NodeId> = (0..s.nodes.len())
        .filter(|&n| {
            matches!(&*lock(&s.nodes[n].state), LinkState::Up(c) if c.shm.is_some())
                && groups
                    .keys()
                    .all(|&e| placement.replicas(layer, e as usize).contains(&n))
        })
        .collect();
    if takers.len() < 2 {
        return None;
    }
    // Longest groups first (ties by expert id: deterministic), so the last ones taken are short.
    let mut order: Vec<(u32, Vec<usize>)> = groups.into_iter().collect();
    order.sort_by_key(|(_, idx)| std::cmp::Reverse(idx.len()));
    let cost: usize = order.iter().map(|(_, idx)| expert_cost(idx.len())).sum();
    // The groups of experts hinted to a taker are that taker's alone, first in its request (it
    // read them ahead; another node claiming one would read it again, on demand); the rest go
    // through the board, in the same order in every request.
    let mut owned: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
    let mut free: Vec<usize> = Vec::new();
    for (e, idx) in order {
        match targets.get(&e).copied().filter(|n| takers.contains(n)) {
            Some(n) => owned.entry(n).or_default().extend(idx),
            None => free.extend(idx),
        }
    }
    let request_of = |node: NodeId| -> (Vec<usize>, u32) {
        let mine = owned.get(&node).map_or(&[][..], Vec::as_slice);
        let groups = mine
            .iter()
            .map(|&pi| pairs[pi].expert)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        (mine.iter().chain(&free).copied().collect(), groups as u32)
    };
    let tag = loop {
        let t = s.next_tag.fetch_add(1, Ordering::Relaxed);
        if t != 0 {
            break t;
        }
    };
    board.start(tag);
    let mut posted = Vec::with_capacity(takers.len());
    for &node in &takers {
        let (pair_idx, owns) = request_of(node);
        if pair_idx.is_empty() {
            // every group is another node's: nothing to post (its hint goes alone, below)
            continue;
        }
        let share = Share {
            node,
            pair_idx,
            cost: cost / takers.len(),
            hint: hints.as_deref_mut().and_then(|h| h.take(s, node)),
        };
        match shm_link::post(s, layer, acts, pairs, share, tag, owns) {
            Ok(p) => posted.push(p),
            Err(mut back) => {
                if let Some(h) = hints.as_deref_mut() {
                    h.restore(s, &mut back);
                }
            }
        }
    }
    if posted.is_empty() {
        board.finish();
        return None;
    }
    lock(&s.stats).shared_rounds += 1;
    // the nodes that are not taking part get their hints alone while the takers compute
    if let Some(h) = hints {
        h.send_rest(s, acts);
    }
    let mut landed = Vec::with_capacity(posted.len());
    let mut silent = Vec::new();
    for p in posted {
        let at = p.hedge_point();
        match shm_link::wait_until(p, out, at) {
            Ok(t) => landed.push(t),
            Err(p) => silent.push(p),
        }
    }
    // Given up on only while another node answered: with none, the call waits for them all to
    // their stall deadlines as before (a loaded machine, not a stopped node).
    if !landed.iter().any(|((_, r), _)| r.is_ok()) {
        for p in silent.drain(..) {
            landed.push(shm_link::wait(p, out));
        }
    }
    board.finish();
    let mut hedged = Vec::with_capacity(silent.len());
    for p in silent {
        let node = p.share.node;
        hedge::mark_slow(s, node, layer, p.waited());
        hedge::count_hedge(s, node);
        hedged.push(node);
        shm_link::linger(p);
    }
    record_spread(s, &landed);
    // Each node's share came back narrowed to the pairs it answered, already in `out`.
    let mut answered = vec![false; pairs.len()];
    let mut failed = Vec::new();
    for ((share, result), _) in landed {
        match result {
            Ok(()) => share.pair_idx.iter().for_each(|&pi| answered[pi] = true),
            Err(e) => failed.push((share.node, e)),
        }
    }
    let mut missing: Vec<usize> = todo.iter().copied().filter(|&pi| !answered[pi]).collect();
    missing.sort_unstable();
    Some(SharedRound {
        missing,
        failed,
        hedged,
    })
}
