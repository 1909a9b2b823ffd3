//! The subcommands of the `nightshift` binary, one module each (`Args` + `run`).

pub mod bench_agent;
pub mod bench_serve;
pub mod bench_spec;
pub mod gen_model;
pub mod generate;
pub mod logits;
pub mod plan_cluster;
pub mod serve;
pub mod spec_args;
pub mod tokenize;
