//! Skewed routing for generated models (`gen-model --routing-skew published`): weights drawn so
//! that recorded traffic looks like the published measurements of real MoE models instead of
//! random weights' uniform routing.
//!
//! The targets (issue 22): per MoE layer the hottest 50% of experts take ~75% of activations;
//! ~45% of a token's experts were also chosen by the previous token and ~80% by one of the 8
//! previous tokens; hot sets differ between layers. A per-expert bias alone gives the first
//! (and nothing else): tokens drawn independently from a skewed distribution share only ~8% of
//! their experts with the previous token. Locality needs a part of the router's input that is
//! *persistent across positions*, and the only path between positions is attention. So:
//!
//! 1. **A reserved subspace of the residual stream.** Every token embedding gets a constant
//!    channel 0 (the embedding scale) and zeros on the "topic" channels `1..=M` (M = 64, at most a
//!    quarter of the width); the other channels stay random. Nothing but step 2 writes the topic
//!    channels with any weight (every other branch adds O(1) noise against the residual's O(200)
//!    scale, the reason the fixtures scale embeddings by 200).
//! 2. **A topic state, written by layer 0's attention.** Its queries read only the constant
//!    channel (plus a small `query` share of the token), so every position asks the same question
//!    and the scores depend on the keys: each head attends mostly to the few most "salient" tokens
//!    of the context so far (score spread `salience`, in units of the softmax scale). The head
//!    outputs (those tokens' random values) are written by the output projection into the topic
//!    channels with gain = the embedding scale. The result is a per-sequence state of fixed size
//!    that changes when a more salient token arrives (each of the heads separately) and drifts a
//!    little with the query share: a topic. qwen3moe's queries use only the lowest-frequency
//!    rope pairs (rotation below 1e-3 rad over thousands of positions, so salience does not depend
//!    on distance), and the q-norm weight carries the sharpness; deepseek2's queries are the
//!    no-rope part of MLA (`attn_q_b`'s rope rows are zero), `attn_q_a` reading the constant
//!    channel.
//! 3. **Routers drawn against what the file's text actually produces**, by a second pass
//!    (`calibrate.rs`) once the file is written: it runs the file's engine over calibration
//!    prompts, measures per MoE layer the topic channels' mean, covariance and autocorrelation
//!    and the token channels' size, and writes router rows (and deepseek2's `exp_probs_b`, the
//!    real models' per-expert selection offset) whose logits split their variance into a
//!    static, a topic and a token share as `skew_model` derives them from the published
//!    statistics. Draws are per layer, so hot sets and topic preferences differ between layers.
//!    The first pass leaves the routers as random draws.
//!
//! Uniform routing (the default) leaves every tensor exactly as before: parity fixtures and
//! cached files are unchanged.

use std::str::FromStr;

use super::layout::{Dims, EMBD_SCALE};
use super::rng::SplitMix64;
use super::{Arch, GenError};

/// How routers are drawn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RoutingSkew {
    /// i.i.d. random routers: every expert equally likely, no locality (the fixtures' weights).
    #[default]
    Uniform,
    /// The published statistics of the issue (module doc).
    Published,
}

impl RoutingSkew {
    pub fn name(self) -> &'static str {
        match self {
            RoutingSkew::Uniform => "uniform",
            RoutingSkew::Published => "published",
        }
    }
}

impl FromStr for RoutingSkew {
    type Err = GenError;
    fn from_str(s: &str) -> Result<Self, GenError> {
        match s {
            "uniform" => Ok(RoutingSkew::Uniform),
            "published" => Ok(RoutingSkew::Published),
            _ => Err(GenError::Spec(format!(
                "expected routing skew uniform or published, found `{s}`"
            ))),
        }
    }
}

/// The knobs of the construction (module doc).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SkewParams {
    /// spread of a calibrated router logit (softmax / sigmoid temperature; selection does not
    /// depend on it, the routing weights do)
    pub scale: f64,
    /// spread of layer 0's attention scores over the context's tokens
    pub salience: f32,
    /// share of the token in layer 0's queries (0: every position asks the same question)
    pub query: f32,
}

impl SkewParams {
    /// The constants for `arch` (the dense archs have no router: `Shaper::new` refuses them;
    /// they get qwen3moe's). deepseek2's logits stay small so that the sigmoid is nearly linear
    /// and its `exp_probs_b` adds to them as a logit would.
    pub fn published(arch: Arch) -> SkewParams {
        match arch {
            Arch::Qwen3Moe | Arch::Qwen3 | Arch::Llama => SkewParams {
                scale: 3.0,
                salience: 4.0,
                query: 0.15,
            },
            Arch::Deepseek2 => SkewParams {
                scale: 0.4,
                salience: 4.0,
                query: 0.15,
            },
        }
    }
}

