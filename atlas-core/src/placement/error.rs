//! Errors of reading, checking and writing placement files. Each variant names the field (and,
//! for problems found while parsing, the 1-based line) so an operator can fix the file by hand.

use std::path::PathBuf;

/// A field path such as `layer[3].replicas[17]` or `node[2].name`.
pub type Field = String;

fn at(line: &Option<usize>) -> String {
    match line {
        Some(l) => format!("line {l}: "),
        None => String::new(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    #[error("cannot access placement file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("line {line}, column {column}: {message}")]
    Syntax {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{}version: expected {expected}, found {found}", at(.line))]
    UnsupportedVersion {
        expected: u32,
        found: u32,
        line: Option<usize>,
    },
    #[error("{}strategy: expected \"round-robin\", found {found:?}", at(.line))]
    UnknownStrategy { found: String, line: Option<usize> },
    #[error("{}strategy = \"round-robin\" expects no [[layer]] tables, found {found}", at(.line))]
    StrategyWithLayers { found: usize, line: Option<usize> },
    #[error("expected at least one [[node]], found none")]
    NoNodes,
    #[error("{}{field}: expected a non-empty node name without surrounding spaces, found {found:?}", at(.line))]
    BadNodeName {
        field: Field,
        found: String,
        line: Option<usize>,
    },
    #[error("{}{field}: node {name:?} listed twice (first at {first})", at(.line))]
    DuplicateNode {
        field: Field,
        name: String,
        first: Field,
        line: Option<usize>,
    },
    #[error("{}{field}: expected \"host:port\" with a port in 1..=65535, found {found:?}", at(.line))]
    BadAddr {
        field: Field,
        found: String,
        line: Option<usize>,
    },
    #[error("{}{field}: unknown node {name:?} (nodes: {known})", at(.line))]
    UnknownNode {
        field: Field,
        name: String,
        known: String,
        line: Option<usize>,
    },
    #[error("{}{field}: node {name:?} listed twice for the same expert", at(.line))]
    DuplicateReplica {
        field: Field,
        name: String,
        line: Option<usize>,
    },
    #[error("{}{field}: expected at least one node holding this expert, found none", at(.line))]
    NoReplica { field: Field, line: Option<usize> },
    #[error("{}{field}: node {name:?} is resident but is not among the expert's replicas", at(.line))]
    ResidentNotReplica {
        field: Field,
        name: String,
        line: Option<usize>,
    },
    #[error("{}layer {layer}: expected resident to list {expected} experts like replicas, found {found}", at(.line))]
    ResidentLength {
        layer: usize,
        expected: usize,
        found: usize,
        line: Option<usize>,
    },
    #[error("{}layer index: expected at most {max}, found {index}", at(.line))]
    LayerIndex {
        index: usize,
        max: usize,
        line: Option<usize>,
    },
    #[error("{}layer index {index} appears in two [[layer]] tables", at(.line))]
    DuplicateLayer { index: usize, line: Option<usize> },
    #[error("layer {index}: expected a [[layer]] table for this MoE layer, found none")]
    MissingLayer { index: usize },
    #[error("layer {index}: not a MoE layer of this model (MoE layers: {moe_layers:?})")]
    NotMoeLayer {
        index: usize,
        moe_layers: Vec<usize>,
    },
    #[error("layer {layer}: expected replicas for {expected} experts, found {found}")]
    ExpertCount {
        layer: usize,
        expected: usize,
        found: usize,
    },
    #[error(
        "node {node:?}: resident experts need {needed} bytes, capacity memory_bytes is {capacity}"
    )]
    CapacityExceeded {
        node: String,
        needed: u64,
        capacity: u64,
    },
    #[error("node {name:?} is not in the placement")]
    NoSuchNode { name: String },
    #[error(
        "round-robin placement has no layer tables yet: resolve it against the model shape first"
    )]
    Unresolved,
}
