//! Chat templates from `tokenizer.chat_template`, rendered with minijinja (placeholder).
