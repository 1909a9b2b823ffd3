//! The layer call of `RemoteExperts` (its `ExpertBackend`): rounds of shares, each expert on a
//! balanced live replica (suspect nodes only when nothing else can take it), shares of nodes on
//! this machine through shared memory and the others over their streams (hedged, `hedge`), a
//! failed share retried on another replica in the next round, every node tried at most once per
//! call. `post_experts` starts the first round's stream calls on the client runtime and returns,
//! so the engine computes the shared expert meanwhile; `collect_experts` lands them and runs any
//! further rounds. Outputs come back per pair: the engine's sum is the same whatever answered.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use nightshift_atlas_core::placement::{NodeId, Placement};
use nightshift_model::{ActRows, ExpertBackend, ExpertError, ExpertPair, PostedExperts};

use super::call::Share;
use super::call::{place_rows, record_spread, Timed};
use super::hints::Hints;
use super::{
    balance, hedge, lock, net_link, shared_call, shm_link, LinkState, RemoteExperts, Shared,
};

/// A layer call's first round, out on the nodes' links and streams (`post_experts`).
struct InFlight {
    acts: Arc<ActRows>,
    pairs: Arc<Vec<ExpertPair>>,
    posted: Vec<Posted>,
    calls: Option<tokio::task::JoinHandle<Round>>,
}

/// A share out on a link whose answer the calling thread reads itself: a shared-memory region
/// (a node on this machine) or a framed data link (one across the network).
enum Posted {
    Shm(shm_link::Posted),
    Net(Box<net_link::Posted>),
}

impl Posted {
    /// Posts `share` on its node's shared-memory region, else on a free data link, else gives
    /// it back for the stream.
    fn post(
        s: &Arc<Shared>,
        layer: usize,
        acts: &ActRows,
        pairs: &[ExpertPair],
        share: Share,
    ) -> Result<Posted, Share> {
        shm_link::post(s, layer, acts, pairs, share, 0, 0)
            .map(Posted::Shm)
            .or_else(|share| net_link::post(s, layer, acts, pairs, share).map(Posted::Net))
    }

    fn share(&self) -> &Share {
        match self {
            Posted::Shm(p) => &p.share,
            Posted::Net(p) => &p.share,
        }
    }

    fn hedge_point(&self) -> Option<Instant> {
        match self {
            Posted::Shm(p) => p.hedge_point(),
            Posted::Net(p) => p.hedge_point(),
        }
    }

    fn wait_until(self, out: &mut [f32], at: Option<Instant>) -> Result<Timed<()>, Posted> {
        match self {
            Posted::Shm(p) => shm_link::wait_until(p, out, at).map_err(Posted::Shm),
            Posted::Net(p) => net_link::wait_until(p, out, at).map_err(Posted::Net),
        }
    }

    fn wait(self, out: &mut [f32]) -> Timed<()> {
        match self {
            Posted::Shm(p) => shm_link::wait(p, out),
            Posted::Net(p) => net_link::wait(p, out),
        }
    }

    fn linger(self) {
        match self {
            Posted::Shm(p) => shm_link::linger(p),
            Posted::Net(p) => net_link::linger(p),
        }
    }

    fn waited(&self) -> std::time::Duration {
        match self {
            Posted::Shm(p) => p.waited(),
            Posted::Net(p) => p.waited(),
        }
    }
}

/// A first round already out: its stream calls as answered and its shares on links.
type FirstRound = (Vec<Timed<Vec<u8>>>, Vec<Posted>);

/// A round of stream calls as answered: each share's outcome and time, and when the last one
/// was in (`monotonic_ns`).
type Round = (Vec<Timed<Vec<u8>>>, u64);

/// Records how long a round took from its last answer to the engine's thread (`lands_us`).
fn record_land(s: &Shared, done_ns: u64) {
    let us = nightshift_proto::monotonic_ns().saturating_sub(done_ns) / 1000;
    let mut st = lock(&s.stats);
    if st.lands_us.len() < 1 << 20 {
        st.lands_us.push(us.min(u32::MAX as u64) as u32);
    }
}

