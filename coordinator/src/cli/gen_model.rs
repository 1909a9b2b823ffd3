//! `nightshift gen-model`: not built yet (see the model engine issue).

/// Arguments of `nightshift gen-model`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs the subcommand.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`nightshift gen-model` is not built yet")
}
