//! What a share posted on a link (shared memory, `shm_link`, or a data link, `net_link`) holds
//! until it is collected or given up on: its node's in-flight work and the link's busy flag,
//! both released when it drops, and the clock its hedge point and stall deadline run from.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::call::{Share, Timed};
use super::{NodeLink, Shared};

/// A link one layer call holds from post to wait.
pub(super) trait Link: Send + Sync + 'static {
    /// Set by the call that holds the link.
    fn busy(&self) -> &AtomicBool;
}

/// A share out on `link`.
pub(super) struct Held<L: Link> {
    pub(super) s: Arc<Shared>,
    pub(super) share: Share,
    pub(super) link: Arc<L>,
    /// The node's link generation when posted (a later one means the link was replaced).
    pub(super) generation: u64,
    pub(super) bytes_out: usize,
    pub(super) started: Instant,
}

impl<L: Link> Held<L> {
    /// Puts the share's work on its node's in-flight count, from now. `link` must already be
    /// marked busy by the caller; both are released when this drops.
    pub(super) fn new(
        s: &Arc<Shared>,
        share: Share,
        link: Arc<L>,
        generation: u64,
        bytes_out: usize,
    ) -> Held<L> {
        s.nodes[share.node]
            .outstanding
            .fetch_add(share.cost, Ordering::Relaxed);
        Held {
            s: s.clone(),
            share,
            link,
            generation,
            bytes_out,
            started: Instant::now(),
        }
    }

    pub(super) fn node(&self) -> &NodeLink {
        &self.s.nodes[self.share.node]
    }

    /// The moment the share should be hedged (None: its node has too little history to judge,
    /// so the share waits for its stall deadline).
    pub(super) fn hedge_point(&self) -> Option<Instant> {
        super::hedge::hedge_after(&self.s, self.share.node, self.share.cost)
            .map(|d| self.started + d)
    }

    /// How long after posting the caller gave up on the share and hedged (for logs).
    pub(super) fn waited(&self) -> Duration {
        self.started.elapsed()
    }

    /// How long the share may take before its node counts as stalled, from its post.
    pub(super) fn stall_after(&self) -> Duration {
        super::hedge::stall_deadline(&self.s, self.share.node, self.share.cost)
    }

    /// Until when a wait for the share runs: `hedge_at` when it comes before the stall
    /// deadline (then true: the wait hands the share back unanswered), else the stall deadline.
    pub(super) fn wait_deadline(&self, hedge_at: Option<Instant>) -> (Instant, bool) {
        let stall = self.started + self.stall_after();
        match hedge_at {
            Some(h) if h < stall => (h, true),
            _ => (stall, false),
        }
    }

    /// Whether the node's link this share went out on is still the current one (a broken
    /// stream or link replaces it): a wait stops as soon as it is not.
    pub(super) fn link_alive(&self) -> bool {
        let generation = self.generation;
        matches!(&*super::lock(&self.node().state), super::LinkState::Up(c) if c.generation == generation)
    }
}

/// A link's wait for a posted share `P` until an optional hedge point: the outcome, or the
/// share handed back unanswered.
pub(super) type WaitUntil<P> = fn(P, &mut [f32], Option<Instant>) -> Result<Timed<()>, P>;

/// Waits for a posted share `p` with `wait_until` and no hedge point: until it is answered or
/// its stall deadline passes (never handed back).
pub(super) fn wait_out<P>(mut p: P, out: &mut [f32], wait_until: WaitUntil<P>) -> Timed<()> {
    loop {
        match wait_until(p, out, None) {
            Ok(t) => return t,
            Err(back) => p = back,
        }
    }
}

/// Waits for a share given up on at its hedge point (`p`, whose `Held` is `held(&p)`) with
/// `wait`, off the caller's thread, until its node answers or its stall deadline passes; the
/// link stays held meanwhile. The answer is dropped (the share was computed elsewhere); as every
/// answer it is recorded, so a late one clears the node's suspect mark and a stall takes the
/// node out of rotation.
pub(super) fn linger<L: Link, P: Send + 'static>(
    p: P,
    held: fn(&P) -> &Held<L>,
    wait: fn(P, &mut [f32]) -> Timed<()>,
) {
    let h = held(&p);
    let n_embd = h.s.n_embd;
    let rows = h.share.pair_idx.iter().max().map_or(0, |&m| m + 1);
    let name = format!("linger-{}", h.node().name);
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let mut scratch = vec![0.0f32; rows * n_embd];
        let _ = wait(p, &mut scratch);
    });
    if let Err(e) = spawned {
        // No thread: the share is dropped with its closure. Its request stays outstanding on
        // the node, so a region refuses a second post (the stream is used) and a data link's
        // next call reads that answer, fails on its request id and takes the node out of
        // rotation: no wrong output is ever used.
        tracing::warn!("cannot wait for a stalled call in the background: {e}");
    }
}

impl<L: Link> Drop for Held<L> {
    fn drop(&mut self) {
        self.node()
            .outstanding
            .fetch_sub(self.share.cost, Ordering::Relaxed);
        self.link.busy().store(false, Ordering::Release);
    }
}