/// The stream calls of one round, side by side, each with the time its answer took.
async fn stream_round(
    s: Arc<Shared>,
    placement: Arc<Placement>,
    layer: usize,
    acts: Arc<ActRows>,
    pairs: Arc<Vec<ExpertPair>>,
    shares: Vec<Share>,
) -> Round {
    let calls = shares.into_iter().map(|sh| {
        let call = hedge::hedged_call(
            s.clone(),
            placement.clone(),
            layer,
            acts.clone(),
            pairs.clone(),
            sh,
        );
        async move {
            let started = Instant::now();
            let r = call.await;
            (r, started.elapsed())
        }
    });
    let timed = futures::future::join_all(calls).await;
    (timed, nightshift_proto::monotonic_ns())
}

impl RemoteExperts {
    /// Assigns every pair to a live replica not in `exclude[expert]`, balancing estimated work
    /// (rows) over the nodes with the work already in flight as a bias (`balance::plan`), all
    /// rows of one expert to the same node (so they form one GEMM there).
    fn assign(
        &self,
        layer: usize,
        pairs: &[ExpertPair],
        todo: &[usize],
        exclude: &HashMap<u32, Vec<NodeId>>,
    ) -> Result<Vec<Share>, ExpertError> {
        let placement = self.placement();
        let up: Vec<bool> = self
            .shared
            .nodes
            .iter()
            .map(|n| matches!(&*lock(&n.state), LinkState::Up(_)))
            .collect();
        let bias: Vec<usize> = self
            .shared
            .nodes
            .iter()
            .map(|n| n.outstanding.load(Ordering::Relaxed))
            .collect();
        // Suspect nodes get work only when no other replica can take it.
        let trusted: Vec<bool> = up
            .iter()
            .zip(&self.shared.nodes)
            .map(|(&u, n)| u && !n.suspect.load(Ordering::Acquire))
            .collect();
        let replicas = |e: u32| placement.replicas(layer, e as usize);
        let planned = balance::plan(pairs, todo, replicas, &trusted, &bias, exclude)
            .or_else(|_| balance::plan(pairs, todo, replicas, &up, &bias, exclude))
            .map_err(|balance::NoLiveReplica { expert: e }| {
            let names: Vec<String> = placement
                .replicas(layer, e as usize)
                .iter()
                .filter_map(|&n| self.shared.nodes.get(n))
                .map(|n| format!("{} ({})", n.name, n.addr))
                .collect();
            ExpertError::Backend(format!(
                "no live replica for layer {layer} expert {e}: replicas {names:?} are down or failed"
            ))
        })?;
        Ok(planned
            .into_iter()
            .map(|p| Share {
                node: p.node,
                pair_idx: p.pair_idx,
                cost: p.cost,
                hint: None,
            })
            .collect())
    }

