//! The placement file format (TOML, version 1) and its structural checks:
//!
//! ```toml
//! version = 1
//! # strategy = "round-robin"    # no [[layer]] tables: expert e of every MoE layer -> node e % N
//! [[node]]
//! name = "node0"                 # unique, non-empty
//! addr = "127.0.0.1:50051"       # optional host:port the coordinator dials
//! numa = 0                       # optional NUMA node to pin to
//! memory_bytes = 0               # optional capacity for resident expert weights (0 = unlimited)
//! cores = 16                     # optional, informational
//! [[layer]]
//! index = 1                      # MoE layer index
//! replicas = [["node0"], ["node1", "node0"]]   # replicas[e] = nodes holding expert e
//! resident = [["node0"], ["node1"]]            # optional, resident[e] ⊆ replicas[e]; default all
//! ```
//!
//! Unknown keys are rejected (a typo must not silently change a placement). Errors carry the line
//! through `toml::Spanned`. Checks that need the model's shape live in `Placement::validate`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::{
    LayerPlacement, NodeId, NodeSpec, Placement, PlacementError, Strategy, MAX_LAYER_INDEX,
    PLACEMENT_VERSION,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileIn {
    version: Spanned<u32>,
    strategy: Option<Spanned<String>>,
    #[serde(default)]
    node: Vec<NodeIn>,
    #[serde(default)]
    layer: Vec<LayerIn>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeIn {
    name: Spanned<String>,
    addr: Option<Spanned<String>>,
    numa: Option<u32>,
    #[serde(default)]
    memory_bytes: u64,
    cores: Option<u32>,
}

type NameLists = Vec<Spanned<Vec<Spanned<String>>>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LayerIn {
    index: Spanned<usize>,
    replicas: Spanned<NameLists>,
    resident: Option<Spanned<NameLists>>,
}

#[derive(Serialize)]
struct FileOut<'a> {
    version: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    strategy: Option<&'a str>,
    node: Vec<NodeOut<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    layer: Vec<LayerOut<'a>>,
}

#[derive(Serialize)]
struct NodeOut<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    addr: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    numa: Option<u32>,
    memory_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cores: Option<u32>,
}

#[derive(Serialize)]
struct LayerOut<'a> {
    index: usize,
    replicas: Vec<Vec<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resident: Option<Vec<Vec<&'a str>>>,
}

/// 1-based line of byte offset `pos` in `text`.
fn line_of(text: &str, pos: usize) -> usize {
    let end = pos.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

fn column_of(text: &str, pos: usize) -> usize {
    let end = pos.min(text.len());
    let start = text.as_bytes()[..end]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |p| p + 1);
    text[start..end].chars().count() + 1
}

fn is_good_name(name: &str) -> bool {
    !name.is_empty() && name.trim() == name && !name.chars().any(char::is_control)
}

fn is_good_addr(addr: &str) -> bool {
    match addr.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty()
                && !host.contains(char::is_whitespace)
                && port.parse::<u16>().is_ok_and(|p| p > 0)
        }
        None => false,
    }
}

