//! `nightshift generate`: not built yet (see the model engine issue).

/// Arguments of `nightshift generate`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs the subcommand.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`nightshift generate` is not built yet")
}
