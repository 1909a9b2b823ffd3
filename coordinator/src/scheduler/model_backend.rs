//! The adapters from `nightshift_model` to the scheduler's seams: `EngineStep` wraps the
//! multi-sequence `Engine` as a `StepEngine` (errors classified: KV full -> wait, expert
//! backend down -> HTTP 503), and `engine_with` builds the engine over the expert backend
//! that `cluster::build` chose (in process or nodes), sharing one rayon pool.

use super::backend::{AdmitError, SeqHandle, StepEngine, StepError, StepToken};
use nightshift_model::{
    BatchToken, Engine, EngineOptions, ExpertBackend, ExpertError, Model, ModelError, SeqId,
};
use std::sync::Arc;

/// `Engine` driven by the scheduler.
pub struct EngineStep {
    engine: Engine,
    batch: Vec<BatchToken>,
}

impl EngineStep {
    pub fn new(engine: Engine) -> EngineStep {
        EngineStep {
            engine,
            batch: Vec::new(),
        }
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
    fn add_sequence(&mut self) -> Result<SeqHandle, AdmitError> {
        match self.engine.add_sequence() {
            Ok(s) => Ok(s.0 as SeqHandle),
            Err(ModelError::KvFull(_)) => Err(AdmitError::Full),
            Err(e) => Err(AdmitError::Failed(e.to_string())),
        }
    }

    fn remove_sequence(&mut self, seq: SeqHandle) {
        self.engine.remove_sequence(SeqId(seq as u32));
    }

    fn forward(&mut self, batch: &[StepToken]) -> Result<Vec<Vec<f32>>, StepError> {
        self.batch.clear();
        self.batch.extend(batch.iter().map(|t| BatchToken {
            seq: SeqId(t.seq as u32),
            token: t.token,
            pos: t.pos,
            want_logits: t.want_logits,
        }));
        self.engine.forward(&self.batch).map_err(|e| StepError {
            unavailable: matches!(e, ModelError::Expert(ExpertError::Backend(_))),
            message: e.to_string(),
        })
    }
}

/// Engine limits from the `serve` flags.
pub struct EngineLimits {
    pub threads: usize,
    pub max_seqs: usize,
    pub kv_budget_tokens: usize,
    pub max_seq_len: usize,
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
    };
    Engine::new(model, backend, opts).map(EngineStep::new)
}
