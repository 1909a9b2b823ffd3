//! `Model`: a loaded GGUF (kept mapped), its parsed `ModelConfig`, the weight views and the
//! tokenizer. Shared read-only (`Arc<Model>`) by the engine, the in-process expert backend and the
//! CLI.

use crate::config::ModelConfig;
use crate::error::{ExpertError, ModelError};
use crate::expert::{act_type_for, ExpertWeights};
use crate::gguf::Gguf;
use crate::tokenizer::Tokenizer;
use crate::weights::{ExpertMemory, FfnWeights, Resident, Weights};
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

/// How [`Model::load_with`] places the weights in memory.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Copy the dense weights to transparent huge pages (default: unless
    /// `NIGHTSHIFT_HUGE_PAGES=off`).
    pub huge_pages: bool,
    /// Where the routed experts live; `Mapped` when nodes compute them.
    pub experts: ExpertMemory,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            huge_pages: crate::weights::huge_pages_enabled(),
            experts: ExpertMemory::Auto,
        }
    }
}

impl Model {
    /// Opens a GGUF (or the first file of a split set) and maps every tensor the engine needs,
    /// with the default [`LoadOptions`] (dense weights on huge pages, experts too when they fit).
    pub fn load(path: &Path) -> Result<Arc<Model>, ModelError> {
        Model::load_with(path, LoadOptions::default())
    }

    /// [`Model::load`] with explicit options.
    pub fn load_with(path: &Path, opts: LoadOptions) -> Result<Arc<Model>, ModelError> {
        let gguf = Gguf::open(path)?;
        Model::from_gguf_opts(gguf, opts).map(Arc::new)
    }

    /// Builds the model from an opened file with the default [`LoadOptions`].
    pub fn from_gguf(gguf: Gguf) -> Result<Model, ModelError> {
        Model::from_gguf_opts(gguf, LoadOptions::default())
    }

    /// [`Model::from_gguf`] with every copy on (dense weights and, when they fit, experts on
    /// huge pages) or off (everything read from the file map).
    pub fn from_gguf_with(gguf: Gguf, huge_pages: bool) -> Result<Model, ModelError> {
        let experts = if huge_pages {
            ExpertMemory::Auto
        } else {
            ExpertMemory::Mapped
        };
        Model::from_gguf_opts(
            gguf,
            LoadOptions {
                huge_pages,
                experts,
            },
        )
    }

    /// Builds the model from an opened file with explicit options.
    pub fn from_gguf_opts(gguf: Gguf, opts: LoadOptions) -> Result<Model, ModelError> {
        let config = ModelConfig::from_gguf(&gguf)?;
        let mut weights = Weights::load(&gguf, &config)?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        let experts = match opts.experts {
            ExpertMemory::Mapped => false,
            ExpertMemory::Resident => true,
            ExpertMemory::Auto => crate::weights::fits_in_memory(weights.expert_bytes()),
        };
        // Dense weights (and experts) on huge pages unless turned off; if the copy cannot be
        // made they are read from the file map as before (`resident_bytes` then says 0).
        let resident = if opts.huge_pages {
            weights.make_resident(&gguf, experts).ok()
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

    /// Bytes of weights copied to huge pages at load: the dense weights, plus the routed experts
    /// when they were made resident (0: all read from the file map; `NIGHTSHIFT_HUGE_PAGES=off`
    /// turns the copy off).
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
        ExpertWeights::new(
            m.gate_exps.matrix(e)?,
            m.up_exps.matrix(e)?,
            m.down_exps.matrix(e)?,
        )
    }

    /// The `ActRows` type of MoE layer `layer` (None for dense layers).
    pub fn expert_act_type(&self, layer: usize) -> Option<GgmlType> {
        match &self.weights.layers.get(layer)?.ffn {
            FfnWeights::Moe(m) => Some(act_type_for(m.gate_exps.ty, m.up_exps.ty)),
            FfnWeights::Dense(_) => None,
        }
    }
}
