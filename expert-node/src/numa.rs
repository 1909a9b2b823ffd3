//! NUMA pinning: turns an hwloc topology (the live machine, or an XML export of a machine we do
//! not have) into a `PinPlan` — which NUMA node a node serves from, which processing units its
//! worker threads run on, how much memory is local — and applies it to a rayon pool.
//!
//! The plan is pure data computed from the topology, so it is tested against hwloc XML exports
//! of 2-socket and 4-node machines. Applying it (CPU and memory binding) can fail on machines that
//! forbid binding (containers, single-node VMs); that is logged and serving goes on unpinned.

use std::path::Path;
use std::sync::Arc;

use hwlocality::bitmap::BitmapIndex;
use hwlocality::cpu::binding::CpuBindingFlags;
use hwlocality::cpu::cpuset::CpuSet;
use hwlocality::memory::binding::{MemoryBindingFlags, MemoryBindingPolicy};
use hwlocality::memory::nodeset::NodeSet;
use hwlocality::object::types::ObjectType;
use hwlocality::Topology;

/// Errors of topology loading and pin planning.
#[derive(Debug, thiserror::Error)]
pub enum NumaError {
    #[error("cannot read the machine topology: {0}")]
    Topology(String),
    #[error("cannot load hwloc topology xml {path}: {reason}")]
    Xml { path: String, reason: String },
    #[error("numa node {requested} not found: the topology has numa nodes {available:?}")]
    NoSuchNode {
        requested: usize,
        available: Vec<usize>,
    },
    #[error("numa node {0} has no processing units to run on")]
    NoCpus(usize),
    #[error("--threads must be at least 1, found 0")]
    ZeroThreads,
    #[error("cannot build the worker pool: {0}")]
    Pool(String),
}

/// One NUMA node as the topology describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumaNodeInfo {
    /// OS index of the node (what `--numa` names).
    pub os_index: usize,
    /// Local memory in bytes (0 when the topology does not say).
    pub memory_bytes: u64,
    /// Number of cores local to the node.
    pub cores: usize,
    /// OS indices of the processing units local to the node.
    pub pus: Vec<usize>,
}

/// Where a node's workers run and where its memory lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinPlan {
    /// The NUMA node pinned to; `None` runs unpinned over the whole machine.
    pub numa_node: Option<usize>,
    /// One processing unit (OS index) per worker thread; empty when unpinned.
    pub worker_cpus: Vec<usize>,
    /// Number of worker threads.
    pub threads: usize,
    /// Memory local to the pinned node, for capacity checks (0 when unknown or unpinned).
    pub local_memory_bytes: u64,
    /// Why the plan does not pin (single-node machine, no `--numa`), for the startup log.
    pub note: Option<String>,
}

/// Loads the live machine's topology, or an hwloc XML export when `xml` is given.
pub fn load_topology(xml: Option<&Path>) -> Result<Topology, NumaError> {
    match xml {
        None => Topology::new().map_err(|e| NumaError::Topology(e.to_string())),
        Some(path) => {
            // Read the file ourselves: hwloc's own file path handling panics on a missing file.
            let err = |reason: String| NumaError::Xml {
                path: path.display().to_string(),
                reason,
            };
            let xml = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
            if !xml.trim_start().starts_with("<?xml") {
                return Err(err("not an xml document".into()));
            }
            Topology::builder()
                .from_xml(&xml)
                .map_err(|e| err(e.to_string()))?
                .build()
                .map_err(|e| err(e.to_string()))
        }
    }
}

/// The NUMA nodes of a topology, ordered by OS index.
pub fn numa_nodes(topo: &Topology) -> Vec<NumaNodeInfo> {
    let mut nodes: Vec<NumaNodeInfo> = topo
        .objects_with_type(ObjectType::NUMANode)
        .filter_map(|node| {
            let os_index = node.os_index()?;
            let cpuset = node.cpuset()?.clone_target();
            let pus: Vec<usize> = cpuset.iter_set().map(usize::from).collect();
            let cores = topo
                .objects_with_type(ObjectType::Core)
                .filter(|core| core.cpuset().is_some_and(|c| cpuset.includes(&*c)))
                .count();
            let memory_bytes = node.total_memory();
            Some(NumaNodeInfo {
                os_index,
                memory_bytes,
                cores,
                pus,
            })
        })
        .collect();
    nodes.sort_by_key(|n| n.os_index);
    nodes
}

