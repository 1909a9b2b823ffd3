//! The engine's error types: `ModelError` for loading and running a model, `ExpertError` for the
//! expert seam (in-process or remote). Both are `thiserror` enums; messages are lower-case and say
//! what was expected and what was found.

use nightshift_kernels::KernelError;

/// Errors from loading a model or running the forward pass.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The GGUF file could not be read.
    #[error("gguf: {0}")]
    Gguf(#[from] crate::gguf::GgufError),
    /// The architecture named by `general.architecture` is not one this engine runs.
    #[error("unsupported architecture: expected qwen3moe, deepseek2, qwen3 or llama, found {0}")]
    UnsupportedArch(String),
    /// A hyper-parameter is missing or out of range.
    #[error("bad hyper-parameter {key}: {msg}")]
    Config { key: String, msg: String },
    /// A tensor is missing or has the wrong shape or type.
    #[error("tensor {name}: {msg}")]
    Tensor { name: String, msg: String },
    /// The tokenizer could not be built from the file.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    /// A kernel rejected its arguments (a bug or a malformed tensor).
    #[error("kernel: {0}")]
    Kernel(#[from] KernelError),
    /// The expert backend failed.
    #[error("experts: {0}")]
    Expert(#[from] ExpertError),
    /// The batch handed to `Engine::forward` is inconsistent.
    #[error("bad batch: {0}")]
    Batch(String),
    /// The KV cache type cannot hold this model's rows.
    #[error("kv cache type: {0}")]
    KvType(String),
    /// The KV budget or the context length would be exceeded.
    #[error("kv cache full: {0}")]
    KvFull(String),
    /// The KV cache's disk tier directory could not be opened.
    #[error("kv cache dir {}: {source}", dir.display())]
    KvDisk {
        dir: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The thread pool could not be built.
    #[error("thread pool: {0}")]
    Pool(String),
    /// The draft model cannot draft for the target (another vocabulary).
    #[error("draft model: {0}")]
    Draft(String),
}

/// Errors from computing routed experts (the `ExpertBackend` seam).
#[derive(Debug, thiserror::Error)]
pub enum ExpertError {
    /// A kernel rejected its arguments.
    #[error("kernel: {0}")]
    Kernel(#[from] KernelError),
    /// Activation rows, pairs or output do not fit together.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// The requested layer or expert does not exist or is not served here.
    #[error("unknown expert: layer {layer} expert {expert}")]
    UnknownExpert { layer: usize, expert: u32 },
    /// A remote backend failed (transport, node down, ...).
    #[error("backend: {0}")]
    Backend(String),
}

/// `e` and its causes joined with ": ", each cause only when the text so far does not already
/// say it (thiserror variants like `gguf: {0}` repeat their source, which `source()` gives again).
pub fn causes_once(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = c.source();
    }
    out
}

/// Restores the default action of SIGPIPE (Rust ignores it, so a write to a closed pipe is an
/// error and `println!` panics): a report piped into `head` ends quietly, as other tools do.
/// Only for tools whose sockets are TCP (the standard library sends with `MSG_NOSIGNAL`).
pub fn quiet_on_closed_pipe() {
    // SAFETY: setting a signal's disposition to its default installs no handler and touches no
    // memory; called at the start of main, before any thread runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The exit of a command-line tool: on error, one line `PROG: error: CAUSES` on stderr (causes
/// once each, never a backtrace, whatever `RUST_BACKTRACE` says) and a failure status.
pub fn cli_exit<E>(prog: &str, result: Result<(), E>) -> std::process::ExitCode
where
    E: AsRef<dyn std::error::Error + Send + Sync + 'static>,
{
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{prog}: error: {}", causes_once(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}
