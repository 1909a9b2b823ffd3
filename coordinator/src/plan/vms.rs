//! The VM table: per VM size its cores, memory, memory bandwidth, network bandwidth and hourly
//! price, each with the source it comes from. One table ships with the binary
//! (`coordinator/data/vms.toml`: Azure Cobalt 100 `D/E*ps_v6` and AWS Graviton4); `--vms FILE`
//! replaces it. A table is checked whole when read: every figure positive and finite, every
//! figure with a source, names unique.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;

use super::PlanError;

/// The table shipped with the binary.
pub const BUILTIN_VMS: &str = include_str!("../../data/vms.toml");

/// Where each figure of a row comes from (a URL, or how it was derived and from what).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Sources {
    pub cores: String,
    pub memory: String,
    pub mem_bw: String,
    pub net: String,
    pub price: String,
}

/// One VM size.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Vm {
    pub name: String,
    pub family: String,
    /// vCPUs (one core each on these Arm VMs: no SMT).
    pub cores: u32,
    pub memory_gib: f64,
    /// Memory bandwidth available to the VM, GB/s.
    pub mem_bw_gbs: f64,
    /// Network bandwidth each way, Gbit/s.
    pub net_gbps: f64,
    /// On-demand Linux price, USD per hour.
    pub usd_per_hour: f64,
    pub sources: Sources,
}

impl Vm {
    pub fn memory_bytes(&self) -> f64 {
        self.memory_gib * (1u64 << 30) as f64
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    vm: Vec<Vm>,
}

/// A checked VM table.
#[derive(Clone, Debug, PartialEq)]
pub struct VmTable {
    pub vms: Vec<Vm>,
}

impl VmTable {
    /// The shipped table.
    pub fn builtin() -> Result<VmTable, PlanError> {
        Self::parse(BUILTIN_VMS, "the built-in VM table")
    }

    pub fn load(path: &Path) -> Result<VmTable, PlanError> {
        let text = std::fs::read_to_string(path).map_err(|e| PlanError::Vms {
            what: path.display().to_string(),
            msg: format!("cannot read it: {e}"),
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and checks a table (`what` names it in errors).
    pub fn parse(text: &str, what: &str) -> Result<VmTable, PlanError> {
        let bad = |msg: String| PlanError::Vms {
            what: what.to_string(),
            msg,
        };
        let file: File = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| {
                text.as_bytes()[..s.start.min(text.len())]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count()
                    + 1
            });
            bad(match line {
                Some(l) => format!("line {l}: {}", e.message()),
                None => e.message().to_string(),
            })
        })?;
        if file.vm.is_empty() {
            return Err(bad("expected at least one [[vm]], found none".into()));
        }
        let mut names = BTreeSet::new();
        for v in &file.vm {
            if v.name.trim().is_empty() {
                return Err(bad(
                    "expected every vm to have a name, found an empty one".into()
                ));
            }
            if !names.insert(v.name.as_str()) {
                return Err(bad(format!("vm `{}` is listed twice", v.name)));
            }
            let figures = [
                ("memory_gib", v.memory_gib),
                ("mem_bw_gbs", v.mem_bw_gbs),
                ("net_gbps", v.net_gbps),
                ("usd_per_hour", v.usd_per_hour),
                ("cores", f64::from(v.cores)),
            ];
            for (field, x) in figures {
                if !(x.is_finite() && x > 0.0) {
                    return Err(bad(format!(
                        "vm `{}`: expected {field} to be a positive number, found {x}",
                        v.name
                    )));
                }
            }
            let s = &v.sources;
            for (field, src) in [
                ("cores", &s.cores),
                ("memory", &s.memory),
                ("mem_bw", &s.mem_bw),
                ("net", &s.net),
                ("price", &s.price),
            ] {
                if src.trim().is_empty() {
                    return Err(bad(format!(
                        "vm `{}`: expected a source for {field}, found an empty one",
                        v.name
                    )));
                }
            }
        }
        Ok(VmTable { vms: file.vm })
    }

    pub fn get(&self, name: &str) -> Result<&Vm, PlanError> {
        self.vms
            .iter()
            .find(|v| v.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| PlanError::Vms {
                what: "--vm".into(),
                msg: format!(
                    "expected one of {}, found `{name}`",
                    self.vms
                        .iter()
                        .map(|v| v.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
    }
}
