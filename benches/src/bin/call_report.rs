//! `call-report`: the fixed software cost of one layer call over a node's gRPC compute stream.
//! A real `nightshift-expert-node` process per transport (plaintext h2c, mutual TLS) on loopback,
//! one thread, every expert of a small model resident; the remote backend calls it with real
//! `ComputeRequest`s of the sizes a 2-node split of the Qwen3-30B-A3B shape gives a node (batch
//! 1: one row to 4 experts, a 32 KiB answer; batch 8: two micro-batches of 4 rows to 4 experts
//! each, 128 KiB answers), as the engine does: a whole call (`run_experts`) at batch 1; above,
//! both halves posted, then collected in order (the second reaches the node while the first
//! computes). Cases
//! (transport x batch x path: direct, or through the netns harness's delay relay at each
//! `--delays-us`) alternate round by round, so host drift hits all alike. Per case it prints the
//! call's median as the engine's thread saw it and the medians of its legs from both ends'
//! timestamps (`CallLegs`: out, node wait, compute, node reply, back, wake; land), and the
//! software cost: a call's own time minus its node's compute, median over calls. Every case's
//! outputs are first checked bit for bit against the same experts computed in process.
//!
//! `cargo run --release -p nightshift-benches --bin call-report [-- --rounds 5 --iters 200
//! --delays-us 50 --model FILE]` (default model: the Qwen3-30B-A3B shape cut to one layer of 8
//! experts, generated once into the temp directory).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use nightshift_atlas_core::placement::Placement;
use nightshift_benches::percentile;
use nightshift_coordinator::cluster::netns::Relay;
use nightshift_coordinator::cluster::{
    default_placement, model_shape, CallLegs, ClientTls, LaunchOptions, LocalCluster, NodeTls,
    RemoteExperts, RemoteOptions,
};
use nightshift_model::expert::act_type_for;
use nightshift_model::gen::{ensure_cached, GenSpec, Preset, QuantMix};
use nightshift_model::weights::FfnWeights;
use nightshift_model::{ActRows, Arch, ExpertBackend, ExpertPair, LocalExperts, Model};

#[derive(Parser)]
struct Args {
    /// The model (default: Qwen3-30B-A3B's shape, 1 layer of 8 experts, Q4_K_M, generated once).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Rows per call (each routed to `--experts` experts).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8])]
    batches: Vec<usize>,
    /// Experts each row is routed to on the node.
    #[arg(long, default_value_t = 4)]
    experts: usize,
    /// Transports: off (plaintext h2c), on (mutual TLS).
    #[arg(long, value_delimiter = ',', default_values_t = [String::from("off"), String::from("on")])]
    tls: Vec<String>,
    /// One-way delays of a relay in front of each node (also run: directly).
    #[arg(long, value_delimiter = ',')]
    delays_us: Vec<u64>,
    /// Alternating rounds over all cases.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Calls per case and round (after 20 not timed).
    #[arg(long, default_value_t = 200)]
    iters: usize,
}

/// One node process and the backends that call it (directly, then through each relay).
struct Transport {
    tls: bool,
    _cluster: LocalCluster,
    _relays: Vec<Relay>,
    /// Index 0 direct, then one per `--delays-us`.
    backends: Vec<RemoteExperts>,
}

/// What one case gathered over all rounds.
#[derive(Default)]
struct Samples {
    /// The call as the calling thread saw it, in microseconds.
    call_us: Vec<f64>,
    legs: Vec<CallLegs>,
    lands_us: Vec<f64>,
}

fn default_model() -> anyhow::Result<PathBuf> {
    let spec = GenSpec {
        layers: Some(1),
        experts: Some(8),
        vocab: Some(4096),
        ..GenSpec::new(Preset::Qwen3_30bA3b, Arch::Qwen3Moe, QuantMix::Q4KM)
    };
    let dir = std::env::temp_dir().join("nightshift-call-report");
    Ok(ensure_cached(&spec, &dir, &mut |_| {})?)
}

fn start(
    model: &Model,
    path: &std::path::Path,
    placement: &Placement,
    tls: Option<(NodeTls, ClientTls)>,
    delays_us: &[u64],
    work_dir: PathBuf,
) -> anyhow::Result<Transport> {
    let is_tls = tls.is_some();
    let (node_tls, client_tls) = match tls {
        Some((n, c)) => (Some(n), Some(c)),
        None => (None, None),
    };
    let cluster = LocalCluster::start(LaunchOptions {
        model: path.to_path_buf(),
        placement: placement.clone(),
        threads_per_node: Some(1),
        numa: Vec::new(),
        auth_token_file: None,
        tls: node_tls,
        exe: None,
        work_dir,
        start_timeout: Duration::from_secs(120),
        node_log: "warn".into(),
    })?;
    let direct = cluster.placement().clone();
    let node_addr: std::net::SocketAddr = direct.nodes[0]
        .addr
        .as_deref()
        .context("the launched node has no address")?
        .parse()?;
    let mut relays = Vec::new();
    let mut placements = vec![direct.clone()];
    for &d in delays_us {
        let r = Relay::start("127.0.0.1:0".parse()?, node_addr, Duration::from_micros(d))?;
        let mut p = direct.clone();
        p.nodes[0].addr = Some(r.addr().to_string());
        placements.push(p);
        relays.push(r);
    }
    let mut backends = Vec::new();
    for p in placements {
        let opts = RemoteOptions {
            auth_token: Some(cluster.auth_token().to_string()),
            tls: client_tls.clone(),
            shm_pairs: 0,
            ..Default::default()
        };
        let r = RemoteExperts::connect(p, model.gguf().fingerprint(), model.config().n_embd, opts)?;
        anyhow::ensure!(
            r.wait_all_up(Duration::from_secs(30)),
            "node not up: {:?}",
            r.status()
        );
        backends.push(r);
    }
    Ok(Transport {
        tls: is_tls,
        _cluster: cluster,
        _relays: relays,
        backends,
    })
}