pub(super) fn parse(text: &str) -> Result<Placement, PlacementError> {
    let file: FileIn = toml::from_str(text).map_err(|e| syntax(text, &e))?;
    let line = |span: std::ops::Range<usize>| Some(line_of(text, span.start));

    if *file.version.get_ref() != PLACEMENT_VERSION {
        return Err(PlacementError::UnsupportedVersion {
            expected: PLACEMENT_VERSION,
            found: *file.version.get_ref(),
            line: line(file.version.span()),
        });
    }
    let strategy = match &file.strategy {
        None => Strategy::Explicit,
        Some(s) if s.get_ref() == "round-robin" => Strategy::RoundRobin,
        Some(s) => {
            return Err(PlacementError::UnknownStrategy {
                found: s.get_ref().clone(),
                line: line(s.span()),
            })
        }
    };

    let (nodes, names) = nodes_from(text, &file.node)?;
    if nodes.is_empty() {
        return Err(PlacementError::NoNodes);
    }
    if strategy == Strategy::RoundRobin {
        if let Some(l) = file.layer.first() {
            return Err(PlacementError::StrategyWithLayers {
                found: file.layer.len(),
                line: line(l.index.span()),
            });
        }
        return Ok(Placement::assemble(nodes, strategy, Vec::new()));
    }
    // No strategy and no layer tables means round-robin too (the contract's default).
    if file.layer.is_empty() {
        return Ok(Placement::assemble(nodes, Strategy::RoundRobin, Vec::new()));
    }

    let known = || {
        nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let resolve_lists =
        |lists: &NameLists, what: &str, index: usize| -> Result<Vec<Vec<NodeId>>, PlacementError> {
            let mut out = Vec::with_capacity(lists.len());
            for (e, list) in lists.iter().enumerate() {
                let field = format!("layer[{index}].{what}[{e}]");
                if what == "replicas" && list.get_ref().is_empty() {
                    return Err(PlacementError::NoReplica {
                        field,
                        line: line(list.span()),
                    });
                }
                let mut ids = Vec::with_capacity(list.get_ref().len());
                for name in list.get_ref() {
                    let Some(&id) = names.get(name.get_ref()) else {
                        return Err(PlacementError::UnknownNode {
                            field,
                            name: name.get_ref().clone(),
                            known: known(),
                            line: line(name.span()),
                        });
                    };
                    if ids.contains(&id) {
                        return Err(PlacementError::DuplicateReplica {
                            field,
                            name: name.get_ref().clone(),
                            line: line(name.span()),
                        });
                    }
                    ids.push(id);
                }
                out.push(ids);
            }
            Ok(out)
        };

    let mut layers = Vec::with_capacity(file.layer.len());
    let mut seen = BTreeSet::new();
    for l in &file.layer {
        let index = *l.index.get_ref();
        if index > MAX_LAYER_INDEX {
            return Err(PlacementError::LayerIndex {
                index,
                max: MAX_LAYER_INDEX,
                line: line(l.index.span()),
            });
        }
        if !seen.insert(index) {
            return Err(PlacementError::DuplicateLayer {
                index,
                line: line(l.index.span()),
            });
        }
        let replicas = resolve_lists(l.replicas.get_ref(), "replicas", index)?;
        let resident = match &l.resident {
            None => replicas.clone(),
            Some(r) => {
                if r.get_ref().len() != replicas.len() {
                    return Err(PlacementError::ResidentLength {
                        layer: index,
                        expected: replicas.len(),
                        found: r.get_ref().len(),
                        line: line(r.span()),
                    });
                }
                let resident = resolve_lists(r.get_ref(), "resident", index)?;
                for (e, (res, reps)) in resident.iter().zip(&replicas).enumerate() {
                    if let Some(&bad) = res.iter().find(|n| !reps.contains(n)) {
                        return Err(PlacementError::ResidentNotReplica {
                            field: format!("layer[{index}].resident[{e}]"),
                            name: nodes[bad].name.clone(),
                            line: line(r.get_ref()[e].span()),
                        });
                    }
                }
                resident
            }
        };
        layers.push(LayerPlacement {
            index,
            replicas,
            resident,
        });
    }
    Ok(Placement::assemble(nodes, Strategy::Explicit, layers))
}

/// Checks `[[node]]` tables (names unique and sane, addresses host:port) and converts them.
fn nodes_from(
    text: &str,
    list: &[NodeIn],
) -> Result<(Vec<NodeSpec>, BTreeMap<String, usize>), PlacementError> {
    let line = |span: std::ops::Range<usize>| Some(line_of(text, span.start));
    let mut nodes = Vec::with_capacity(list.len());
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    for (i, n) in list.iter().enumerate() {
        let field = format!("node[{i}].name");
        let name = n.name.get_ref();
        if !is_good_name(name) {
            return Err(PlacementError::BadNodeName {
                field,
                found: name.clone(),
                line: line(n.name.span()),
            });
        }
        if let Some(&first) = names.get(name) {
            return Err(PlacementError::DuplicateNode {
                field,
                name: name.clone(),
                first: format!("node[{first}].name"),
                line: line(n.name.span()),
            });
        }
        names.insert(name.clone(), i);
        if let Some(addr) = &n.addr {
            if !is_good_addr(addr.get_ref()) {
                return Err(PlacementError::BadAddr {
                    field: format!("node[{i}].addr"),
                    found: addr.get_ref().clone(),
                    line: line(addr.span()),
                });
            }
        }
        nodes.push(NodeSpec {
            name: name.clone(),
            addr: n.addr.as_ref().map(|a| a.get_ref().clone()),
            numa: n.numa,
            memory_bytes: n.memory_bytes,
            cores: n.cores,
        });
    }
    Ok((nodes, names))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodesIn {
    #[serde(default)]
    node: Vec<NodeIn>,
}

/// Parses a planner `NODES.toml`: only `[[node]]` tables (name, addr, numa, memory_bytes, cores).
pub(super) fn parse_nodes(text: &str) -> Result<Vec<NodeSpec>, PlacementError> {
    let file: NodesIn = toml::from_str(text).map_err(|e| syntax(text, &e))?;
    let (nodes, _) = nodes_from(text, &file.node)?;
    if nodes.is_empty() {
        return Err(PlacementError::NoNodes);
    }
    Ok(nodes)
}

fn syntax(text: &str, e: &toml::de::Error) -> PlacementError {
    let pos = e.span().map_or(0, |s| s.start);
    PlacementError::Syntax {
        line: line_of(text, pos),
        column: column_of(text, pos),
        message: e.message().trim_end_matches('.').to_string(),
    }
}

/// Structural checks for placements built in code (`Placement::from_layers`).
pub(super) fn check_nodes(nodes: &[NodeSpec]) -> Result<(), PlacementError> {
    if nodes.is_empty() {
        return Err(PlacementError::NoNodes);
    }
    for (i, n) in nodes.iter().enumerate() {
        let field = format!("node[{i}].name");
        if !is_good_name(&n.name) {
            return Err(PlacementError::BadNodeName {
                field,
                found: n.name.clone(),
                line: None,
            });
        }
        if let Some(first) = nodes[..i].iter().position(|m| m.name == n.name) {
            return Err(PlacementError::DuplicateNode {
                field,
                name: n.name.clone(),
                first: format!("node[{first}].name"),
                line: None,
            });
        }
        if let Some(addr) = &n.addr {
            if !is_good_addr(addr) {
                return Err(PlacementError::BadAddr {
                    field: format!("node[{i}].addr"),
                    found: addr.clone(),
                    line: None,
                });
            }
        }
    }
    Ok(())
}

pub(super) fn check_layer(l: &LayerPlacement, n_nodes: usize) -> Result<(), PlacementError> {
    if l.resident.len() != l.replicas.len() {
        return Err(PlacementError::ResidentLength {
            layer: l.index,
            expected: l.replicas.len(),
            found: l.resident.len(),
            line: None,
        });
    }
    for (e, (reps, res)) in l.replicas.iter().zip(&l.resident).enumerate() {
        let field = format!("layer[{}].replicas[{e}]", l.index);
        if reps.is_empty() {
            return Err(PlacementError::NoReplica { field, line: None });
        }
        for (i, &n) in reps.iter().enumerate() {
            if n >= n_nodes {
                return Err(PlacementError::UnknownNode {
                    field,
                    name: format!("#{n}"),
                    known: format!("{n_nodes} nodes"),
                    line: None,
                });
            }
            if reps[..i].contains(&n) {
                return Err(PlacementError::DuplicateReplica {
                    field,
                    name: format!("#{n}"),
                    line: None,
                });
            }
        }
        if let Some(&bad) = res.iter().find(|n| !reps.contains(n)) {
            return Err(PlacementError::ResidentNotReplica {
                field: format!("layer[{}].resident[{e}]", l.index),
                name: format!("#{bad}"),
                line: None,
            });
        }
    }
    Ok(())
}

pub(super) fn render(p: &Placement) -> String {
    let name = |n: &NodeId| p.nodes[*n].name.as_str();
    let round_robin = p.strategy == Strategy::RoundRobin;
    let names = |lists: &[Vec<NodeId>]| -> Vec<Vec<&str>> {
        lists.iter().map(|r| r.iter().map(name).collect()).collect()
    };
    let mut layer = Vec::new();
    if !round_robin {
        for l in &p.layers {
            let resident = (l.resident != l.replicas).then(|| names(&l.resident));
            layer.push(LayerOut {
                index: l.index,
                replicas: names(&l.replicas),
                resident,
            });
        }
    }
    let out = FileOut {
        version: p.version,
        strategy: round_robin.then_some("round-robin"),
        node: p
            .nodes
            .iter()
            .map(|n| NodeOut {
                name: &n.name,
                addr: n.addr.as_deref(),
                numa: n.numa,
                memory_bytes: n.memory_bytes,
                cores: n.cores,
            })
            .collect(),
        layer,
    };
    let body =
        toml::to_string(&out).unwrap_or_else(|e| format!("# cannot render placement: {e}\n"));
    format!("# NightShift expert placement (nightshift-atlas)\n{body}")
}
