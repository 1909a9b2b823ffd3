//! Zero-copy views of the model's tensors (`W`) grouped per layer as the architectures need
//! them (GQA attention for qwen3moe, qwen3 and llama; MLA for deepseek2). A `W` points into the `Gguf`'s mapped bytes, which the owning `Model` keeps alive and never
//! mutates; small vectors (norms, biases) are copied to `Vec<f32>` at load time.

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::gguf::Gguf;
use nightshift_kernels::{dequantize_row, GgmlType, KernelError, PackedF32, QMatrix};

/// A borrowed byte range of the model file. Valid while the `Gguf` it came from is alive.
#[derive(Clone, Copy)]
struct RawBytes {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are immutable (a read-only mapping or buffer owned by the `Gguf`) and the
// `Model` owning both the `Gguf` and every `W` keeps them alive; sharing reads across threads is fine.
unsafe impl Send for RawBytes {}
// SAFETY: see `Send`: shared immutable data.
unsafe impl Sync for RawBytes {}

/// One weight tensor: type, shape in ggml order (`ne[0]` = row length) and its bytes.
pub struct W {
    pub name: String,
    pub ty: GgmlType,
    /// [row length, rows, matrices]; missing trailing dims are 1.
    pub ne: [usize; 3],
    data: RawBytes,
}

impl W {
    /// The tensor's bytes.
    pub fn data(&self) -> &[u8] {
        // SAFETY: `ptr`/`len` came from `Gguf::tensor_data` of the `Gguf` owned by the same
        // `Model` as this `W`; that memory is neither freed nor mutated while the model lives.
        unsafe { std::slice::from_raw_parts(self.data.ptr, self.data.len) }
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.data.len / (self.ne[1] * self.ne[2]).max(1)
    }

    /// Matrix `i` (an expert, or a head of `attn_k_b`/`attn_v_b`): `ne[1]` rows of `ne[0]`.
    pub fn matrix(&self, i: usize) -> Result<QMatrix<'_>, KernelError> {
        let (rows, per) = (self.ne[1], self.row_bytes() * self.ne[1]);
        let bytes = i
            .checked_add(1)
            .and_then(|end| self.data().get(i * per..end * per))
            .ok_or(KernelError::Rows {
                start: i.saturating_mul(rows),
                end: i.saturating_add(1).saturating_mul(rows),
                rows: rows * self.ne[2],
            })?;
        QMatrix::new(self.ty, rows, self.ne[0], bytes)
    }

    /// The whole tensor dequantized to f32 (norm weights, biases).
    pub fn to_f32(&self) -> Result<Vec<f32>, ModelError> {
        let n = self.ne[0] * self.ne[1] * self.ne[2];
        let mut out = vec![0.0f32; n];
        let rb = self.row_bytes();
        for (r, dst) in out.chunks_mut(self.ne[0]).enumerate() {
            dequantize_row(self.ty, &self.data()[r * rb..(r + 1) * rb], dst)?;
        }
        Ok(out)
    }
}

pub(crate) fn tensor_err(name: &str, msg: String) -> ModelError {
    ModelError::Tensor {
        name: name.to_string(),
        msg,
    }
}

/// Looks a tensor up and checks its shape (`expect` in ggml order, trailing 1s optional).
pub fn load_w(g: &Gguf, name: &str, expect: &[usize]) -> Result<W, ModelError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| tensor_err(name, "expected the tensor, found nothing".into()))?;
    let mut ne = [1usize; 3];
    if t.dims.len() > 3 || t.dims.is_empty() {
        return Err(tensor_err(
            name,
            format!("expected 1 to 3 dims, found {:?}", t.dims),
        ));
    }
    for (i, &d) in t.dims.iter().enumerate() {
        ne[i] = d as usize;
    }
    let mut want = [1usize; 3];
    want[..expect.len()].copy_from_slice(expect);
    if ne != want {
        return Err(tensor_err(
            name,
            format!("expected shape {want:?}, found {ne:?}"),
        ));
    }
    let data = g.tensor_data(t);
    let rb =
        t.ty.row_bytes(ne[0])
            .map_err(|e| tensor_err(name, format!("{e}")))?;
    if data.len() != rb * ne[1] * ne[2] {
        return Err(tensor_err(
            name,
            format!(
                "expected {} bytes, found {}",
                rb * ne[1] * ne[2],
                data.len()
            ),
        ));
    }
    Ok(W {
        name: name.to_string(),
        ty: t.ty,
        ne,
        data: RawBytes {
            ptr: data.as_ptr(),
            len: data.len(),
        },
    })
}

