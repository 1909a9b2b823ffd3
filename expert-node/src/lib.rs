//! nightshift-expert-node: serves one shard of a MoE model's experts over gRPC. The library holds
//! the pieces (NUMA pinning, expert store, service) so that tests drive them directly; the binary
//! wires them to the command line.

pub mod numa;
