//! The speculative-decoding flags `serve` and `generate` share (`--speculative`, `--draft-max`,
//! `--draft-model`) and the one place they become a scheduler [`Speculator`]: the drafter the
//! flags name, gated by the measured-cost policy.

use crate::scheduler::spec::Speculator;
use anyhow::Context;
use nightshift_model::spec::{
    ngram::NgramRange, DraftKind, DraftModel, Drafter, NgramDrafter, SuffixDrafter,
};
use nightshift_model::Model;
use std::path::PathBuf;
use std::sync::Arc;

/// Tokens of recent requests' text the suffix drafter keeps.
const SUFFIX_WINDOW: usize = 1 << 16;
/// Positions of the draft model's KV cache (shared by the sequences it drafts for).
const DRAFT_KV_TOKENS: usize = 1 << 15;

/// Speculative decoding flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: ngram (prompt lookup over the sequence), suffix (also over recent
    /// requests' text), draft (a small model, --draft-model) or off. Drafts ride only while the
    /// measured step times say they pay; the output never changes.
    #[arg(long, default_value = "ngram", value_parser = parse_kind)]
    pub speculative: SpecKind,
    /// Most draft tokens per sequence and step (the policy decides how many of them pay).
    #[arg(long, default_value_t = 16)]
    pub draft_max: usize,
    /// The draft model for --speculative draft: a small GGUF with the target's vocabulary.
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// Draft every available token whatever it costs (measuring; the policy is off).
    #[arg(long, hide = true)]
    pub speculative_always: bool,
}

/// `--speculative` (None = off).
#[derive(Clone, Copy, Debug)]
pub struct SpecKind(pub Option<DraftKind>);

fn parse_kind(s: &str) -> Result<SpecKind, String> {
    DraftKind::parse(s).map(SpecKind)
}

impl SpecArgs {
    /// The speculator the flags ask for over `target` (None when off). The draft model runs its
    /// experts in process on `pool`.
    pub fn build(
        &self,
        target: Option<&Arc<Model>>,
        pool: Option<Arc<rayon::ThreadPool>>,
    ) -> anyhow::Result<Option<Speculator>> {
        let Some(kind) = self.speculative.0 else {
            anyhow::ensure!(
                self.draft_model.is_none(),
                "--draft-model needs --speculative draft"
            );
            return Ok(None);
        };
        anyhow::ensure!(
            self.draft_max > 0,
            "--draft-max: expected at least 1, found 0"
        );
        let range = NgramRange::default();
        let drafter: Box<dyn Drafter> = match kind {
            DraftKind::Ngram => Box::new(NgramDrafter::new(range)),
            DraftKind::Suffix => Box::new(SuffixDrafter::new(SUFFIX_WINDOW, range)),
            DraftKind::Draft => {
                let path = self
                    .draft_model
                    .as_ref()
                    .context("--speculative draft needs --draft-model PATH")?;
                let target = target.context("--speculative draft needs a model to draft for")?;
                let draft = Model::load(path)
                    .with_context(|| format!("loading the draft model {}", path.display()))?;
                let pool = match pool {
                    Some(p) => p,
                    None => nightshift_model::build_pool(0)?,
                };
                let d = DraftModel::new(draft, target, pool, DRAFT_KV_TOKENS)
                    .with_context(|| format!("--draft-model {}", path.display()))?;
                Box::new(d)
            }
        };
        if kind != DraftKind::Draft {
            anyhow::ensure!(
                self.draft_model.is_none(),
                "--draft-model needs --speculative draft, found --speculative {}",
                kind.name()
            );
        }
        Ok(Some(Speculator::new(
            drafter,
            self.draft_max,
            !self.speculative_always,
        )))
    }

    /// A line for the banner.
    pub fn describe(&self) -> String {
        match self.speculative.0 {
            None => "off".into(),
            Some(k) => format!(
                "{} (up to {} draft tokens, {})",
                k.name(),
                self.draft_max,
                if self.speculative_always {
                    "always"
                } else {
                    "while measured step times say it pays"
                }
            ),
        }
    }
}