pub(crate) fn load_vec(g: &Gguf, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
    load_w(g, name, &[n])?.to_f32()
}

/// A typed error when the file has the optional tensor `name`, which the forward pass does not
/// use (a bias): running without it would silently compute another model.
pub(crate) fn no_bias(g: &Gguf, name: &str) -> Result<(), ModelError> {
    match g.tensor(name) {
        Some(_) => Err(tensor_err(
            name,
            "expected no such bias (not supported), found one".into(),
        )),
        None => Ok(()),
    }
}

/// Attention weights.
pub enum AttnWeights {
    /// qwen3moe, qwen3, llama: grouped-query attention, with per-head q/k norms (the qwen3
    /// archs; llama has none).
    Gqa {
        q: W,
        k: W,
        v: W,
        o: W,
        q_norm: Option<Vec<f32>>,
        k_norm: Option<Vec<f32>>,
    },
    /// deepseek2: multi-head latent attention, `attn_k_b`/`attn_v_b` absorbed.
    Mla {
        /// Either (q_a, q_a_norm, q_b) or a plain q.
        q_a: Option<(W, Vec<f32>)>,
        q_b: W,
        kv_a_mqa: W,
        kv_a_norm: Vec<f32>,
        k_b: W,
        v_b: W,
        o: W,
    },
}

/// A dense SwiGLU FFN (every layer of qwen3 and llama, deepseek2's leading layers and shared
/// experts).
pub struct DenseFfn {
    pub gate: W,
    pub up: W,
    pub down: W,
}

/// Routed experts of one MoE layer.
pub struct MoeWeights {
    pub gate_inp: W,
    /// `gate_inp` repacked for SIMD when it is F32 (always, in llama.cpp's quant mixes): same
    /// bits as the plain F32 matmul, several times faster (the router runs for every token).
    pub gate_inp_packed: Option<PackedF32>,
    pub exp_probs_b: Option<Vec<f32>>,
    pub gate_exps: W,
    pub up_exps: W,
    pub down_exps: W,
    pub shared: Option<DenseFfn>,
}

/// The FFN part of a layer (one per layer: the size difference does not matter).
#[allow(clippy::large_enum_variant)]
pub enum FfnWeights {
    Dense(DenseFfn),
    Moe(MoeWeights),
}

/// One transformer block.
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub attn: AttnWeights,
    pub ffn_norm: Vec<f32>,
    pub ffn: FfnWeights,
}

/// All weights of the model.
pub struct Weights {
    pub token_embd: W,
    pub output_norm: Vec<f32>,
    pub output: W,
    pub layers: Vec<LayerWeights>,
}

impl Weights {
    /// Maps every tensor the forward pass uses, checking shapes against `c`.
    pub fn load(g: &Gguf, c: &ModelConfig) -> Result<Weights, ModelError> {
        let e = c.n_embd;
        let token_embd = load_w(g, "token_embd.weight", &[e, c.n_vocab])?;
        let output_norm = load_vec(g, "output_norm.weight", e)?;
        let output = if g.tensor("output.weight").is_some() {
            load_w(g, "output.weight", &[e, c.n_vocab])?
        } else {
            load_w(g, "token_embd.weight", &[e, c.n_vocab])?
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let p = |s: &str| format!("blk.{il}.{s}");
            let attn = c.arch.spec().attn_weights(g, c, il)?;
            let ffn = if c.is_moe_layer(il) {
                let f = c.n_ff_exp;
                let n = c.n_expert;
                let shared = if c.n_expert_shared > 0 {
                    let fs = f * c.n_expert_shared;
                    Some(DenseFfn {
                        gate: load_w(g, &p("ffn_gate_shexp.weight"), &[e, fs])?,
                        up: load_w(g, &p("ffn_up_shexp.weight"), &[e, fs])?,
                        down: load_w(g, &p("ffn_down_shexp.weight"), &[fs, e])?,
                    })
                } else {
                    None
                };
                let exp_probs_b = if g.tensor(&p("exp_probs_b.bias")).is_some() {
                    Some(load_vec(g, &p("exp_probs_b.bias"), n)?)
                } else {
                    None
                };
                let gate_inp = load_w(g, &p("ffn_gate_inp.weight"), &[e, n])?;
                let gate_inp_packed = if gate_inp.ty == GgmlType::F32 {
                    let packed = PackedF32::pack(gate_inp.matrix(0)?.bytes(), n, e)?;
                    // the packed copy replaces the mapped pages just read
                    g.release_mapped(gate_inp.data());
                    Some(packed)
                } else {
                    None
                };
                FfnWeights::Moe(MoeWeights {
                    gate_inp,
                    gate_inp_packed,
                    exp_probs_b,
                    gate_exps: load_w(g, &p("ffn_gate_exps.weight"), &[e, f, n])?,
                    up_exps: load_w(g, &p("ffn_up_exps.weight"), &[e, f, n])?,
                    down_exps: load_w(g, &p("ffn_down_exps.weight"), &[f, e, n])?,
                    shared,
                })
            } else {
                let f = c.n_ff_dense;
                for b in ["ffn_gate", "ffn_up", "ffn_down"] {
                    no_bias(g, &p(&format!("{b}.bias")))?;
                }
                FfnWeights::Dense(DenseFfn {
                    gate: load_w(g, &p("ffn_gate.weight"), &[e, f])?,
                    up: load_w(g, &p("ffn_up.weight"), &[e, f])?,
                    down: load_w(g, &p("ffn_down.weight"), &[f, e])?,
                })
            };
            layers.push(LayerWeights {
                attn_norm: load_vec(g, &p("attn_norm.weight"), e)?,
                attn,
                ffn_norm: load_vec(g, &p("ffn_norm.weight"), e)?,
                ffn,
            });
        }
        Ok(Weights {
            token_embd,
            output_norm,
            output,
            layers,
        })
    }
}

