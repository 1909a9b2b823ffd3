//! nightshift-coordinator as a library: the pieces of the `nightshift` binary that integration
//! tests and other commands drive directly (the expert cluster: remote backend, local launcher; the live ExpertAtlas
//! recorder).

pub mod atlas_rec;
pub mod cluster;
