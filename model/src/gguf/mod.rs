//! GGUF reader: mmap, split files, typed metadata and zero-copy tensor views (placeholder).