/// Copies of the dense weights (attention projections, the output head, dense FFN layers and
/// shared experts: every matrix read whole for every token), and of the routed experts when this
/// process computes them and they fit ([`ExpertMemory`]), in one anonymous mapping advised to
/// use transparent huge pages. Streaming them then walks 2 MiB pages instead of 4 KiB file pages:
/// `stream-report --huge-pages` measured Q3_K 43.7 -> 37.2 ms, Q6_K 35.1 -> 33.5 ms, Q2_K 46.1 ->
/// 44.6 ms per 768 MiB at batch 1; the experts of the Q2_K benchmark model on huge pages took
/// its decode from 59-66% to 74-81% of the roofline. Experts served by nodes stay mapped (the
/// coordinator's memory does not grow with them), and so does `token_embd` (only the rows of
/// the batch's tokens are read).
/// The file pages the copies came from are released from this process's page tables.
pub struct Resident {
    _map: memmap2::MmapMut,
    bytes: usize,
}

impl Resident {
    /// Bytes copied.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Alignment of each copy (a cache line: the kernels' blocks are read from any offset anyway).
const RESIDENT_ALIGN: usize = 64;
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// Whether weight copies go on transparent huge pages (`NIGHTSHIFT_HUGE_PAGES=off` or `0`: no).
pub fn huge_pages_enabled() -> bool {
    !matches!(
        std::env::var("NIGHTSHIFT_HUGE_PAGES").as_deref(),
        Ok("off") | Ok("0")
    )
}

/// An anonymous mapping with room for `len` bytes starting on a 2 MiB boundary (the returned
/// offset), advised to use transparent huge pages when [`huge_pages_enabled`]. The advice is best
/// effort: without THP the bytes live on 4 KiB pages. Shared by the coordinator's dense copy and
/// the expert nodes' resident arenas.
pub fn huge_page_map(len: usize) -> std::io::Result<(memmap2::MmapMut, usize)> {
    let map = memmap2::MmapOptions::new()
        .len(len + HUGE_PAGE)
        .map_anon()?;
    #[cfg(target_os = "linux")]
    if huge_pages_enabled() {
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    let base = map.as_ptr() as usize;
    Ok((map, base.div_ceil(HUGE_PAGE) * HUGE_PAGE - base))
}

/// Where a process keeps the routed experts it computes itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpertMemory {
    /// Read from the file map (4 KiB page-cache pages, shared with other processes).
    Mapped,
    /// Copied to huge pages with the dense weights, their file pages released.
    Resident,
    /// Resident when all of them take at most half of the memory available now, else mapped.
    #[default]
    Auto,
}

/// Memory this process can still take, in bytes: `MemAvailable` of `/proc/meminfo`, or less
/// when the process's memory cgroup (v1 or v2) has a limit closer than that (None where
/// neither can be read).
pub fn mem_available() -> Option<u64> {
    let host = (|| {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib.saturating_mul(1024))
    })();
    match (host, cgroup_headroom()) {
        (Some(h), Some(c)) => Some(h.min(c)),
        (h, c) => h.or(c),
    }
}