/// A layer's calls as the engine makes them: one whole call at batch 1; above, two
/// micro-batches of whole rows, both posted, then collected in order (the second half's request
/// reaches the node while the first computes).
fn call(
    b: &RemoteExperts,
    layer: usize,
    halves: &[(ActRows, Vec<ExpertPair>)],
    out: &mut [f32],
) -> anyhow::Result<()> {
    if let [(acts, pairs)] = halves {
        b.run_experts(layer, acts, pairs, out)?;
        return Ok(());
    }
    let posted = halves
        .iter()
        .map(|(acts, pairs)| b.post_experts(layer, acts, pairs))
        .collect::<Result<Vec<_>, _>>()?;
    let mut at = 0;
    for ((_, pairs), p) in halves.iter().zip(posted) {
        let len = out.len() / halves.iter().map(|h| h.1.len()).sum::<usize>() * pairs.len();
        b.collect_experts(p, &mut out[at..at + len])?;
        at += len;
    }
    Ok(())
}

/// The activations and pairs of `rows` rows (row r to experts r*3.. mod `n_experts`, `per_row`
/// of them), as one call at one row, else as two halves of whole rows.
fn inputs(
    rows: usize,
    per_row: usize,
    n_experts: usize,
    act_ty: nightshift_kernels::GgmlType,
    n_embd: usize,
) -> anyhow::Result<Vec<(ActRows, Vec<ExpertPair>)>> {
    let x = nightshift_benches::random_f32(rows * n_embd, 11 + rows as u64);
    // (start, end) rows of each call
    let cuts: Vec<(usize, usize)> = if rows == 1 {
        vec![(0, 1)]
    } else {
        vec![(0, rows / 2), (rows / 2, rows)]
    };
    cuts.into_iter()
        .map(|(start, end)| {
            let acts = ActRows::quantize(act_ty, &x[start * n_embd..end * n_embd], n_embd)?;
            let pairs = (start..end)
                .flat_map(|row| {
                    (0..per_row).map(move |k| ExpertPair {
                        expert: ((row * 3 + k) % n_experts) as u32,
                        row: (row - start) as u32,
                    })
                })
                .collect();
            Ok((acts, pairs))
        })
        .collect()
}