/// Rewrites the rows of the tensors the construction shapes (module doc); built once per file.
#[derive(Clone, Debug)]
pub struct Shaper {
    arch: Arch,
    p: SkewParams,
    /// topic channels are `1..=m`
    m: usize,
    embd: usize,
    /// qwen3moe: head size (rows of attn_q per head)
    head_dim: usize,
    /// deepseek2: q_b rows per head and how many of them are the no-rope part
    q_head: usize,
    nope: usize,
    /// deepseek2: q_nope gain that gives scores of spread `salience`
    q_nope_gain: f32,
}

/// What the shaper does to one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Embedding,
    /// layer 0 queries (qwen3moe attn_q, deepseek2 attn_q_a)
    Query,
    /// qwen3moe layer 0 attn_q_norm
    QueryNorm,
    /// deepseek2 layer 0 attn_q_b
    QueryB,
    /// layer 0 attn_output
    Output,
}

impl Shaper {
    /// The shaper for a model, or None for uniform routing (nothing is rewritten).
    pub fn new(dims: &Dims, skew: RoutingSkew) -> Result<Option<Shaper>, GenError> {
        if skew == RoutingSkew::Uniform {
            return Ok(None);
        }
        if matches!(dims.arch, Arch::Qwen3 | Arch::Llama) {
            return Err(GenError::Spec(format!(
                "skewed routing needs an MoE architecture (qwen3moe or deepseek2), found {}",
                dims.arch.name()
            )));
        }
        let embd = dims.embd as usize;
        if embd < 16 {
            return Err(GenError::Spec(format!(
                "skewed routing needs an embedding of at least 16, found {embd}"
            )));
        }
        let m = (embd / 4).min(64);
        let p = SkewParams::published(dims.arch);
        // deepseek2 scores: q_nope (entries ~ gain) through k_b (1/sqrt(nope) per entry) against
        // c_kv (RMS 1 over kv_lora), times kq_scale (mscale^2 / sqrt(nope + rope), as
        // config.rs computes it for YaRN).
        let q_nope_gain = if dims.arch == Arch::Deepseek2 {
            let ln = if dims.yarn_factor > 1.0 {
                dims.yarn_factor.ln()
            } else {
                0.0
            };
            let mscale = (1.0 + 0.1 * ln) * (1.0 + 0.1 * dims.yarn_log_mul * ln);
            let kq = mscale * mscale / ((dims.nope + dims.rope) as f32).sqrt();
            p.salience / ((dims.kv_lora as f32).sqrt() * kq)
        } else {
            0.0
        };
        Ok(Some(Shaper {
            arch: dims.arch,
            p,
            m,
            embd,
            head_dim: dims.head_dim as usize,
            q_head: (dims.nope + dims.rope) as usize,
            nope: dims.nope as usize,
            q_nope_gain,
        }))
    }

    fn role(&self, name: &str) -> Option<Role> {
        if name == "token_embd.weight" {
            return Some(Role::Embedding);
        }
        let rest = name.strip_prefix("blk.")?;
        let (layer, t) = rest.split_once('.')?;
        match (layer == "0", t, self.arch) {
            (true, "attn_q.weight", Arch::Qwen3Moe) => Some(Role::Query),
            (true, "attn_q_norm.weight", Arch::Qwen3Moe) => Some(Role::QueryNorm),
            (true, "attn_q_a.weight", Arch::Deepseek2) => Some(Role::Query),
            (true, "attn_q_b.weight", Arch::Deepseek2) => Some(Role::QueryB),
            (true, "attn_output.weight", _) => Some(Role::Output),
            _ => None,
        }
    }

    /// Whether the low-frequency rope pair `d` of a qwen3moe head (neox pairs `i`, `i + hd/2`)
    /// carries the query: the top eighth of pair indices.
    fn slow_rope_dim(&self, d: usize) -> bool {
        let half = (self.head_dim / 2).max(1);
        d % half >= half - (half / 4).max(1)
    }

