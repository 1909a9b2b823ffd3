//! llama.cpp itself (through llama-cpp-sys-2's bindings): load a GGUF, evaluate tokens, read the
//! logits. Used by `e2e-report` (prefill/decode speed next to ours) and `llama-check` (do the
//! files `nightshift gen-model` writes load and run in llama.cpp, and do we compute the same).

use std::ffi::{c_char, c_void, CString};
use std::path::Path;

use llama_cpp_sys_2 as sys;

/// Errors from llama.cpp.
#[derive(thiserror::Error, Debug)]
pub enum LlamaError {
    #[error("llama.cpp could not load {0}")]
    Load(String),
    #[error("llama.cpp could not create a context for {0}")]
    Context(String),
    #[error("llama_decode returned {0}, expected 0")]
    Decode(i32),
    #[error("expected a path without NUL bytes, found {0}")]
    Path(String),
}

unsafe extern "C" fn quiet(_level: sys::ggml_log_level, _text: *const c_char, _user: *mut c_void) {}

/// A loaded model with one context (one sequence).
pub struct Llama {
    model: *mut sys::llama_model,
    ctx: *mut sys::llama_context,
    n_vocab: usize,
}

impl Llama {
    /// Loads `path` (mmap, CPU) with a context of `n_ctx` positions, batches of `n_batch`,
    /// `threads` threads and an F32 KV cache (as our engine and the parity fixtures use).
    pub fn load(
        path: &Path,
        n_ctx: u32,
        n_batch: u32,
        threads: i32,
        verbose: bool,
    ) -> Result<Llama, LlamaError> {
        let shown = path.display().to_string();
        let c_path = CString::new(shown.clone()).map_err(|_| LlamaError::Path(shown.clone()))?;
        // SAFETY: the llama.cpp C API used as documented in llama.h: init once, default params
        // structs by value, a NUL-terminated path; null results are checked; the context and model
        // are freed in Drop only.
        unsafe {
            if !verbose {
                sys::llama_log_set(Some(quiet), std::ptr::null_mut());
            }
            sys::llama_backend_init();
            let mut mp = sys::llama_model_default_params();
            mp.n_gpu_layers = 0;
            let model = sys::llama_model_load_from_file(c_path.as_ptr(), mp);
            if model.is_null() {
                return Err(LlamaError::Load(shown));
            }
            let mut cp = sys::llama_context_default_params();
            cp.n_ctx = n_ctx;
            cp.n_batch = n_batch;
            cp.n_ubatch = n_batch;
            cp.n_threads = threads;
            cp.n_threads_batch = threads;
            cp.type_k = 0; // GGML_TYPE_F32
            cp.type_v = 0;
            let ctx = sys::llama_init_from_model(model, cp);
            if ctx.is_null() {
                sys::llama_model_free(model);
                return Err(LlamaError::Context(shown));
            }
            let n_vocab =
                sys::llama_vocab_n_tokens(sys::llama_model_get_vocab(model)).max(0) as usize;
            Ok(Llama {
                model,
                ctx,
                n_vocab,
            })
        }
    }

    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Forgets every cached position.
    pub fn clear(&mut self) {
        // SAFETY: ctx is a live context; clearing its memory is always allowed.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ctx), true) }
    }

    /// Appends `tokens` to the sequence (positions follow the cache) in one llama_decode call.
    pub fn decode(&mut self, tokens: &[i32]) -> Result<(), LlamaError> {
        let mut toks = tokens.to_vec();
        // SAFETY: the batch borrows `toks`, which outlives the llama_decode call.
        let rc = unsafe {
            let batch = sys::llama_batch_get_one(toks.as_mut_ptr(), toks.len() as i32);
            sys::llama_decode(self.ctx, batch)
        };
        if rc != 0 {
            return Err(LlamaError::Decode(rc));
        }
        Ok(())
    }

    /// Logits after the last decoded token.
    pub fn last_logits(&self) -> Vec<f32> {
        // SAFETY: after a successful decode the last token's logits are n_vocab floats owned by
        // the context; copied out before any other call.
        unsafe {
            let p = sys::llama_get_logits_ith(self.ctx, -1);
            if p.is_null() {
                return Vec::new();
            }
            std::slice::from_raw_parts(p, self.n_vocab).to_vec()
        }
    }
}

impl Drop for Llama {
    fn drop(&mut self) {
        // SAFETY: both pointers came from llama.cpp, are non-null and are freed exactly once.
        unsafe {
            sys::llama_free(self.ctx);
            sys::llama_model_free(self.model);
        }
    }
}