/// Chooses worker CPUs: the first processing unit of every core of the node first (SMT siblings
/// share a core's execution units, and decode is bandwidth bound), then the remaining siblings.
fn worker_cpus(topo: &Topology, node_cpus: &CpuSet, threads: usize) -> Vec<usize> {
    let mut first: Vec<usize> = Vec::new();
    let mut rest: Vec<usize> = Vec::new();
    for core in topo.objects_with_type(ObjectType::Core) {
        let Some(cs) = core.cpuset() else { continue };
        if !node_cpus.includes(&*cs) {
            continue;
        }
        for (i, pu) in cs.iter_set().enumerate() {
            if i == 0 {
                first.push(usize::from(pu));
            } else {
                rest.push(usize::from(pu));
            }
        }
    }
    if first.is_empty() {
        // Topologies without Core objects: every PU of the node counts as a core.
        first = node_cpus.iter_set().map(usize::from).collect();
    }
    first.sort_unstable();
    rest.sort_unstable();
    let order: Vec<usize> = first.into_iter().chain(rest).collect();
    (0..threads).map(|i| order[i % order.len()]).collect()
}

/// Plans pinning for `--numa N` / `--threads T` on a topology.
///
/// Without `--numa`, or on a machine with a single NUMA node, the plan does not pin (and says why
/// in `note`); threads default to the cores of the pinned node, or of the machine.
pub fn plan(
    topo: &Topology,
    numa: Option<usize>,
    threads: Option<usize>,
) -> Result<PinPlan, NumaError> {
    if threads == Some(0) {
        return Err(NumaError::ZeroThreads);
    }
    let nodes = numa_nodes(topo);
    let machine_cores = topo.objects_with_type(ObjectType::Core).count().max(1);
    let Some(requested) = numa else {
        let n = threads.unwrap_or(machine_cores);
        return Ok(PinPlan {
            numa_node: None,
            worker_cpus: Vec::new(),
            threads: n,
            local_memory_bytes: 0,
            note: Some("no --numa given: workers run unpinned over the whole machine".into()),
        });
    };
    let Some(node) = nodes.iter().find(|n| n.os_index == requested) else {
        return Err(NumaError::NoSuchNode {
            requested,
            available: nodes.iter().map(|n| n.os_index).collect(),
        });
    };
    if node.pus.is_empty() {
        return Err(NumaError::NoCpus(requested));
    }
    let n = threads.unwrap_or(node.cores.max(1));
    if nodes.len() <= 1 {
        return Ok(PinPlan {
            numa_node: None,
            worker_cpus: Vec::new(),
            threads: n,
            local_memory_bytes: node.memory_bytes,
            note: Some("hwloc reports a single numa node: pinning skipped".into()),
        });
    }
    let node_obj = topo
        .objects_with_type(ObjectType::NUMANode)
        .find(|o| o.os_index() == Some(requested))
        .and_then(|o| o.cpuset().map(|c| c.clone_target()))
        .ok_or(NumaError::NoCpus(requested))?;
    Ok(PinPlan {
        numa_node: Some(requested),
        worker_cpus: worker_cpus(topo, &node_obj, n),
        threads: n,
        local_memory_bytes: node.memory_bytes,
        note: None,
    })
}

/// Binds the calling thread to one processing unit and its memory to the plan's NUMA node.
/// Failures are returned as text: callers log them and continue unpinned.
pub fn bind_current_thread(topo: &Topology, cpu: usize, numa: usize) -> Result<(), String> {
    let cpu_idx = BitmapIndex::try_from(cpu).map_err(|_| format!("pu index {cpu} out of range"))?;
    let numa_idx =
        BitmapIndex::try_from(numa).map_err(|_| format!("numa index {numa} out of range"))?;
    let cpus = CpuSet::from(cpu_idx);
    topo.bind_cpu(&cpus, CpuBindingFlags::THREAD)
        .map_err(|e| format!("cpu binding to pu {cpu}: {e}"))?;
    let nodes = NodeSet::from(numa_idx);
    topo.bind_memory(
        &nodes,
        MemoryBindingPolicy::Bind,
        MemoryBindingFlags::THREAD,
    )
    .map_err(|e| format!("memory binding to numa node {numa}: {e}"))?;
    Ok(())
}

