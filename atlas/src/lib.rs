//! nightshift-atlas: the offline ExpertAtlas tool — routing statistics, reports and plots, the
//! placement planner and synthetic atlases — over the placement contract and atlas trace format
//! of `nightshift-atlas-core` (re-exported here). The library depends on no NightShift crate but
//! that one, so it stays usable offline on a copied atlas file. (The package's binary does: its
//! `record` subcommand runs prompts through nightshift-model's engine.)

pub mod plan;
pub mod plots;
pub mod report;
pub mod split;
pub mod stats;
pub mod synth;

// The placement and atlas file formats live in nightshift-atlas-core (the runtime crates use them
// without this crate); re-exported so the planner, reports and the binary name them as before.
pub use nightshift_atlas_core::{placement, trace, write_atomic};
