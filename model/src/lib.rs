//! nightshift-model: reads GGUF files (mmap, split files), tokenizes, renders chat templates and
//! runs the qwen3moe and deepseek2 (Kimi K2 / DeepSeek-V3) forward pass exactly as llama.cpp does.
//! The `ExpertBackend` seam lets the MoE layers run in process or on remote expert nodes.

pub mod chat;
pub mod gen;
pub mod gguf;
pub mod tokenizer;
