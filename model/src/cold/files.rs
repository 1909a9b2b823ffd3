//! Where the staging cache reads an expert from ([`ExpertFiles`]): its three matrices' byte
//! ranges in a mapped model's files, aligned for `O_DIRECT`.

use super::ALIGN;
use crate::error::ExpertError;
use crate::expert::ExpertWeights;
use crate::gguf::Gguf;
use crate::model::Model;

/// Where the cache reads cold experts from: a mapped model whose experts' matrices are views
/// into its files ([`Gguf::file_span`] finds them there).
pub trait ExpertFiles: Send + Sync {
    /// The mapped model.
    fn gguf(&self) -> &Gguf;
    /// The mapped views of expert `e` of layer `layer`.
    fn expert_weights(&self, layer: usize, e: u32) -> Result<ExpertWeights<'_>, ExpertError>;
}

impl ExpertFiles for Model {
    fn gguf(&self) -> &Gguf {
        Model::gguf(self)
    }

    fn expert_weights(&self, layer: usize, e: u32) -> Result<ExpertWeights<'_>, ExpertError> {
        Model::expert_weights(self, layer, e)
    }
}

/// An expert node's model: experts straight from the map ([`ExpertWeights::from_gguf`]).
impl ExpertFiles for Gguf {
    fn gguf(&self) -> &Gguf {
        self
    }

    fn expert_weights(&self, layer: usize, e: u32) -> Result<ExpertWeights<'_>, ExpertError> {
        ExpertWeights::from_gguf(self, layer, e as usize)
    }
}

/// One matrix of an expert: (file index, aligned file offset, aligned length, offset of the
/// matrix in the aligned span, matrix length).
pub(super) type Span = (usize, u64, u64, usize, usize);

/// Where expert `e` of `layer`'s three matrices are in the model's files, aligned.
pub(super) fn expert_spans(
    files: &dyn ExpertFiles,
    layer: usize,
    e: u32,
) -> Result<[Span; 3], ExpertError> {
    let w = files.expert_weights(layer, e)?;
    let g = files.gguf();
    let span = |m: &[u8]| -> Result<Span, ExpertError> {
        let (file, off) = g.file_span(m).ok_or_else(|| {
            ExpertError::Backend(format!(
                "cold cache: layer {layer} expert {e} is not in the model's files"
            ))
        })?;
        let start = off / ALIGN * ALIGN;
        let end = (off + m.len() as u64).div_ceil(ALIGN) * ALIGN;
        Ok((file, start, end - start, (off - start) as usize, m.len()))
    };
    Ok([
        span(w.gate.bytes())?,
        span(w.up.bytes())?,
        span(w.down.bytes())?,
    ])
}

/// Experts each token is routed to in a MoE layer (`<arch>.expert_used_count`; 0 when absent).
pub(super) fn n_expert_used(g: &Gguf) -> usize {
    let key = g.arch().map(|a| format!("{a}.expert_used_count"));
    key.ok()
        .and_then(|k| g.metadata().get_u32(&k).ok().flatten())
        .map_or(0, |n| n as usize)
}

/// Bytes expert `e` of `layer` takes in the cache (its aligned spans).
pub(super) fn footprint(files: &dyn ExpertFiles, layer: usize, e: u32) -> Result<u64, ExpertError> {
    Ok(expert_spans(files, layer, e)?.iter().map(|s| s.2).sum())
}
