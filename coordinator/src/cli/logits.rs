//! `nightshift logits`: not built yet (see the model engine issue).

/// Arguments of `nightshift logits`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs the subcommand.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`nightshift logits` is not built yet")
}
