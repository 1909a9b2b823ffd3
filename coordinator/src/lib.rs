//! nightshift-coordinator: everything the `nightshift` binary runs, as a library so that tests
//! drive each piece directly — the subcommands (`cli`), the OpenAI-compatible gateway
//! (`gateway::router(state)`, driven in process with `tower::ServiceExt::oneshot` or over
//! loopback), the continuous-batching scheduler, the expert cluster (remote backend, local
//! launcher, live rebalance) and the live ExpertAtlas recorder. `main.rs` only parses the command
//! line.

pub mod atlas_rec;
pub mod cli;
pub mod cluster;
pub mod gateway;
pub mod plan;
pub mod scheduler;