fn median_of(v: impl Iterator<Item = u32>) -> String {
    let mut v: Vec<f64> = v.map(f64::from).collect();
    if v.is_empty() {
        return "-".into();
    }
    format!("{:.0}", percentile(&mut v, 0.5))
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    anyhow::ensure!(
        a.rounds > 0 && a.iters > 0 && a.experts > 0 && !a.batches.contains(&0),
        "expected --rounds, --iters, --experts and --batches of at least 1"
    );
    let path = match &a.model {
        Some(p) => p.clone(),
        None => default_model()?,
    };
    let model = Model::load(&path).with_context(|| format!("loading {}", path.display()))?;
    let shape = model_shape(&model)?;
    anyhow::ensure!(
        a.experts <= shape.n_experts,
        "--experts {} is more than the model's {}",
        a.experts,
        shape.n_experts
    );
    let layer = shape.moe_layers[0];
    let act_ty = match &model.weights().layers[layer].ffn {
        FfnWeights::Moe(m) => act_type_for(m.gate_exps.ty, m.up_exps.ty),
        FfnWeights::Dense(_) => anyhow::bail!("layer {layer} is not a MoE layer"),
    };
    let n_embd = model.config().n_embd;
    // One node holding every expert, resident.
    let placement = default_placement(1, &shape, false, true)?;
    let dir = std::env::temp_dir().join(format!("nightshift-call-report-{}", std::process::id()));
    let mut transports = Vec::new();
    for t in &a.tls {
        let tls = match t.as_str() {
            "off" => None,
            "on" => Some(nightshift_benches::tls::mutual_tls(
                &dir.join("tls"),
                vec!["127.0.0.1".into()],
            )?),
            other => anyhow::bail!("--tls: expected off or on, found {other}"),
        };
        transports.push(start(
            &model,
            &path,
            &placement,
            tls,
            &a.delays_us,
            dir.join(t),
        )?);
    }
    let reference = LocalExperts::new(model.clone(), None);
    // Per batch: each call's activations and pairs.
    let inputs: Vec<Vec<(ActRows, Vec<ExpertPair>)>> = a
        .batches
        .iter()
        .map(|&n| inputs(n, a.experts, shape.n_experts, act_ty, n_embd))
        .collect::<anyhow::Result<_>>()?;
    // case: (transport, batch index, path index)
    let mut cases = Vec::new();
    for t in 0..transports.len() {
        for bi in 0..a.batches.len() {
            for pi in 0..=a.delays_us.len() {
                cases.push((t, bi, pi));
            }
        }
    }
    for &(t, bi, pi) in &cases {
        let halves = &inputs[bi];
        let mut want = Vec::new();
        for (acts, pairs) in halves {
            let mut w = vec![0f32; pairs.len() * n_embd];
            reference.run_experts(layer, acts, pairs, &mut w)?;
            want.extend(w);
        }
        let mut got = vec![0f32; want.len()];
        let b = &transports[t].backends[pi];
        call(b, layer, halves, &mut got)?;
        anyhow::ensure!(
            got.iter()
                .map(|v| v.to_bits())
                .eq(want.iter().map(|v| v.to_bits())),
            "the node's outputs differ from in process"
        );
    }
    let mut samples: Vec<Samples> = (0..cases.len()).map(|_| Samples::default()).collect();
    for _ in 0..a.rounds {
        for (k, &(t, bi, pi)) in cases.iter().enumerate() {
            let halves = &inputs[bi];
            let b = &transports[t].backends[pi];
            let mut out = vec![0f32; halves.iter().map(|h| h.1.len()).sum::<usize>() * n_embd];
            for i in 0..a.iters + 20 {
                let t0 = Instant::now();
                call(b, layer, halves, &mut out)?;
                let us = t0.elapsed().as_secs_f64() * 1e6;
                if i == 19 {
                    b.take_stats();
                }
                if i >= 20 {
                    samples[k].call_us.push(us);
                }
            }
            let st = b.take_stats();
            anyhow::ensure!(st.errors == 0, "{} calls failed", st.errors);
            samples[k].legs.extend(st.legs);
            samples[k]
                .lands_us
                .extend(st.lands_us.iter().map(|&v| v as f64));
        }
    }
    println!(
        "model {} | layer {layer}, n_embd {n_embd}, activations {} | one node, 1 thread, loopback | \
         {} rounds x {} calls per case, interleaved; medians in us",
        path.display(),
        act_ty.name(),
        a.rounds,
        a.iters
    );
    println!(
        "{:>4} | {:>5} | {:>6} | {:>7} | {:>13} | {:>8} | {:>5} | {:>5} | {:>7} | {:>5} | {:>5} | {:>5} | {:>5} | {:>8}",
        "tls", "batch", "path", "req B", "call p10-p90", "call p50", "out", "wait", "compute", "reply", "back", "wake", "land", "software"
    );
    for (k, &(t, bi, pi)) in cases.iter().enumerate() {
        let s = &mut samples[k];
        let (acts, pairs) = &inputs[bi][0];
        let (p10, p50, p90) = (
            percentile(&mut s.call_us, 0.1),
            percentile(&mut s.call_us, 0.5),
            percentile(&mut s.call_us, 0.9),
        );
        let legs = &s.legs;
        let path = if pi == 0 {
            "direct".to_string()
        } else {
            format!("+{}", a.delays_us[pi - 1])
        };
        let land = if s.lands_us.is_empty() {
            "-".to_string()
        } else {
            format!("{:.0}", percentile(&mut s.lands_us, 0.5))
        };
        println!(
            "{:>4} | {:>5} | {:>6} | {:>7} | {:>5.0}-{:>7.0} | {:>8.0} | {:>5} | {:>5} | {:>7} | {:>5} | {:>5} | {:>5} | {:>5} | {:>8}",
            if transports[t].tls { "on" } else { "off" },
            a.batches[bi],
            path,
            acts.data.len() + 8 * pairs.len(),
            p10,
            p90,
            p50,
            median_of(legs.iter().filter_map(|l| l.out_us)),
            median_of(legs.iter().map(|l| l.node_wait_us)),
            median_of(legs.iter().map(|l| l.compute_us)),
            median_of(legs.iter().map(|l| l.node_reply_us)),
            median_of(legs.iter().filter_map(|l| l.back_us)),
            median_of(legs.iter().map(|l| l.wake_us)),
            land,
            median_of(legs.iter().map(|l| l.total_us.saturating_sub(l.compute_us))),
        );
    }
    println!(
        "call: the calling thread's view (the engine's), a layer's calls (two halves above batch 1); \
         req B: one call's request; out .. wake: the legs of the stream calls (CallLegs); land: its round's last answer -> the calling thread; software: a call's \
         total minus its node's compute (above batch 1 with the second half's wait behind the first \
         on the one-thread node)"
    );
    Ok(())
}
