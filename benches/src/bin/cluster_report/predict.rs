//! `cluster-report --netns`: the capacity planner's prediction (`nightshift_coordinator::plan`)
//! next to what the namespaces measured, cell by cell. The planner sees this machine as its VM
//! table would: each node `--node-threads` cores, the memory bandwidth and FFN rates
//! `Calibration::measure` finds here, links at `--rate`. What it cannot know about this machine
//! is calibrated on two cells and validated on all the others: the per-call software cost (gRPC,
//! TLS, veth, node dispatch) from the nodes dialled directly at batch 1 without the overlap, and
//! the delay relay's own cost from the 0 us cell at batch 1. The coordinator's own compute is the
//! in-process run of the same cell minus its expert time (same cores, measured alongside).

use nightshift_coordinator::plan::{Calibration, ModelCost, Routing, Scenario, Sources, Vm};

use super::netns::{Cell, Runs};
use super::{median, Args, Run};

/// Per-step seconds of a run's phases: (whole step, routed experts, dense FFN + shared experts).
fn phases(r: &Run) -> (f64, f64, f64) {
    let n = r.profile.steps.max(1) as f64;
    (
        r.profile.total / n,
        r.profile.experts / n,
        r.profile.ffn_other / n,
    )
}

/// Bits per second of a `tc` rate such as `10gbit`, `500mbit`.
fn rate_bps(rate: &str) -> anyhow::Result<f64> {
    let r = rate.trim().to_ascii_lowercase();
    let digits = r
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(r.len());
    let (num, unit) = r.split_at(digits);
    let x: f64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("--rate: expected a number and a unit, found {rate:?}"))?;
    let scale = match unit {
        "gbit" => 1e9,
        "mbit" => 1e6,
        "kbit" => 1e3,
        "bit" | "" => 1.0,
        _ => anyhow::bail!("--rate: expected gbit, mbit or kbit, found {unit:?}"),
    };
    Ok(x * scale)
}

fn this_machine(cores: usize, cal: &Calibration, net_bps: f64) -> Vm {
    let measured = "measured here (Calibration::measure)".to_string();
    Vm {
        name: "this machine".into(),
        family: "netns".into(),
        cores: cores as u32,
        memory_gib: 1e6,
        mem_bw_gbs: cal.stream_gbs,
        net_gbps: net_bps / 1e9,
        usd_per_hour: 1.0,
        sources: Sources {
            cores: "--node-threads / --threads".into(),
            memory: "unbounded here".into(),
            mem_bw: measured,
            net: "--rate (tc tbf)".into(),
            price: "none".into(),
        },
    }
}

