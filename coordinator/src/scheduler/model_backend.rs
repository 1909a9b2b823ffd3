//! The adapters from `nightshift_model` to the scheduler's seams: `EngineStep` wraps the
//! multi-sequence `Engine` as a `StepEngine` (errors classified: KV full -> wait, expert
//! backend down -> HTTP 503), and `engine_with` builds the engine over the expert backend
//! that `cluster::build` chose (in process or nodes), sharing one rayon pool.

use super::backend::{AdmitError, Admitted, StepEngine, StepError};
use nightshift_model::{
    Attached, BatchToken, Engine, EngineOptions, ExpertBackend, ExpertError, KvStats, KvType,
    Model, ModelError, SeqId,
};
use std::sync::Arc;

/// `Engine` driven by the scheduler.
pub struct EngineStep {
    engine: Engine,
}

impl EngineStep {
    pub fn new(engine: Engine) -> EngineStep {
        EngineStep { engine }
    }

    /// Installs the observer told every MoE layer's routing (the ExpertAtlas recorder).
    pub fn set_route_observer(
        &mut self,
        observer: Option<Arc<dyn nightshift_model::RouteObserver>>,
    ) {
        self.engine.set_route_observer(observer);
    }
}

impl StepEngine for EngineStep {
    fn add_sequence(
        &mut self,
        prompt: &[u32],
        max_len: usize,
        reuse: bool,
    ) -> Result<Admitted, AdmitError> {
        match self.engine.admit(prompt, max_len, reuse) {
            Ok((seq, cached)) => Ok(Admitted { seq, cached }),
            Err(ModelError::KvFull(_)) => Err(AdmitError::Full),
            Err(e) => Err(AdmitError::Failed(e.to_string())),
        }
    }

    fn remove_sequence(&mut self, seq: SeqId) {
        self.engine.remove_sequence(seq);
    }

    fn attach(&mut self, seq: SeqId) -> Result<Attached, StepError> {
        self.engine.attach(seq).map_err(step_error)
    }

    fn forward(&mut self, batch: &[BatchToken]) -> Result<Vec<Vec<f32>>, StepError> {
        self.engine.forward(batch).map_err(step_error)
    }

    fn forward_drafts(
        &mut self,
        batch: &[BatchToken],
        drafts: &[(SeqId, usize)],
    ) -> Result<Vec<Vec<f32>>, StepError> {
        self.engine
            .forward_drafts(batch, drafts)
            .map_err(step_error)
    }

    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), StepError> {
        self.engine.truncate(seq, len).map_err(step_error)
    }

    fn kv_stats(&self) -> KvStats {
        self.engine.kv_stats()
    }
}

/// A failed step: expert nodes unreachable are `unavailable` (HTTP 503).
fn step_error(e: ModelError) -> StepError {
    StepError {
        unavailable: matches!(e, ModelError::Expert(ExpertError::Backend(_))),
        message: e.to_string(),
    }
}

/// Engine limits from the `serve` flags.
pub struct EngineLimits {
    pub threads: usize,
    pub max_seqs: usize,
    /// Positions the KV cache holds (from `--kv-memory`).
    pub kv_budget_tokens: usize,
    pub max_seq_len: usize,
    pub kv_type: KvType,
    pub prefix_cache: bool,
    /// The prefix cache's disk tier (`--kv-cache-dir`), if any.
    pub kv_disk: Option<nightshift_model::kv::KvDiskOptions>,
}

/// Builds an engine over any expert backend (in process or remote nodes).
pub fn engine_with(
    model: Arc<Model>,
    backend: Arc<dyn ExpertBackend>,
    pool: Arc<rayon::ThreadPool>,
    lim: &EngineLimits,
) -> Result<EngineStep, ModelError> {
    let opts = EngineOptions {
        threads: lim.threads,
        pool: Some(pool),
        max_seqs: lim.max_seqs,
        kv_budget_tokens: lim.kv_budget_tokens,
        max_seq_len: lim.max_seq_len,
        prefix_cache: lim.prefix_cache,
    };
    let mut engine = Engine::new(model, backend, opts)?;
    engine.set_kv_type(lim.kv_type)?;
    engine.set_kv_disk(lim.kv_disk.clone())?;
    Ok(EngineStep::new(engine))
}
