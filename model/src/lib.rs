//! nightshift-model: reads GGUF files (mmap, split files), tokenizes, renders chat templates and
//! runs the qwen3moe and deepseek2 (Kimi K2 / DeepSeek-V3) forward pass, and the dense qwen3 and
//! llama ones (draft models), exactly as llama.cpp does. The `ExpertBackend` seam lets the MoE
//! layers run in process or on remote expert nodes.

pub mod arch;
pub mod attention;
pub mod chat;
pub mod cold;
pub mod config;
pub mod constrain;
pub mod engine;
pub mod error;
pub mod expert;
pub mod gen;
pub mod gguf;
pub mod hot;
pub mod kv;
mod lanes;
pub mod model;
pub mod moe;
pub mod ops;
pub mod prefetch;
pub mod reasoning;
pub mod resident;
pub mod rope;
pub mod sampler;
pub mod shape;
pub mod spec;
pub mod tokenizer;
pub mod toolcall;
pub mod weights;

pub use config::{Arch, ModelConfig};
pub use engine::{build_pool, BatchToken, Engine, EngineOptions, SeqId, StepProfile};
pub use error::{ExpertError, ModelError};
pub use expert::{
    expert_ffn, ActRows, ExpertBackend, ExpertPair, ExpertWeights, LocalExperts, PostedExperts,
};
pub use kv::{Attached, KvLayout, KvStats, KvType};
pub use model::{LoadOptions, Model};
pub use moe::RouteObserver;
pub use sampler::{Sampler, SamplerParams};
pub use weights::ExpertMemory;
