//! The subcommands of the `nightshift` binary, one module each (`Args` + `run`).

pub mod gen_model;
pub mod generate;
pub mod logits;
pub mod tokenize;
