//! The live ExpertAtlas recorder: `AtlasRecorder` is the engine's `RouteObserver`. It feeds every
//! MoE layer's routing into `nightshift_atlas_core::trace::Recorder` (behind a mutex; the expert ids
//! are converted into a reused scratch vector, so a call allocates nothing in steady state) and,
//! when experts run on nodes, counts the token rows each node is sent under the current placement
//! (a row goes to a node when at least one of its experts' chosen replica is there, the replica
//! `Placement::pick_replica` names; the client may pick another replica on failover). `snapshot`
//! turns it into an `Atlas`; `SnapshotWriter` writes snapshots atomically every N seconds and once
//! more when it is finished or dropped (shutdown).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use nightshift_atlas_core::placement::ModelShape;
use nightshift_atlas_core::trace::{Atlas, AtlasError, Recorder, RecorderConfig};
use nightshift_model::{ExpertPair, Model, RouteObserver};

use crate::cluster::{self, ClusterError, RemoteExperts};

/// Most nodes whose per-row load is tracked (a row's nodes are a bit mask).
const MAX_TRACKED_NODES: usize = 64;

struct Inner {
    rec: Recorder,
    /// Expert ids of the current call (reused).
    experts: Vec<usize>,
}

/// Records which experts fire (and which nodes get rows) for ExpertAtlas.
pub struct AtlasRecorder {
    inner: Mutex<Inner>,
    remote: Option<Arc<RemoteExperts>>,
    /// Calls the recorder refused (shape mismatch); should stay 0.
    rejected: AtomicU64,
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl AtlasRecorder {
    /// A recorder for `shape` with `cfg`; with `remote`, node names come from its placement.
    pub fn new(
        shape: ModelShape,
        mut cfg: RecorderConfig,
        remote: Option<Arc<RemoteExperts>>,
    ) -> AtlasRecorder {
        if let Some(r) = &remote {
            let p = r.placement();
            if p.nodes.len() <= MAX_TRACKED_NODES {
                cfg.nodes = p.nodes.iter().map(|n| n.name.clone()).collect();
            }
        }
        let cap = cfg.top_k * 4096;
        AtlasRecorder {
            inner: Mutex::new(Inner {
                rec: Recorder::new(shape, cfg),
                experts: Vec::with_capacity(cap),
            }),
            remote,
            rejected: AtomicU64::new(0),
        }
    }

    /// A recorder sized for `model` (default window and pair sketch), named `name`.
    pub fn for_model(
        model: &Model,
        name: impl Into<String>,
        remote: Option<Arc<RemoteExperts>>,
    ) -> Result<AtlasRecorder, ClusterError> {
        let shape = cluster::model_shape(model)?;
        let cfg = RecorderConfig::new(name, model.config().n_expert_used);
        Ok(AtlasRecorder::new(shape, cfg, remote))
    }

    /// The statistics so far.
    pub fn snapshot(&self) -> Atlas {
        lock(&self.inner).rec.snapshot()
    }

    /// Writes a snapshot to `path` atomically (temp file + rename).
    pub fn save(&self, path: &Path) -> Result<(), AtlasError> {
        let atlas = self.snapshot();
        atlas.save_atomic(path)
    }

    /// Calls refused because the routing did not match the model's shape (a bug if not 0).
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    fn record_nodes(&self, inner: &mut Inner, layer: usize, pairs: &[ExpertPair]) {
        let Some(remote) = &self.remote else { return };
        let p = remote.placement();
        let n_nodes = p.nodes.len();
        if n_nodes == 0 || n_nodes > MAX_TRACKED_NODES {
            return;
        }
        // Pairs are grouped by row (top-k consecutive pairs share `row`).
        let mut counts = [0u64; MAX_TRACKED_NODES];
        let mut mask = 0u64;
        let mut row = None;
        let mut flush = |mask: &mut u64| {
            let mut m = *mask;
            while m != 0 {
                let b = m.trailing_zeros() as usize;
                counts[b] += 1;
                m &= m - 1;
            }
            *mask = 0;
        };
        for pair in pairs {
            if row != Some(pair.row) {
                flush(&mut mask);
                row = Some(pair.row);
            }
            if let Some(n) = p.pick_replica(layer, pair.expert as usize, pair.row as usize) {
                mask |= 1u64 << n;
            }
        }
        flush(&mut mask);
        for (n, &c) in counts.iter().enumerate().take(n_nodes) {
            if c > 0 && inner.rec.record_node(n, c).is_err() {
                self.rejected.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl RouteObserver for AtlasRecorder {
    fn observe(&self, layer: usize, pairs: &[ExpertPair], weights: &[f32]) {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        inner.experts.clear();
        inner
            .experts
            .extend(pairs.iter().map(|p| p.expert as usize));
        if let Err(e) = inner.rec.record(layer, &inner.experts, weights) {
            if self.rejected.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(layer, error = %e, "atlas recorder refused a routing call");
            }
            return;
        }
        self.record_nodes(inner, layer, pairs);
    }
}

struct Stop {
    flag: Mutex<bool>,
    cv: Condvar,
}

/// Writes `AtlasRecorder` snapshots to a file every `every`, and once more at the end.
pub struct SnapshotWriter {
    stop: Arc<Stop>,
    handle: Option<JoinHandle<()>>,
    rec: Arc<AtlasRecorder>,
    path: PathBuf,
}

impl SnapshotWriter {
    /// Starts the background thread (first write after `every`).
    pub fn start(
        rec: Arc<AtlasRecorder>,
        path: PathBuf,
        every: Duration,
    ) -> std::io::Result<SnapshotWriter> {
        let stop = Arc::new(Stop {
            flag: Mutex::new(false),
            cv: Condvar::new(),
        });
        let (s, r, p) = (stop.clone(), rec.clone(), path.clone());
        let handle = std::thread::Builder::new()
            .name("atlas-snapshots".into())
            .spawn(move || loop {
                let guard = s.flag.lock().unwrap_or_else(|e| e.into_inner());
                let (guard, _) =
                    s.cv.wait_timeout_while(guard, every, |stopped| !*stopped)
                        .unwrap_or_else(|e| e.into_inner());
                if *guard {
                    return;
                }
                drop(guard);
                if let Err(e) = r.save(&p) {
                    tracing::warn!(error = %e, "writing the atlas snapshot failed");
                }
            })?;
        Ok(SnapshotWriter {
            stop,
            handle: Some(handle),
            rec,
            path,
        })
    }

    /// Stops the thread and writes the final snapshot.
    pub fn finish(mut self) -> Result<(), AtlasError> {
        self.stop_thread();
        self.rec.save(&self.path)
    }

    fn stop_thread(&mut self) {
        if let Some(h) = self.handle.take() {
            *self.stop.flag.lock().unwrap_or_else(|e| e.into_inner()) = true;
            self.stop.cv.notify_all();
            let _ = h.join();
        }
    }
}

impl Drop for SnapshotWriter {
    fn drop(&mut self) {
        if self.handle.is_some() {
            self.stop_thread();
            if let Err(e) = self.rec.save(&self.path) {
                tracing::warn!(error = %e, "writing the final atlas snapshot failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(rows: &[&[u32]], expect_tokens: u64, expect: &[(usize, u64)]) {
        let shape = ModelShape {
            moe_layers: vec![1, 2],
            n_experts: 4,
            expert_bytes: 1,
        };
        let rec = AtlasRecorder::new(shape, RecorderConfig::new("t", 2), None);
        for layer in [1, 2] {
            let pairs: Vec<ExpertPair> = rows
                .iter()
                .enumerate()
                .flat_map(|(r, es)| {
                    es.iter().map(move |&e| ExpertPair {
                        expert: e,
                        row: r as u32,
                    })
                })
                .collect();
            let w = vec![0.5f32; pairs.len()];
            rec.observe(layer, &pairs, &w);
        }
        let a = rec.snapshot();
        assert_eq!(a.all_time.tokens, expect_tokens);
        for &(e, c) in expect {
            assert_eq!(a.all_time.activations[0][e], c, "expert {e}");
            assert_eq!(a.all_time.activations[1][e], c, "expert {e}");
        }
        assert_eq!(rec.rejected(), 0);
    }

    #[test]
    fn counts_every_routed_pair() {
        check(&[&[0, 1], &[1, 3]], 2, &[(0, 1), (1, 2), (2, 0), (3, 1)]);
        check(&[&[2, 3]], 1, &[(2, 1), (3, 1)]);
    }

    #[test]
    fn bad_calls_are_counted_not_recorded() {
        let shape = ModelShape {
            moe_layers: vec![1],
            n_experts: 4,
            expert_bytes: 1,
        };
        let rec = AtlasRecorder::new(shape, RecorderConfig::new("t", 2), None);
        let p = [
            ExpertPair { expert: 9, row: 0 },
            ExpertPair { expert: 1, row: 0 },
        ];
        rec.observe(1, &p, &[0.5, 0.5]);
        rec.observe(7, &p[1..], &[1.0]);
        assert_eq!(rec.rejected(), 2);
        assert_eq!(rec.snapshot().all_time.tokens, 0);
    }

    #[test]
    fn writer_saves_at_finish() {
        let dir = std::env::temp_dir().join(format!("ns-atlas-rec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let path = dir.join("a.atlas");
        let shape = ModelShape {
            moe_layers: vec![0],
            n_experts: 2,
            expert_bytes: 1,
        };
        let rec = Arc::new(AtlasRecorder::new(shape, RecorderConfig::new("t", 1), None));
        let w = SnapshotWriter::start(rec.clone(), path.clone(), Duration::from_secs(3600))
            .expect("thread");
        rec.observe(0, &[ExpertPair { expert: 1, row: 0 }], &[1.0]);
        w.finish().expect("final write");
        let a = Atlas::load(&path).expect("atlas file");
        assert_eq!(a.all_time.activations[0], vec![0, 1]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
