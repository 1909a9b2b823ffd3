//! Routing traces: the atlas file format (`format`) and the allocation-free `Recorder` the engine
//! feeds once per MoE layer per step (`recorder`).

mod format;
mod recorder;
#[cfg(test)]
mod tests;

pub use format::{
    Atlas, AtlasError, Counts, LayerPairs, NodeLoad, ATLAS_FORMAT_VERSION, ATLAS_MAGIC,
};
pub use recorder::{RecordError, Recorder, RecorderConfig, WINDOW_BUCKETS};
