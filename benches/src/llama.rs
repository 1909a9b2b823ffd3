//! llama.cpp itself (through llama-cpp-sys-2's bindings): load a GGUF, evaluate tokens, read the
//! logits, tokenize. Used by `e2e-report` (prefill/decode speed next to ours) and `llama-check`
//! (do the files `nightshift gen-model` writes load and run in llama.cpp, do we compute the same,
//! and the expected-logits fixtures of the parity tests).

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use llama_cpp_sys_2 as sys;
use nightshift_model::KvType;

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
    #[error("llama_tokenize failed on {0:?}")]
    Tokenize(String),
}

unsafe extern "C" fn quiet(_level: sys::ggml_log_level, _text: *const c_char, _user: *mut c_void) {}

/// Where [`dump_tensors`] writes, and which graph tensors.
struct Dump {
    dir: PathBuf,
    names: Vec<String>,
    seq: AtomicUsize,
}

static DUMP: OnceLock<Dump> = OnceLock::new();

/// From now on, contexts made by [`Llama::load_kv`] write every computed graph tensor whose
/// name is in `names` (ggml's names, e.g. `kv_cmpr-2`, `kqv-2`, `result_output`) to `dir` as
/// raw bytes: `NNNN-NAME.tTYPE.NE0xNE1xNE2xNE3.bin` (`NNNN` counts evaluations, `TYPE` is the
/// ggml type id; a view's bytes span its strides). For tracing a parity gap to the op that makes
/// it. Set once per process; a second call is ignored.
pub fn dump_tensors(dir: &Path, names: Vec<String>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let _ = DUMP.set(Dump {
        dir: dir.to_path_buf(),
        names,
        seq: AtomicUsize::new(0),
    });
    Ok(())
}

/// ggml's eval callback for [`dump_tensors`]: asks for the named tensors, then writes each as it
/// is computed. Always returns true (go on computing).
unsafe extern "C" fn dump_one(t: *mut sys::ggml_tensor, ask: bool, _user: *mut c_void) -> bool {
    let Some(d) = DUMP.get() else { return true };
    // SAFETY: ggml hands a live tensor whose name is a NUL-terminated array; its bytes are read
    // with ggml_backend_tensor_get into a buffer of ggml_nbytes, as ggml.h documents.
    unsafe {
        let name = CStr::from_ptr((*t).name.as_ptr()).to_string_lossy();
        let hit = d.names.iter().any(|n| *n == name);
        if ask || !hit {
            return if ask { hit } else { true };
        }
        let n = sys::ggml_nbytes(t);
        let mut buf = vec![0u8; n];
        sys::ggml_backend_tensor_get(t, buf.as_mut_ptr().cast(), 0, n);
        let ne = (*t).ne;
        let k = d.seq.fetch_add(1, Ordering::Relaxed);
        let file = format!(
            "{k:04}-{name}.t{}.{}x{}x{}x{}.bin",
            (*t).type_,
            ne[0],
            ne[1],
            ne[2],
            ne[3]
        );
        if let Err(e) = std::fs::write(d.dir.join(&file), &buf) {
            eprintln!("llama-check: cannot write {file}: {e}");
        }
    }
    true
}

/// A loaded model with one context (one sequence).
pub struct Llama {
    model: *mut sys::llama_model,
    ctx: *mut sys::llama_context,
    n_vocab: usize,
}

