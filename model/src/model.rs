//! `Model`: a loaded GGUF (kept mapped), its parsed `ModelConfig`, the weight views and the
//! tokenizer. Shared read-only (`Arc<Model>`) by the engine, the in-process expert backend and the
//! CLI.

use crate::config::ModelConfig;
use crate::error::{ExpertError, ModelError};
use crate::expert::{act_type_for, ExpertWeights};
use crate::gguf::Gguf;
use crate::tokenizer::Tokenizer;
use crate::weights::{FfnWeights, Resident, Weights};
use nightshift_kernels::GgmlType;
use std::path::Path;
use std::sync::Arc;

/// Config + weights (zero-copy views into the Gguf) + tokenizer.
pub struct Model {
    // Field order matters: `weights` points into `gguf` and `resident`, so drop it first.
    weights: Weights,
    /// Copies of the dense matrices on huge pages (see `Resident`), when made.
    resident: Option<Resident>,
    config: ModelConfig,
    tokenizer: Tokenizer,
    gguf: Gguf,
}

impl Model {
    /// Opens a GGUF (or the first file of a split set) and maps every tensor the engine needs.
    pub fn load(path: &Path) -> Result<Arc<Model>, ModelError> {
        let gguf = Gguf::open(path)?;
        Model::from_gguf(gguf).map(Arc::new)
    }

    /// Builds the model from an opened file; the dense weights are copied to huge pages unless
    /// `NIGHTSHIFT_HUGE_PAGES=off` (see [`Model::resident_bytes`]).
    pub fn from_gguf(gguf: Gguf) -> Result<Model, ModelError> {
        Model::from_gguf_with(gguf, crate::weights::huge_pages_enabled())
    }

    /// [`Model::from_gguf`] with the huge-page copy of the dense weights on or off.
    pub fn from_gguf_with(gguf: Gguf, huge_pages: bool) -> Result<Model, ModelError> {
        let config = ModelConfig::from_gguf(&gguf)?;
        let mut weights = Weights::load(&gguf, &config)?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        // Dense weights on huge pages unless turned off; if the copy cannot be made they are
        // read from the file map as before (`resident_bytes` then says 0).
        let resident = if huge_pages {
            weights.make_resident(&gguf).ok()
        } else {
            None
        };
        Ok(Model {
            weights,
            resident,
            config,
            tokenizer,
            gguf,
        })
    }

    /// Bytes of dense weights copied to huge-page memory at load (0: all read from the file map;
    /// `NIGHTSHIFT_HUGE_PAGES=off` turns the copy off).
    pub fn resident_bytes(&self) -> usize {
        self.resident.as_ref().map_or(0, Resident::bytes)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    /// The weight views (for the forward pass).
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Expert `expert` of MoE layer `layer`.
    pub fn expert_weights(
        &self,
        layer: usize,
        expert: u32,
    ) -> Result<ExpertWeights<'_>, ExpertError> {
        let unknown = ExpertError::UnknownExpert { layer, expert };
        let l = self
            .weights
            .layers
            .get(layer)
            .ok_or(ExpertError::UnknownExpert { layer, expert })?;
        let FfnWeights::Moe(m) = &l.ffn else {
            return Err(unknown);
        };
        let e = expert as usize;
        if e >= m.gate_exps.ne[2] {
            return Err(unknown);
        }
        Ok(ExpertWeights {
            gate: (m.gate_exps.ty, m.gate_exps.matrix(e)),
            up: (m.up_exps.ty, m.up_exps.matrix(e)),
            down: (m.down_exps.ty, m.down_exps.matrix(e)),
            n_embd: self.config.n_embd,
            n_ff: m.gate_exps.ne[1],
        })
    }

    /// The `ActRows` type of MoE layer `layer` (None for dense layers).
    pub fn expert_act_type(&self, layer: usize) -> Option<GgmlType> {
        match &self.weights.layers.get(layer)?.ffn {
            FfnWeights::Moe(m) => Some(act_type_for(m.gate_exps.ty, m.up_exps.ty)),
            FfnWeights::Dense(_) => None,
        }
    }
}
