//! nightshift-atlas: the placement contract (which node holds which expert), the atlas trace
//! format and its `Recorder`, routing statistics, the placement planner and plots. The
//! coordinator and the expert node depend on this crate for `placement`; the crate itself depends
//! on no other NightShift crate, so it stays usable offline on a copied atlas file. (The package's
//! binary does: its `record` subcommand runs prompts through nightshift-model's engine.)

mod fsutil;
pub mod placement;
pub mod plan;
pub mod plots;
pub mod report;
pub mod stats;
pub mod synth;
pub mod trace;

pub use fsutil::write_atomic;
