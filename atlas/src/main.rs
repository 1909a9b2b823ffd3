//! The `nightshift-atlas` command line: report on an atlas file, plan a placement from it,
//! simulate planner quality on synthetic atlases. Subcommands that need a live engine or
//! coordinator (`record`, `apply`) are not here yet.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "nightshift-atlas",
    version,
    about = "ExpertAtlas: report, plan and simulate expert placements"
)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    Ok(())
}