/// Flash attention for an F32 or F16 cache ([`Llama::load_kv`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashAttn {
    /// llama.cpp's default (`auto`).
    Default,
    /// `-fa off`.
    Off,
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
        Self::load_kv(
            path,
            n_ctx,
            n_batch,
            threads,
            verbose,
            KvType::F32,
            FlashAttn::Default,
        )
    }

    /// [`Llama::load`] with the K and V cache in `kv` (`-ctk`/`-ctv`). A Q8_0 cache turns flash
    /// attention on, as llama.cpp requires for a quantized V cache. For F32 and F16, `attn`
    /// chooses: [`FlashAttn::Default`] leaves llama.cpp's `auto` (on on CPUs: K and V then go
    /// through F16 inside ggml's flash attention, even from an F32 cache) — what a user of
    /// llama.cpp gets, for speed comparisons; [`FlashAttn::Off`] (`-fa off`) is the arithmetic
    /// our F32 and F16 caches reproduce and the parity fixtures were made with, for comparing
    /// logits.
    pub fn load_kv(
        path: &Path,
        n_ctx: u32,
        n_batch: u32,
        threads: i32,
        verbose: bool,
        kv: KvType,
        attn: FlashAttn,
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
            // ggml_type ids: GGML_TYPE_F32 0, GGML_TYPE_F16 1, GGML_TYPE_Q8_0 8
            let ty = match kv {
                KvType::F32 => 0,
                KvType::F16 => 1,
                KvType::Q8_0 => 8,
            };
            cp.type_k = ty;
            cp.type_v = ty;
            if kv == KvType::Q8_0 {
                cp.flash_attn_type = 1; // LLAMA_FLASH_ATTN_TYPE_ENABLED
            } else if attn == FlashAttn::Off {
                cp.flash_attn_type = 0; // LLAMA_FLASH_ATTN_TYPE_DISABLED
            }
            if DUMP.get().is_some() {
                cp.cb_eval = Some(dump_one);
            }
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

    /// Tokenizes `text` as llama.cpp does (`add_bos`: the vocabulary's BOS if it adds one;
    /// `special`: control-token text becomes those tokens).
    pub fn tokenize(
        &self,
        text: &str,
        add_bos: bool,
        special: bool,
    ) -> Result<Vec<i32>, LlamaError> {
        let fail = || LlamaError::Tokenize(text.to_string());
        let len = i32::try_from(text.len()).map_err(|_| fail())?;
        let mut out = vec![0i32; text.len() + 2];
        // SAFETY: `text` is `len` readable bytes (no NUL needed: the length is passed); `out`
        // has room for `out.len()` tokens, the most llama_tokenize writes; the vocab belongs to
        // the live model.
        let n = unsafe {
            sys::llama_tokenize(
                sys::llama_model_get_vocab(self.model),
                text.as_ptr() as *const c_char,
                len,
                out.as_mut_ptr(),
                out.len() as i32,
                add_bos,
                special,
            )
        };
        if n < 0 {
            return Err(fail());
        }
        out.truncate(n as usize);
        Ok(out)
    }

    /// Appends `tokens` at positions `start..` in one llama_decode call with every token's
    /// logits kept (read them with [`Llama::logits_ith`]).
    pub fn decode_all(&mut self, tokens: &[i32], start: i32) -> Result<(), LlamaError> {
        let n = tokens.len() as i32;
        // SAFETY: llama_batch_init allocates room for `n` tokens of one sequence; exactly `n`
        // entries of each array are written, and the batch is freed once after the decode.
        let rc = unsafe {
            let mut batch = sys::llama_batch_init(n, 0, 1);
            for (i, &t) in tokens.iter().enumerate() {
                *batch.token.add(i) = t;
                *batch.pos.add(i) = start + i as i32;
                *batch.n_seq_id.add(i) = 1;
                **batch.seq_id.add(i) = 0;
                *batch.logits.add(i) = 1;
            }
            batch.n_tokens = n;
            let rc = sys::llama_decode(self.ctx, batch);
            sys::llama_batch_free(batch);
            rc
        };
        if rc != 0 {
            return Err(LlamaError::Decode(rc));
        }
        Ok(())
    }

    /// Logits of output `i` of the last decode (negative: from the end).
    pub fn logits_ith(&self, i: i32) -> Vec<f32> {
        // SAFETY: after a successful decode output `i` (when it exists) is n_vocab floats owned
        // by the context, copied out before any other call; a missing one is null.
        unsafe {
            let p = sys::llama_get_logits_ith(self.ctx, i);
            if p.is_null() {
                return Vec::new();
            }
            std::slice::from_raw_parts(p, self.n_vocab).to_vec()
        }
    }

    /// Logits after the last decoded token.
    pub fn last_logits(&self) -> Vec<f32> {
        self.logits_ith(-1)
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
