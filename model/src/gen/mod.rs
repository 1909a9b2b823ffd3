//! Random-weight model generation in llama.cpp's GGUF layout (`nightshift gen-model`) (placeholder).