    /// Runs `fut` on the client runtime and waits for it. Outside any runtime (the engine's pool
    /// worker) this thread drives it itself and the connection tasks wake it directly: one
    /// hand-off per layer call fewer than spawning it and waiting on a channel, which is what a
    /// thread inside another runtime (where `block_on` would panic) still does.
    fn drive<F>(&self, fut: F) -> Result<F::Output, ExpertError>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        if tokio::runtime::Handle::try_current().is_err() {
            return Ok(self.rt().block_on(fut));
        }
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        self.rt().spawn(async move {
            let _ = done_tx.send(fut.await);
        });
        done_rx
            .recv()
            .map_err(|_| ExpertError::Backend("expert client runtime stopped".into()))
    }

    /// Lands the rounds of a layer call into `out` until every pair of `todo` is answered:
    /// `first` (a round already sent, `post_experts`) and then new rounds, each retrying the
    /// pairs whose node failed on another replica. The call's prefetch `hints` not sent yet
    /// ride with the first new round's requests, or go alone.
    #[allow(clippy::too_many_arguments)]
    fn rounds(
        &self,
        layer: usize,
        acts: &Arc<ActRows>,
        pairs: &Arc<Vec<ExpertPair>>,
        mut todo: Vec<usize>,
        mut exclude: HashMap<u32, Vec<NodeId>>,
        mut last_errors: Vec<String>,
        mut first: Option<FirstRound>,
        mut hints: Option<Hints>,
        out: &mut [f32],
    ) -> Result<(), ExpertError> {
        let n_embd = self.shared.n_embd;
        let placement = self.placement();
        // Each round retries failed shares on other replicas; a node is tried at most once per call.
        for _round in 0..=self.shared.nodes.len() + 1 {
            let (timed, posted) = match first.take() {
                Some(f) => f,
                None => {
                    if todo.is_empty() {
                        if let Some(h) = &mut hints {
                            h.send_rest(&self.shared, acts);
                        }
                        return Ok(());
                    }
                    let mut shares =
                        self.assign(layer, pairs, &todo, &exclude)
                            .map_err(|e| match e {
                                ExpertError::Backend(m) if !last_errors.is_empty() => {
                                    ExpertError::Backend(format!(
                                        "{m}; last errors: {}",
                                        last_errors.join("; ")
                                    ))
                                }
                                other => other,
                            })?;
                    let mut hints = hints.take();
                    if let Some(h) = &mut hints {
                        h.attach(&self.shared, &mut shares);
                    }
                    // Shares on links (shared memory, data links) are posted first, so they
                    // compute while the stream calls go out, and collected last.
                    let mut posted = Vec::new();
                    let mut streamed = Vec::new();
                    for sh in shares {
                        match Posted::post(&self.shared, layer, acts, pairs, sh) {
                            Ok(p) => posted.push(p),
                            Err(sh) => streamed.push(sh),
                        }
                    }
                    if let Some(h) = &mut hints {
                        h.send_rest(&self.shared, acts);
                    }
                    let timed = if streamed.is_empty() {
                        Vec::new()
                    } else {
                        let (timed, done_ns) = self.drive(stream_round(
                            self.shared.clone(),
                            placement.clone(),
                            layer,
                            acts.clone(),
                            pairs.clone(),
                            streamed,
                        ))?;
                        record_land(&self.shared, done_ns);
                        timed
                    };
                    (timed, posted)
                }
            };
            // Stream outputs are copied into place here, the links' by `wait` itself.
            let mut landed: Vec<Timed<()>> = timed
                .into_iter()
                .map(|((share, result), took)| {
                    let placed =
                        result.map(|bytes| place_rows(&share.pair_idx, &bytes, n_embd, out));
                    ((share, placed), took)
                })
                .collect();
            // A share still unanswered at its hedge point goes to another replica in the next
            // round when one exists (its node suspect, its region left to `linger`), else it
            // waits for its stall deadline.
            let mut hedged = Vec::new();
            for p in posted {
                let at = p.hedge_point();
                match p.wait_until(out, at) {
                    Ok(t) => landed.push(t),
                    Err(p) => {
                        let node = p.share().node;
                        hedge::mark_slow(&self.shared, node, layer, p.waited());
                        let alternatives = hedge::alternatives(
                            &self.shared,
                            &placement,
                            layer,
                            pairs,
                            &p.share().pair_idx,
                            node,
                        );
                        if alternatives.is_empty() {
                            landed.push(p.wait(out));
                        } else {
                            hedge::count_hedge(&self.shared, node);
                            hedged.push(p.share().clone());
                            p.linger();
                        }
                    }
                }
            }
            record_spread(&self.shared, &landed);
            todo.clear();
            // a hedged or failed share's pairs go again, never to its node
            let mut again = |node: usize, pair_idx: &[usize]| {
                for &pi in pair_idx {
                    exclude.entry(pairs[pi].expert).or_default().push(node);
                }
                todo.extend_from_slice(pair_idx);
            };
            for share in hedged {
                again(share.node, &share.pair_idx);
            }
            for ((share, result), _) in landed {
                if let Err(e) = result {
                    let name = &self.shared.nodes[share.node].name;
                    tracing::warn!(node = %name, layer, "layer call failed, retrying on another replica: {e}");
                    last_errors.push(format!("{name}: {e}"));
                    again(share.node, &share.pair_idx);
                }
            }
            todo.sort_unstable();
        }
        if todo.is_empty() {
            return Ok(());
        }
        Err(ExpertError::Backend(format!(
            "layer {layer}: every replica failed: {}",
            last_errors.join("; ")
        )))
    }

    fn check_out(&self, pairs: usize, out: &[f32]) -> Result<(), ExpertError> {
        let n_embd = self.shared.n_embd;
        if out.len() != pairs * n_embd {
            return Err(ExpertError::Shape(format!(
                "expected an output of {} floats, found {}",
                pairs * n_embd,
                out.len()
            )));
        }
        Ok(())
    }
}