/// Builds the node's rayon pool: one worker per planned CPU, each bound at start (first touch by
/// pinned threads then places resident experts in node-local memory).
pub fn pinned_pool(topo: Arc<Topology>, plan: &PinPlan) -> Result<rayon::ThreadPool, NumaError> {
    let cpus = plan.worker_cpus.clone();
    let numa = plan.numa_node;
    rayon::ThreadPoolBuilder::new()
        .num_threads(plan.threads)
        .thread_name(|i| format!("expert-worker-{i}"))
        .start_handler(move |i| {
            if let (Some(node), Some(&cpu)) = (numa, cpus.get(i)) {
                if let Err(e) = bind_current_thread(&topo, cpu, node) {
                    tracing::warn!(worker = i, "pinning failed, running unpinned: {e}");
                }
            }
        })
        .build()
        .map_err(|e| NumaError::Pool(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(name: &str) -> Topology {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/topologies")
            .join(name);
        load_topology(Some(&path)).expect("test topology loads")
    }

    #[test]
    fn lists_nodes_of_exported_machines() {
        let cases: [(&str, usize, usize, usize); 3] = [
            // (file, numa nodes, cores per node, pus per node)
            ("two-socket.xml", 2, 8, 16),
            ("cobalt-4numa.xml", 4, 24, 24),
            ("single-node.xml", 1, 2, 2),
        ];
        for (file, n_nodes, cores, pus) in cases {
            let nodes = numa_nodes(&topo(file));
            assert_eq!(nodes.len(), n_nodes, "{file}");
            for (i, n) in nodes.iter().enumerate() {
                assert_eq!(n.os_index, i, "{file}");
                assert_eq!(n.cores, cores, "{file}");
                assert_eq!(n.pus.len(), pus, "{file}");
            }
        }
    }

    #[test]
    fn pins_to_first_pu_of_each_core_then_siblings() {
        let t = topo("two-socket.xml");
        let p = plan(&t, Some(1), None).unwrap();
        assert_eq!(p.numa_node, Some(1));
        assert_eq!(p.threads, 8);
        // Node 1 holds PUs 16..32, two per core: one thread per core, on the first PU.
        assert_eq!(p.worker_cpus, vec![16, 18, 20, 22, 24, 26, 28, 30]);
        let p = plan(&t, Some(0), Some(10)).unwrap();
        assert_eq!(p.worker_cpus, vec![0, 2, 4, 6, 8, 10, 12, 14, 1, 3]);
    }

    #[test]
    fn four_node_machine_gives_disjoint_cpusets() {
        let t = topo("cobalt-4numa.xml");
        let mut seen = std::collections::BTreeSet::new();
        for node in 0..4 {
            let p = plan(&t, Some(node), None).unwrap();
            assert_eq!(p.threads, 24);
            assert_eq!(p.worker_cpus.first(), Some(&(node * 24)));
            for cpu in p.worker_cpus {
                assert!(seen.insert(cpu), "cpu {cpu} given to two nodes");
            }
        }
        assert_eq!(seen.len(), 96);
    }

    #[test]
    fn bad_requests_are_errors() {
        let t = topo("cobalt-4numa.xml");
        match plan(&t, Some(7), None) {
            Err(NumaError::NoSuchNode {
                requested: 7,
                available,
            }) => assert_eq!(available, vec![0, 1, 2, 3]),
            other => panic!("expected NoSuchNode, got {other:?}"),
        }
        assert!(matches!(
            plan(&t, Some(0), Some(0)),
            Err(NumaError::ZeroThreads)
        ));
        let missing = load_topology(Some(Path::new("/nonexistent/topology.xml")));
        assert!(matches!(missing, Err(NumaError::Xml { .. })));
        let dir = std::env::temp_dir().join(format!("ns-numa-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in [
            ("garbage.xml", "not xml at all"),
            ("broken.xml", "<?xml version=\"1.0\"?><topology><object"),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            assert!(
                matches!(load_topology(Some(&p)), Err(NumaError::Xml { .. })),
                "{name}"
            );
        }
    }

    #[test]
    fn single_node_machine_falls_back_cleanly() {
        let p = plan(&topo("single-node.xml"), Some(0), None).unwrap();
        assert_eq!(p.numa_node, None);
        assert!(p.worker_cpus.is_empty());
        assert_eq!(p.threads, 2);
        assert!(p.note.unwrap().contains("single numa node"));
        let p = plan(&topo("cobalt-4numa.xml"), None, Some(3)).unwrap();
        assert_eq!((p.numa_node, p.threads), (None, 3));
    }
}
