//! Tokenizer from `tokenizer.ggml.*`: byte-level BPE with llama.cpp pre-tokenizers (placeholder).