impl ExpertBackend for RemoteExperts {
    fn run_experts(
        &self,
        layer: usize,
        acts: &ActRows,
        pairs: &[ExpertPair],
        out: &mut [f32],
    ) -> Result<(), ExpertError> {
        self.check_out(pairs.len(), out)?;
        let acts = Arc::new(acts.clone());
        let pairs_arc = Arc::new(pairs.to_vec());
        let mut todo: Vec<usize> = (0..pairs.len()).collect();
        let mut exclude: HashMap<u32, Vec<NodeId>> = HashMap::new();
        let mut last_errors: Vec<String> = Vec::new();
        let placement = self.placement();
        let mut hints = Hints::predict(&self.shared, &placement, layer, &acts);
        if let Some(round) = shared_call::run(
            &self.shared,
            &placement,
            layer,
            &acts,
            pairs,
            &todo,
            hints.as_mut(),
            out,
        ) {
            for (node, e) in round.failed {
                let name = &self.shared.nodes[node].name;
                tracing::warn!(node = %name, layer, "shared layer call failed, retrying its rest on other replicas: {e}");
                last_errors.push(format!("{name}: {e}"));
                for &pi in &round.missing {
                    exclude.entry(pairs[pi].expert).or_default().push(node);
                }
            }
            for node in round.hedged {
                for &pi in &round.missing {
                    exclude.entry(pairs[pi].expert).or_default().push(node);
                }
            }
            todo = round.missing;
        }
        self.rounds(
            layer,
            &acts,
            &pairs_arc,
            todo,
            exclude,
            last_errors,
            None,
            hints,
            out,
        )
    }

    /// Nodes reached over streams only: a call can be out while the engine computes. With a
    /// shared-memory link the call stays whole (`run_experts`), as its wait is this thread's.
    fn overlaps(&self) -> bool {
        self.shared.opts.overlap
            && self.shared.nodes.iter().all(|n| match &*lock(&n.state) {
                LinkState::Up(c) => c.shm.is_none(),
                LinkState::Down { .. } => true,
            })
    }

    fn micro_batches(&self) -> bool {
        self.shared.opts.micro_batches
    }

    fn overlap_always(&self) -> bool {
        self.shared.opts.overlap_always
    }

    fn post_experts(
        &self,
        layer: usize,
        acts: &ActRows,
        pairs: &[ExpertPair],
    ) -> Result<PostedExperts, ExpertError> {
        let acts = Arc::new(acts.clone());
        let pairs = Arc::new(pairs.to_vec());
        let todo: Vec<usize> = (0..pairs.len()).collect();
        let mut shares = self.assign(layer, &pairs, &todo, &HashMap::new())?;
        if let Some(mut h) = Hints::predict(&self.shared, &self.placement(), layer, &acts) {
            h.attach(&self.shared, &mut shares);
            h.send_rest(&self.shared, &acts);
        }
        // Shares on data links are written here and read in `collect_experts`; the rest go
        // out on the streams from the client runtime meanwhile.
        let mut posted = Vec::new();
        let mut streamed = Vec::new();
        for sh in shares {
            match net_link::post(&self.shared, layer, &acts, &pairs, sh) {
                Ok(p) => posted.push(Posted::Net(p)),
                Err(sh) => streamed.push(sh),
            }
        }
        let calls = (!streamed.is_empty()).then(|| {
            self.rt().spawn(stream_round(
                self.shared.clone(),
                self.placement(),
                layer,
                acts.clone(),
                pairs.clone(),
                streamed,
            ))
        });
        Ok(PostedExperts {
            layer,
            state: Box::new(InFlight {
                acts,
                pairs,
                posted,
                calls,
            }),
        })
    }

    fn collect_experts(&self, posted: PostedExperts, out: &mut [f32]) -> Result<(), ExpertError> {
        let layer = posted.layer;
        let Ok(call) = posted.state.downcast::<InFlight>() else {
            return Err(ExpertError::Backend(
                "expected a layer call posted by the remote backend, found another's".into(),
            ));
        };
        let InFlight {
            acts,
            pairs,
            posted,
            calls,
        } = *call;
        self.check_out(pairs.len(), out)?;
        let first = match calls {
            Some(calls) => {
                let (first, done_ns) = self
                    .drive(calls)?
                    .map_err(|e| ExpertError::Backend(format!("expert client task failed: {e}")))?;
                record_land(&self.shared, done_ns);
                first
            }
            None => Vec::new(),
        };
        self.rounds(
            layer,
            &acts,
            &pairs,
            Vec::new(),
            HashMap::new(),
            Vec::new(),
            Some((first, posted)),
            None,
            out,
        )
    }
}
