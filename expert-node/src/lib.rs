//! nightshift-expert-node: serves one shard of a MoE model's experts over gRPC. The library holds
//! the pieces (NUMA pinning, expert store, service, framed data link, auth, TLS) so that tests drive them directly; the
//! binary wires them to the command line.

pub mod auth;
pub mod link;
pub mod numa;
mod parts;
pub mod service;
pub mod store;
pub mod tls;