    /// Rewrites row `row` of tensor `name` in place (`vals`: the row's default draw; `r`: the
    /// row's generator, positioned after that draw). Rows of other tensors are left alone.
    pub fn shape_row(&self, name: &str, row: u64, vals: &mut [f32], r: &mut SplitMix64) {
        let Some(role) = self.role(name) else { return };
        let m = self.m;
        let k = vals.len();
        let p = &self.p;
        match role {
            Role::Embedding => {
                if k == self.embd {
                    vals[0] = EMBD_SCALE;
                    vals[1..=m].fill(0.0);
                }
            }
            Role::Query => {
                // qwen3moe attn_q: only the slow rope dims of every head; deepseek2 attn_q_a:
                // every row (the rope part is cut in attn_q_b).
                let live = match self.arch {
                    Arch::Deepseek2 => true,
                    Arch::Qwen3Moe | Arch::Qwen3 | Arch::Llama => {
                        self.slow_rope_dim(row as usize % self.head_dim.max(1))
                    }
                };
                if !live {
                    vals.fill(0.0);
                    return;
                }
                let token = p.query / (k as f32).sqrt();
                for v in vals.iter_mut() {
                    *v = token * r.gaussian();
                }
                vals[0] = r.gaussian();
                vals[1..=m.min(k - 1)].fill(0.0);
            }
            Role::QueryNorm => {
                // after q-norm the live dims (a quarter of the head) have RMS 2 against keys of
                // RMS 1: scores have spread 1 x this weight
                for (d, v) in vals.iter_mut().enumerate() {
                    if self.slow_rope_dim(d) {
                        *v = p.salience;
                    }
                }
            }
            Role::QueryB => {
                if (row as usize % self.q_head.max(1)) >= self.nope {
                    vals.fill(0.0);
                } else {
                    let g = self.q_nope_gain / (k as f32).sqrt();
                    for v in vals.iter_mut() {
                        *v = g * r.gaussian();
                    }
                }
            }
            Role::Output => {
                let row = row as usize;
                if (1..=m).contains(&row) {
                    let g = EMBD_SCALE / (k as f32).sqrt();
                    for v in vals.iter_mut() {
                        *v = g * r.gaussian();
                    }
                }
            }
        }
    }

    /// The topic channels are `1..=topic_channels()`.
    pub fn topic_channels(&self) -> usize {
        self.m
    }

    pub fn params(&self) -> &SkewParams {
        &self.p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{GenSpec, Preset, QuantMix};

    fn shaper(arch: Arch) -> Shaper {
        let spec = GenSpec::new(Preset::Tiny, arch, QuantMix::Q4KM);
        let dims = Dims::from_spec(&spec).unwrap();
        Shaper::new(&dims, RoutingSkew::Published).unwrap().unwrap()
    }

    #[test]
    fn uniform_shapes_nothing() {
        let spec = GenSpec::new(Preset::Tiny, Arch::Qwen3Moe, QuantMix::Q4KM);
        let dims = Dims::from_spec(&spec).unwrap();
        assert!(Shaper::new(&dims, RoutingSkew::Uniform).unwrap().is_none());
        assert_eq!(
            "published".parse::<RoutingSkew>().unwrap(),
            RoutingSkew::Published
        );
        assert!("zipf".parse::<RoutingSkew>().is_err());
    }

    #[test]
    fn embedding_reserves_the_constant_and_topic_channels() {
        let s = shaper(Arch::Qwen3Moe);
        let mut v = vec![5.0f32; 256];
        s.shape_row("token_embd.weight", 3, &mut v, &mut SplitMix64::new(1));
        assert_eq!(v[0], EMBD_SCALE);
        assert!(v[1..=64].iter().all(|&x| x == 0.0));
        assert!(v[65..].iter().all(|&x| x == 5.0));
        // other tensors are untouched
        let mut w = vec![5.0f32; 256];
        s.shape_row("blk.1.attn_q.weight", 0, &mut w, &mut SplitMix64::new(1));
        assert!(w.iter().all(|&x| x == 5.0));
    }

    #[test]
    fn qwen_queries_use_only_slow_rope_pairs() {
        let s = shaper(Arch::Qwen3Moe);
        // tiny: head_dim 64, pairs (i, i + 32), slow = i in 24..32
        for d in 0..64 {
            let mut v = vec![1.0f32; 256];
            s.shape_row(
                "blk.0.attn_q.weight",
                64 + d,
                &mut v,
                &mut SplitMix64::new(d),
            );
            let live = (24..32).contains(&(d % 32));
            assert_eq!(v.iter().any(|&x| x != 0.0), live, "dim {d}");
            if live {
                // the constant channel and the token's channels, never the topic channels
                assert!(v[0] != 0.0 && v[1..=64].iter().all(|&x| x == 0.0));
            }
        }
    }

    #[test]
    fn deepseek_cuts_the_rope_part_of_queries_and_leaves_biases() {
        let s = shaper(Arch::Deepseek2);
        // tiny: nope 64, rope 32 per head
        let mut v = vec![1.0f32; 128];
        s.shape_row(
            "blk.0.attn_q_b.weight",
            96 + 70,
            &mut v,
            &mut SplitMix64::new(2),
        );
        assert!(v.iter().all(|&x| x == 0.0));
        s.shape_row(
            "blk.0.attn_q_b.weight",
            96 + 10,
            &mut v,
            &mut SplitMix64::new(2),
        );
        assert!(v.iter().any(|&x| x != 0.0));
        // routers and biases are the calibration pass's (calibrate.rs)
        let mut b = vec![0.5f32; 16];
        s.shape_row("blk.1.exp_probs_b.bias", 0, &mut b, &mut SplitMix64::new(3));
        assert!(b.iter().all(|&x| x == 0.5));
    }
}
