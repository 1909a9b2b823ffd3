//! `nightshift tokenize`: not built yet (see the model engine issue).

/// Arguments of `nightshift tokenize`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs the subcommand.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`nightshift tokenize` is not built yet")
}
