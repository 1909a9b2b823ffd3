//! nightshift-atlas-core: the two files the runtime shares with the offline ExpertAtlas tool —
//! the placement contract (`placement`: which node holds which expert, read by the coordinator,
//! the expert nodes and the planner) and the atlas trace format with its allocation-free
//! `Recorder` (`trace`: what the coordinator records live and the planner reads). Runtime crates
//! (coordinator, expert-node) depend on this crate only, never on `nightshift-atlas`, so they do
//! not pull in plots, an HTTP client or the planner. `size` parses the byte sizes all their
//! command lines take. No dependency on other NightShift crates.

mod fsutil;
pub mod placement;
pub mod size;
pub mod trace;

pub use fsutil::write_atomic;
