//! `cluster-report --netns`: the cluster across network namespaces (coordinator/src/cluster/netns),
//! the deployment's TCP + mutual TLS path with a `tc tbf` cap per node link (`--rate`, 10 Gbit/s)
//! and a delay relay per link adding `--delays-us` one way, against in process on the same cores.
//! Per node count and added delay one cluster is started (round-robin placement, every copy
//! resident; `--replicate-all`: every expert on every node, `--resident` for RAM copies), then
//! per batch size the in-process run, the cluster as it runs by default (`auto`: per step shape
//! the mode measured steps say is fastest), with both overlaps always on (a layer's shared expert
//! computed while its routed experts are out, and two micro-batches whose layer calls alternate
//! where they pay), with the shared-expert overlap only, and with none alternate `--repeats`
//! times. Also run: the nodes dialled directly (no relay), so the relay's own cost at
//! 0 us shows. The last table is the per-layer cost of each added microsecond: the growth of the
//! decode step between the smallest and largest delay, per MoE layer and per added us one way;
//! then the capacity planner's prediction of every cell next to its measurement (`predict.rs`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use nightshift_atlas_core::placement::{NodeSpec, Placement};
use nightshift_coordinator::cluster::netns::{self, NetnsCluster, NetnsOptions};
use nightshift_coordinator::cluster::{self, model_shape, ClientTls, RemoteExperts, RemoteOptions};
use nightshift_model::Model;

use super::{decode, median, Args, Run};

/// One repeat of a cell: in process, then the cluster as it runs by default (`auto`: each step
/// shape in the mode its measured steps say is fastest, `lanes::ModePolicy`), with the shared
/// expert always overlapped and two micro-batches where they pay (`both`), with the shared-expert
/// overlap only, and with no overlap.
pub struct Runs {
    pub base: Run,
    pub auto: Run,
    pub both: Run,
    pub shared: Run,
    pub plain: Run,
}

/// One configuration's runs, one `Runs` per repeat.
pub struct Cell {
    pub nodes: usize,
    /// None: the nodes dialled directly (no relay).
    pub delay_us: Option<u64>,
    pub batch: usize,
    pub runs: Vec<Runs>,
}

fn connect(
    model: &Model,
    c: &NetnsCluster,
    tls: &ClientTls,
    overlap: bool,
    micro_batches: bool,
    always: bool,
    data_link: bool,
) -> anyhow::Result<Arc<RemoteExperts>> {
    let opts = RemoteOptions {
        auth_token: Some(c.auth_token().to_string()),
        tls: Some(tls.clone()),
        shm_pairs: 0,
        deadline: Duration::from_secs(60),
        overlap,
        micro_batches,
        overlap_always: always,
        net_links: if data_link {
            RemoteOptions::default().net_links
        } else {
            0
        },
        ..Default::default()
    };
    let (placement, fp, n_embd) = (
        c.placement().clone(),
        model.gguf().fingerprint(),
        model.config().n_embd,
    );
    let r = c.in_coord(move || RemoteExperts::connect(placement, fp, n_embd, opts))??;
    anyhow::ensure!(
        r.wait_all_up(Duration::from_secs(30)),
        "nodes not up across namespaces: {:?}",
        r.status()
    );
    Ok(Arc::new(r))
}

