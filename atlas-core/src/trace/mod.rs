//! Routing traces: the atlas file format (`format`) and the allocation-free `Recorder` the engine
//! feeds once per MoE layer per step (`recorder`), and temporal locality counts (`temporal`).

mod format;
mod recorder;
mod temporal;
#[cfg(test)]
mod tests;

pub use format::{
    Atlas, AtlasError, Counts, LayerPairs, NodeLoad, ATLAS_FORMAT_VERSION, ATLAS_MAGIC,
};
pub use recorder::{RecordError, Recorder, RecorderConfig, WINDOW_BUCKETS};
pub use temporal::{Temporal, TemporalTracker, LOCALITY_WINDOW, TRACE_TOKENS};
