//! Helpers shared by the integration tests.

pub mod golden;
pub mod tile;