/// What the memory cgroup of this process still allows: its limit less what it holds, page
/// cache excepted (the kernel reclaims it before the limit bites); None without a limit.
fn cgroup_headroom() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read_u64 = |p: &std::path::Path| -> Option<u64> {
        std::fs::read_to_string(p).ok()?.trim().parse().ok()
    };
    let stat = |p: &std::path::Path, key: &str| -> u64 {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            })
            .unwrap_or(0)
    };
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        let (limit, used, cache) = if ctrl.split(',').any(|c| c == "memory") {
            let dir = std::path::Path::new("/sys/fs/cgroup/memory").join(rel);
            (
                read_u64(&dir.join("memory.limit_in_bytes")),
                read_u64(&dir.join("memory.usage_in_bytes")),
                stat(&dir.join("memory.stat"), "total_cache "),
            )
        } else if ctrl.is_empty() {
            let dir = std::path::Path::new("/sys/fs/cgroup").join(rel);
            (
                read_u64(&dir.join("memory.max")),
                read_u64(&dir.join("memory.current")),
                stat(&dir.join("memory.stat"), "file "),
            )
        } else {
            continue;
        };
        // v1 reports "no limit" as a number near 2^63, v2 as "max" (not a number)
        if let (Some(limit), Some(used)) = (limit, used) {
            if limit < 1 << 60 {
                return Some(limit.saturating_sub(used.saturating_sub(cache)));
            }
        }
    }
    None
}

/// Whether `bytes` more of anonymous memory take at most half of what is available now.
pub fn fits_in_memory(bytes: u64) -> bool {
    mem_available().is_some_and(|avail| bytes <= avail / 2)
}

impl Weights {
    /// Bytes of every routed expert matrix.
    pub fn expert_bytes(&self) -> u64 {
        self.layers
            .iter()
            .filter_map(|l| match &l.ffn {
                FfnWeights::Moe(m) => {
                    Some((m.gate_exps.data.len + m.up_exps.data.len + m.down_exps.data.len) as u64)
                }
                FfnWeights::Dense(_) => None,
            })
            .sum()
    }

    /// Every dense matrix of the model (not `token_embd`), and the routed experts' with
    /// `experts`.
    fn dense_mut(&mut self, experts: bool) -> Vec<&mut W> {
        let mut v: Vec<&mut W> = vec![&mut self.output];
        for l in &mut self.layers {
            match &mut l.attn {
                AttnWeights::Gqa { q, k, v: vw, o, .. } => v.extend([q, k, vw, o]),
                AttnWeights::Mla {
                    q_a,
                    q_b,
                    kv_a_mqa,
                    k_b,
                    v_b,
                    o,
                    ..
                } => {
                    if let Some((qa, _)) = q_a {
                        v.push(qa);
                    }
                    v.extend([q_b, kv_a_mqa, k_b, v_b, o]);
                }
            }
            match &mut l.ffn {
                FfnWeights::Dense(d) => v.extend([&mut d.gate, &mut d.up, &mut d.down]),
                FfnWeights::Moe(m) => {
                    if let Some(d) = &mut m.shared {
                        v.extend([&mut d.gate, &mut d.up, &mut d.down]);
                    }
                    if experts {
                        v.extend([&mut m.gate_exps, &mut m.up_exps, &mut m.down_exps]);
                    }
                }
            }
        }
        v
    }

    /// Copies the dense matrices (and the routed experts' with `experts`) into a
    /// huge-page-advised anonymous mapping and points their views at the copies (same bytes, so
    /// the same results); each copy's file pages are released right after it is made. On an
    /// error (the mapping cannot be made) the views stay on the file map.
    pub fn make_resident(&mut self, g: &Gguf, experts: bool) -> std::io::Result<Resident> {
        let mut ws = self.dense_mut(experts);
        let total: usize = ws
            .iter()
            .map(|w| w.data.len.div_ceil(RESIDENT_ALIGN) * RESIDENT_ALIGN)
            .sum();
        let (mut map, start) = huge_page_map(total)?;
        let mut at = start;
        for w in ws.iter_mut() {
            let len = w.data.len;
            map[at..at + len].copy_from_slice(w.data());
            g.release_mapped(w.data());
            w.data = RawBytes {
                ptr: map[at..].as_ptr(),
                len,
            };
            at += len.div_ceil(RESIDENT_ALIGN) * RESIDENT_ALIGN;
        }
        Ok(Resident {
            _map: map,
            bytes: total,
        })
    }
}