/// Prints predicted vs measured per cell.
pub fn report(cells: &[Cell], a: &Args) -> anyhow::Result<()> {
    if a.replicate_all {
        println!();
        println!(
            "planner: not compared (it models one copy of each expert, round-robin, not a replicated placement)"
        );
        return Ok(());
    }
    let cost = ModelCost::from_gguf(&a.model)?;
    let cal = Calibration::measure(&cost, a.threads, 256)?;
    let routing = Routing::uniform(cost.n_expert, cost.n_used);
    let net = rate_bps(&a.rate)?;
    let (coord_vm, node_vm) = (
        this_machine(a.threads, &cal, net),
        this_machine(a.node_threads, &cal, net),
    );
    let layers = cost.moe_layers.max(1) as f64;
    println!();
    println!(
        "planner vs measured ({} experts: read {:.1} GB/s, FFN from memory {:.1} GB/s, cached {:.2} GB-rows/s per core; uniform routing)",
        cal.expert,
        cal.stream_gbs,
        cal.ffn_gbs,
        cal.ffn_byte_rows_per_core / 1e9
    );
    let scenario =
        |nodes: usize, batch: usize, rtt: f64, overhead: f64, overlap: bool, mb: bool| Scenario {
            model: &cost,
            routing: &routing,
            cal: &cal,
            coordinator: &coord_vm,
            node: &node_vm,
            nodes,
            batch,
            rtt,
            call_overhead: overhead,
            context: a.prompt + a.warmup_steps + a.steps / 2,
            kv_elem_bytes: 4.0,
            prefill_chunk: a.prompt.max(1),
            overlap,
            micro_batches: mb,
            // the nodes and the coordinator share this machine's cores
            shared_cores: true,
        };
    let med = |c: &Cell, f: &dyn Fn(&Runs) -> f64| -> f64 {
        median(&c.runs.iter().map(f).collect::<Vec<_>>())
    };
    // the coordinator's own compute: the in-process step minus its expert time
    let own = |c: &Cell| med(c, &|r| phases(&r.base).0 - phases(&r.base).1);
    println!(
        "{:>5} | {:>8} | {:>5} | {:>17} | {:>17} | {:>17} | {:>12} | {:>12}",
        "nodes",
        "added",
        "batch",
        "ovl+mb pred/meas",
        "shared pred/meas",
        "no-ovl pred/meas",
        "B/tok pred",
        "B/tok meas"
    );
    let mut errors = Vec::new();
    for &nodes in &a.netns_nodes {
        let find = |delay: Option<u64>, batch: usize| {
            cells
                .iter()
                .find(|c| c.nodes == nodes && c.delay_us == delay && c.batch == batch)
        };
        let Some(direct) = find(None, 1) else {
            println!("{nodes} nodes: no direct batch-1 cell to calibrate the call cost on");
            continue;
        };
        // per-call cost: the direct cell's remote time per layer minus what the planner models
        let s0 = scenario(nodes, 1, 0.0, 0.0, false, false);
        let modelled = s0.step_time(0.0, 0.0);
        let direct_remote = med(direct, &|r| phases(&r.plain).0) - own(direct);
        let overhead = ((direct_remote - modelled) / layers).max(0.0);
        let relay = match find(Some(0), 1) {
            Some(c) => ((med(c, &|r| phases(&r.plain).0) - med(direct, &|r| phases(&r.plain).0))
                / layers)
                .max(0.0),
            None => 0.0,
        };
        println!(
            "{nodes} nodes: calibrated per-call cost {:.0} us (direct, batch 1), relay {:.0} us per round trip (0 us, batch 1)",
            overhead * 1e6,
            relay * 1e6
        );
        for c in cells.iter().filter(|c| c.nodes == nodes) {
            let rtt = c.delay_us.map_or(0.0, |d| relay + 2.0 * d as f64 * 1e-6);
            let shared = med(c, &|r| phases(&r.base).2) / layers;
            let pred = |overlap: bool, mb: bool| {
                let s = scenario(nodes, c.batch, rtt, overhead, overlap, mb);
                c.batch as f64 / s.step_time(own(c), shared)
            };
            let calibration = c.batch == 1 && matches!(c.delay_us, None | Some(0));
            let mut cols = Vec::new();
            for (p, pick) in [
                (
                    pred(true, true),
                    (|r: &Runs| r.both.tok_s) as fn(&Runs) -> f64,
                ),
                (pred(true, false), |r: &Runs| r.shared.tok_s),
                (pred(false, false), |r: &Runs| r.plain.tok_s),
            ] {
                let m = med(c, &pick);
                cols.push(format!("{p:.1}/{m:.1} {:+.0}%", 100.0 * (p / m - 1.0)));
                if !calibration {
                    errors.push((p / m - 1.0).abs());
                }
            }
            let s = scenario(nodes, c.batch, rtt, overhead, true, true);
            let bytes: f64 = (0..cost.moe_layers)
                .map(|l| {
                    let b = s.layer_bytes(l, c.batch);
                    b.out_total + b.in_total
                })
                .sum::<f64>()
                / c.batch as f64;
            let measured_bytes = med(c, &|r| r.both.bytes_per_token.unwrap_or(f64::NAN));
            println!(
                "{:>5} | {:>8} | {:>5} | {:>17} | {:>17} | {:>17} | {:>12.0} | {:>12.0}{}",
                nodes,
                c.delay_us.map_or("direct".into(), |d| format!("{d} us")),
                c.batch,
                cols[0],
                cols[1],
                cols[2],
                bytes,
                measured_bytes,
                if calibration {
                    "  (calibration cell)"
                } else {
                    ""
                }
            );
        }
    }
    if !errors.is_empty() {
        let within = errors.iter().filter(|&&e| e <= 0.15).count();
        println!(
            "validation cells: {within} of {} predictions within 15% (median error {:.1}%, worst {:.1}%)",
            errors.len(),
            100.0 * median(&errors),
            100.0 * errors.iter().copied().fold(0.0, f64::max)
        );
    }
    Ok(())
}
