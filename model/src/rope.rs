//! Rotary position embedding as ggml's CPU `rope_ext` computes it: the per-position cos/sin cache
//! (YaRN ramp between interpolation and extrapolation, magnitude scaling), then NORM (interleaved
//! pairs: deepseek2, llama) or NEOX (first half with second half: qwen3moe, qwen3) rotation of the
//! first `n_dims`, with llama 3's per-pair frequency factors when the file has them.

use crate::config::RopeConfig;

/// Precomputed YaRN constants for one rope configuration.
#[derive(Clone, Debug)]
pub struct Rope {
    cfg: RopeConfig,
    corr_dims: [f32; 2],
    theta_scale: f32,
}

fn corr_dim(n_dims: usize, n_ctx_orig: u32, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

fn ramp(low: f32, high: f32, i0: usize) -> f32 {
    let y = ((i0 / 2) as f32 - low) / (high - low).max(0.001);
    1.0 - y.clamp(0.0, 1.0).min(1.0)
}

impl Rope {
    pub fn new(cfg: &RopeConfig) -> Rope {
        let start = corr_dim(cfg.n_dims, cfg.n_ctx_orig, cfg.beta_fast, cfg.freq_base).floor();
        let end = corr_dim(cfg.n_dims, cfg.n_ctx_orig, cfg.beta_slow, cfg.freq_base).ceil();
        let corr_dims = [start.max(0.0), end.min(cfg.n_dims as f32 - 1.0)];
        let theta_scale = cfg.freq_base.powf(-2.0 / cfg.n_dims as f32);
        Rope {
            cfg: cfg.clone(),
            corr_dims,
            theta_scale,
        }
    }

    /// cos/sin pairs for position `pos` (`n_dims` floats: cos, sin, cos, sin, ...).
    pub fn cache(&self, pos: u32) -> Vec<f32> {
        let c = &self.cfg;
        let mut out = vec![0.0f32; c.n_dims];
        let mut theta = pos as f32;
        for i0 in (0..c.n_dims).step_by(2) {
            // llama 3's frequency factors divide each pair's angle (ggml_rope_cache_init)
            // (`n_dims / 2` of them, checked at load)
            let theta_extrap = match c.freq_factors.as_deref().and_then(|f| f.get(i0 / 2)) {
                Some(&ff) => theta / ff,
                None => theta,
            };
            let theta_interp = c.freq_scale * theta_extrap;
            let mut th = theta_interp;
            let mut mscale = c.attn_factor;
            if c.ext_factor != 0.0 {
                let ramp_mix = ramp(self.corr_dims[0], self.corr_dims[1], i0) * c.ext_factor;
                th = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
                mscale *= 1.0 + 0.1 * (1.0 / c.freq_scale).ln();
            }
            out[i0] = th.cos() * mscale;
            out[i0 + 1] = th.sin() * mscale;
            theta *= self.theta_scale;
        }
        out
    }

    /// Rotates the first `n_dims` values of one head in place.
    pub fn apply(&self, cache: &[f32], x: &mut [f32]) {
        let n = self.cfg.n_dims;
        if self.cfg.neox {
            let half = n / 2;
            for i0 in (0..n).step_by(2) {
                let (cos, sin) = (cache[i0], cache[i0 + 1]);
                let i = i0 / 2;
                let (x0, x1) = (x[i], x[i + half]);
                x[i] = x0 * cos - x1 * sin;
                x[i + half] = x0 * sin + x1 * cos;
            }
        } else {
            for i0 in (0..n).step_by(2) {
                let (cos, sin) = (cache[i0], cache[i0 + 1]);
                let (x0, x1) = (x[i0], x[i0 + 1]);
                x[i0] = x0 * cos - x1 * sin;
                x[i0 + 1] = x0 * sin + x1 * cos;
            }
        }
    }
}