pub fn run(a: &Args) -> anyhow::Result<()> {
    netns::available()?;
    let model = Model::load(&a.model).with_context(|| format!("loading {}", a.model.display()))?;
    let shape = model_shape(&model)?;
    let moe_layers = shape.moe_layers.len();
    let exe = nightshift_coordinator::cluster::launcher::find_node_binary()?;
    let dir = std::env::temp_dir().join(format!("nightshift-netns-report-{}", std::process::id()));
    let has_shared = model.config().n_expert_shared > 0;
    println!(
        "model {} | {} MoE layers{} | nodes {:?} x {} threads, {} | links capped at {} each way, mutual TLS, \
         calls over {} | in process {} threads | {} steps, {} repeats per cell, interleaved",
        a.model.display(),
        moe_layers,
        if has_shared { ", shared expert" } else { ", no shared expert: overlap has nothing to hide" },
        a.netns_nodes,
        a.node_threads,
        if a.replicate_all {
            "every expert on every node, the replica picked per call"
        } else {
            "round-robin placement (one resident copy per expert)"
        },
        a.rate,
        if a.no_data_link { "the gRPC streams" } else { "the data links" },
        a.threads,
        a.steps,
        a.repeats
    );
    let mut delays: Vec<Option<u64>> = vec![None];
    delays.extend(a.delays_us.iter().map(|&d| Some(d)));
    let mut cells = Vec::new();
    println!(
        "{:>5} | {:>8} | {:>5} | {:>3} | {:>11} | {:>11} | {:>7} | {:>11} | {:>7} | {:>11} | {:>7} | {:>11} | {:>7} | {:>8}",
        "nodes",
        "added",
        "batch",
        "run",
        "in-proc t/s",
        "auto t/s",
        "ratio",
        "ovl+mb t/s",
        "ratio",
        "shared t/s",
        "ratio",
        "no-ovl t/s",
        "ratio",
        "rtt p50"
    );
    for &nodes in &a.netns_nodes {
        let (node_tls, client_tls) =
            nightshift_benches::tls::mutual_tls(&dir, netns::node_cert_names(nodes))?;
        for &delay_us in &delays {
            let names = (0..nodes)
                .map(|i| NodeSpec::named(format!("node{i}")))
                .collect();
            let cluster = NetnsCluster::start(NetnsOptions {
                model: a.model.clone(),
                // `--replicate-all`: what `serve --nodes N` gives unpinned nodes (every expert on
                // every node, each call balanced by the coordinator)
                placement: if a.replicate_all {
                    cluster::default_placement(nodes, &shape, false, a.resident)?
                } else {
                    Placement::round_robin(names, &shape.moe_layers, shape.n_experts)
                },
                threads_per_node: Some(a.node_threads),
                tls: Some(node_tls.clone()),
                exe: exe.clone(),
                work_dir: dir.clone(),
                rate: a.rate.clone(),
                delay: delay_us.map(Duration::from_micros),
                start_timeout: Duration::from_secs(120),
                node_log: "error".into(),
            })?;
            let link = !a.no_data_link;
            let auto = connect(&model, &cluster, &client_tls, true, true, false, link)?;
            let both = connect(&model, &cluster, &client_tls, true, true, true, link)?;
            let shared = connect(&model, &cluster, &client_tls, true, false, true, link)?;
            let without = connect(&model, &cluster, &client_tls, false, false, false, link)?;
            for &batch in &a.batches {
                let mut runs = Vec::new();
                for rep in 0..a.repeats {
                    let r = Runs {
                        base: decode(&model, None, a.threads, batch, a)?,
                        auto: decode(&model, Some(&auto), a.threads, batch, a)?,
                        both: decode(&model, Some(&both), a.threads, batch, a)?,
                        shared: decode(&model, Some(&shared), a.threads, batch, a)?,
                        plain: decode(&model, Some(&without), a.threads, batch, a)?,
                    };
                    println!(
                        "{:>5} | {:>8} | {:>5} | {:>3} | {:>11.2} | {:>11.2} | {:>7.3} | {:>11.2} | {:>7.3} | {:>11.2} | {:>7.3} | {:>11.2} | {:>7.3} | {:>8}",
                        nodes,
                        delay_us.map_or("direct".into(), |d| format!("{d} us")),
                        batch,
                        rep + 1,
                        r.base.tok_s,
                        r.auto.tok_s,
                        r.auto.tok_s / r.base.tok_s,
                        r.both.tok_s,
                        r.both.tok_s / r.base.tok_s,
                        r.shared.tok_s,
                        r.shared.tok_s / r.base.tok_s,
                        r.plain.tok_s,
                        r.plain.tok_s / r.base.tok_s,
                        super::us(r.both.p50_us)
                    );
                    runs.push(r);
                }
                cells.push(Cell {
                    nodes,
                    delay_us,
                    batch,
                    runs,
                });
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    summary(&cells, moe_layers, a);
    super::predict::report(&cells, a)
}

fn step_ms(r: &Run) -> f64 {
    1e3 * r.profile.total / r.profile.steps.max(1) as f64
}

fn summary(cells: &[Cell], moe_layers: usize, a: &Args) {
    println!();
    println!(
        "{:>5} | {:>8} | {:>5} | {:>19} | {:>19} | {:>19} | {:>19} | {:>9} | {:>9}",
        "nodes",
        "added",
        "batch",
        "auto ratio (range)",
        "ovl+mb ratio (range)",
        "shared ratio (range)",
        "no-ovl ratio (range)",
        "step o+mb",
        "step in-p"
    );
    let lo = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = |v: &[f64]| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    for c in cells {
        let ratio = |pick: fn(&Runs) -> &Run| -> String {
            let v: Vec<f64> = c
                .runs
                .iter()
                .map(|r| pick(r).tok_s / r.base.tok_s)
                .collect();
            format!("{:.3} ({:.3}-{:.3})", median(&v), lo(&v), hi(&v))
        };
        println!(
            "{:>5} | {:>8} | {:>5} | {:>19} | {:>19} | {:>19} | {:>19} | {:>6.2} ms | {:>6.2} ms",
            c.nodes,
            c.delay_us.map_or("direct".into(), |d| format!("{d} us")),
            c.batch,
            ratio(|r| &r.auto),
            ratio(|r| &r.both),
            ratio(|r| &r.shared),
            ratio(|r| &r.plain),
            median(&c.runs.iter().map(|r| step_ms(&r.both)).collect::<Vec<_>>()),
            median(&c.runs.iter().map(|r| step_ms(&r.base)).collect::<Vec<_>>()),
        );
    }
    println!();
    println!(
        "ms per decode step by engine phase (median over the repeats; experts: the time the engine"
    );
    println!(
        "waited for the routed experts, in process their FFNs, in the cluster what the overlap left exposed)"
    );
    println!(
        "{:>5} | {:>8} | {:>5} | {:>7} | {}",
        "nodes",
        "added",
        "batch",
        "run",
        super::PHASE_HEADER
    );
    for c in cells {
        for (name, pick) in [
            ("in-proc", (|r: &Runs| &r.base) as fn(&Runs) -> &Run),
            ("auto", |r: &Runs| &r.auto),
            ("ovl+mb", |r: &Runs| &r.both),
            ("shared", |r: &Runs| &r.shared),
            ("no-ovl", |r: &Runs| &r.plain),
        ] {
            let profiles: Vec<_> = c.runs.iter().map(|r| pick(r).profile).collect();
            println!(
                "{:>5} | {:>8} | {:>5} | {:>7} | {}",
                c.nodes,
                c.delay_us.map_or("direct".into(), |d| format!("{d} us")),
                c.batch,
                name,
                super::phase_cells(&profiles)
            );
        }
    }
    println!();
    println!(
        "one stream call's round trip by leg with the overlap and micro-batches (us, means; the"
    );
    println!("relay's hold and its own cost are in out and back)");
    println!(
        "{:>5} | {:>8} | {:>5} | {:>3} | {}",
        "nodes",
        "added",
        "batch",
        "run",
        super::LEGS_HEADER
    );
    for c in cells {
        for (rep, r) in c.runs.iter().enumerate() {
            println!(
                "{:>5} | {:>8} | {:>5} | {:>3} | {}",
                c.nodes,
                c.delay_us.map_or("direct".into(), |d| format!("{d} us")),
                c.batch,
                rep + 1,
                super::legs_cells(r.both.legs.as_ref())
            );
        }
    }
    println!();
    println!(
        "cost of added latency: growth of the decode step per MoE layer and per us added one way"
    );
    println!(
        "{:>5} | {:>5} | {:>12} | {:>12} | {:>14} | {:>14} | {:>14}",
        "nodes", "batch", "from", "to", "ovl+mb us/us", "shared us/us", "no-ovl us/us"
    );
    let (Some(&d0), Some(&d1)) = (a.delays_us.iter().min(), a.delays_us.iter().max()) else {
        return;
    };
    if d1 == d0 {
        return;
    }
    for &nodes in &a.netns_nodes {
        for &batch in &a.batches {
            let find = |d: u64| {
                cells
                    .iter()
                    .find(|c| c.nodes == nodes && c.batch == batch && c.delay_us == Some(d))
            };
            let (Some(c0), Some(c1)) = (find(d0), find(d1)) else {
                continue;
            };
            let per = |pick: fn(&Runs) -> &Run| {
                let s0 = median(&c0.runs.iter().map(|r| step_ms(pick(r))).collect::<Vec<_>>());
                let s1 = median(&c1.runs.iter().map(|r| step_ms(pick(r))).collect::<Vec<_>>());
                1e3 * (s1 - s0) / (moe_layers.max(1) as f64 * (d1 - d0) as f64)
            };
            println!(
                "{:>5} | {:>5} | {:>9} us | {:>9} us | {:>14.2} | {:>14.2} | {:>14.2}",
                nodes,
                batch,
                d0,
                d1,
                per(|r| &r.both),
                per(|r| &r.shared),
                per(|r| &r.plain)
            );
        }
    }
    println!(
        "(2.0 us/us: each layer waits one full round trip for every added us; less: hidden or overlapped)"
    );
}
