//! The capacity planner (`nightshift_coordinator::plan`): the shipped VM table is complete and
//! bad tables, atlases, calibrations and presets are clear errors; a preset's sizes are the
//! published ones and the same as the file `gen-model` writes for it; the cost model's terms
//! move the way the deployment does (more round trip: slower; overlap: never slower; bytes per
//! token: the wire format's; a large answer's wire time partly hidden behind the nodes'
//! compute). No timing is asserted: the calibration is given, not measured.

use nightshift_atlas_core::placement::ModelShape;
use nightshift_atlas_core::trace::{Atlas, Counts};
use nightshift_coordinator::plan::{
    Calibration, ModelCost, Routing, Scenario, VmTable, CALL_HEADER_BYTES, PAIR_BYTES,
};
use nightshift_model::gen::{self, Arch, GenSpec, Preset, QuantMix};

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("nightshift-plan-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("tmp dir");
    d.join(name)
}

fn cal(m: &ModelCost) -> Calibration {
    Calibration {
        expert: Calibration::key(m),
        threads: 2,
        stream_gbs: 20.0,
        ffn_gbs: 15.0,
        ffn_byte_rows_per_core: 40e9,
    }
}

#[test]
fn the_shipped_vm_table_has_cobalt_and_graviton4_sizes_with_sources() {
    let t = VmTable::builtin().expect("built-in table");
    for name in [
        "Standard_D64ps_v6",
        "Standard_E96ps_v6",
        "Standard_E32ps_v6",
        "r8g.24xlarge",
    ] {
        let v = t.get(name).expect(name);
        assert!(v.sources.price.contains("http"), "{name}: {:?}", v.sources);
        assert!(v.sources.mem_bw.contains("http"), "{name}: {:?}", v.sources);
    }
    assert!(t.get("Standard_D96ps_v6").expect("d96").cores == 96);
    let e = t.get("m9x.huge").expect_err("unknown vm").to_string();
    assert!(
        e.contains("expected one of") && e.contains("m9x.huge"),
        "{e}"
    );
}

#[test]
fn bad_vm_tables_are_clear_errors() {
    let row = |extra: &str, cores: &str, sources: &str| {
        format!(
            "[[vm]]\nname = \"a\"\nfamily = \"f\"\ncores = {cores}\nmemory_gib = 8.0\nmem_bw_gbs = 10.0\n\
             net_gbps = 10.0\nusd_per_hour = 0.1\n{extra}[vm.sources]\n{sources}"
        )
    };
    let all = "cores = \"u\"\nmemory = \"u\"\nmem_bw = \"u\"\nnet = \"u\"\nprice = \"u\"\n";
    VmTable::parse(&row("", "4", all), "t").expect("a good row");
    let check = |text: String, want: &str| {
        let e = VmTable::parse(&text, "t").expect_err(want).to_string();
        assert!(e.contains(want), "{e:?} should contain {want:?}");
    };
    check(row("", "4", "cores = \"u\"\n"), "missing field `memory`");
    check(
        row("", "4", &all.replace("price = \"u\"", "price = \" \"")),
        "expected a source for price",
    );
    check(row("", "0", all), "expected cores to be a positive number");
    check(
        row("", "4", all).replace("mem_bw_gbs = 10.0", "mem_bw_gbs = -1.0"),
        "expected mem_bw_gbs to be a positive number",
    );
    check(
        format!("{}\n{}", row("", "4", all), row("", "4", all)),
        "listed twice",
    );
    check(row("colour = 1\n", "4", all), "unknown field `colour`");
    check(String::new(), "missing field `vm`");
    check(format!("{}x = \"a \"b\"\n", row("", "4", all)), "line 15:");
    let path = tmp("nope.toml");
    let e = VmTable::load(&path).expect_err("missing file").to_string();
    assert!(e.contains("cannot read it"), "{e}");
}

#[test]
fn presets_have_the_published_sizes() {
    // unsloth/Kimi-K2-Instruct-GGUF: UD-Q2_K_XL is 381 GB
    // (https://docs.unsloth.ai/basics/kimi-k2-how-to-run-locally)
    let k2 = ModelCost::from_preset("kimi-k2", "UD-Q2_K_XL").expect("k2");
    let gb = k2.total_bytes() as f64 / 1e9;
    assert!((362.0..400.0).contains(&gb), "K2 UD-Q2_K_XL: {gb} GB");
    assert_eq!(
        (k2.n_layer, k2.moe_layers, k2.n_expert, k2.n_used),
        (61, 60, 384, 8)
    );
    let iq1 = ModelCost::from_preset("kimi-k2", "UD-IQ1_S").expect("k2 iq1");
    assert!(iq1.expert_bytes < k2.expert_bytes && iq1.total_bytes() < k2.total_bytes());
    let v3 = ModelCost::from_preset("deepseek-v3", "Q4_K_M").expect("v3");
    assert_eq!((v3.n_layer, v3.moe_layers, v3.n_expert), (61, 58, 256));
    let q = ModelCost::from_preset("qwen3-30b-a3b", "Q4_K_M").expect("qwen");
    assert_eq!(
        (q.moe_layers, q.n_expert, q.n_used, q.shared_bytes),
        (48, 128, 8, 0)
    );
    for (preset, quant, want) in [
        ("kimi-k3", "Q2_K", "expected preset"),
        ("kimi-k2", "Q5_K", "expected quant"),
        ("tiny", "Q2_K", "real model's shape"),
        (
            "qwen3-0.6b",
            "Q4_K_M",
            "expected a mixture-of-experts model",
        ),
    ] {
        let e = ModelCost::from_preset(preset, quant)
            .expect_err(want)
            .to_string();
        assert!(
            e.contains(want),
            "{preset} {quant}: {e:?} should contain {want:?}"
        );
    }
}

#[test]
fn a_preset_costs_what_its_generated_file_costs() {
    for arch in [Arch::Deepseek2, Arch::Qwen3Moe] {
        let spec = GenSpec::new(Preset::Tiny, arch, QuantMix::Q4KM);
        let path = tmp(&spec.file_name());
        gen::generate(&spec, &path, &mut |_| {}).expect("generate");
        let from_file = ModelCost::from_gguf(&path).expect("from file");
        let from_spec = ModelCost::from_spec(&spec).expect("from spec");
        assert_eq!(
            ModelCost {
                name: String::new(),
                ..from_file
            },
            ModelCost {
                name: String::new(),
                ..from_spec
            },
            "{arch:?}"
        );
        let _ = std::fs::remove_file(&path);
    }
}

/// A preset's cost, this file's calibration, uniform routing and the shipped VM table.
fn preset_setup(preset: &str, quant: &str) -> (ModelCost, Calibration, Routing, VmTable) {
    let m = ModelCost::from_preset(preset, quant).expect(preset);
    let c = cal(&m);
    let r = Routing::uniform(m.n_expert, m.n_used);
    (m, c, r, VmTable::builtin().expect("table"))
}

fn k2_scenario<'a>(
    m: &'a ModelCost,
    r: &'a Routing,
    c: &'a Calibration,
    vm: &'a nightshift_coordinator::plan::Vm,
    batch: usize,
    rtt_us: f64,
    overlap: bool,
) -> Scenario<'a> {
    Scenario {
        model: m,
        routing: r,
        cal: c,
        coordinator: vm,
        node: vm,
        nodes: Scenario::min_nodes(m, vm),
        batch,
        rtt: rtt_us * 1e-6,
        call_overhead: 50e-6,
        context: 4096,
        kv_elem_bytes: 4.0,
        prefill_chunk: 512,
        overlap,
        micro_batches: overlap,
        shared_cores: false,
    }
}

#[test]
fn the_cost_model_moves_the_way_the_deployment_does() {
    let (m, c, r, t) = preset_setup("kimi-k2", "UD-Q2_K_XL");
    let vm = t.get("Standard_E32ps_v6").expect("vm");
    let base = k2_scenario(&m, &r, &c, vm, 1, 100.0, true);
    assert!(base.nodes >= 2, "{} nodes", base.nodes);
    let p = base.predict();
    assert!(
        p.fits && p.decode_tok_s > 0.0 && p.prefill_tok_s > 0.0,
        "{p:?}"
    );
    let slow = k2_scenario(&m, &r, &c, vm, 1, 400.0, true).predict();
    assert!(slow.decode_tok_s < p.decode_tok_s);
    // 300 us more per round trip on each of 60 layers
    assert!(
        (slow.step - p.step - 60.0 * 300e-6).abs() < 1e-9,
        "{} vs {}",
        slow.step,
        p.step
    );
    let plain = k2_scenario(&m, &r, &c, vm, 1, 100.0, false).predict();
    assert!(plain.step >= p.step && p.step_hidden > 0.0 && plain.step_hidden.abs() < 1e-12);
    let b8 = k2_scenario(&m, &r, &c, vm, 8, 100.0, true).predict();
    assert!(
        b8.decode_tok_s > p.decode_tok_s,
        "batching amortises the weights and round trips"
    );
    let one_batch = Scenario {
        micro_batches: false,
        ..k2_scenario(&m, &r, &c, vm, 8, 100.0, true)
    }
    .predict();
    assert!(
        one_batch.step >= b8.step,
        "micro-batches hide more: {one_batch:?} vs {b8:?}"
    );
    // batch 1: every pair returns one f32 row; each node touched gets the row once, its
    // pairs' indices and a header
    let mut want = 0.0;
    for l in r.node_loads(0, base.nodes, 1) {
        want +=
            l.rows * m.act_row_bytes as f64 + l.pairs * PAIR_BYTES + l.called * CALL_HEADER_BYTES;
    }
    want += (m.n_used * m.n_embd * 4) as f64;
    let per_token = want * m.moe_layers as f64;
    assert!(
        (p.bytes_per_token - per_token).abs() < 1e-6 * per_token,
        "{} vs {per_token}",
        p.bytes_per_token
    );
    // too few nodes: the experts do not fit
    let tight = Scenario {
        nodes: 1,
        ..k2_scenario(&m, &r, &c, vm, 1, 100.0, true)
    };
    assert!(!tight.predict().fits);
    // skew concentrates the load: the busiest node reads more, the step gets longer at batch 8
    let z = Routing::zipf(m.n_expert, m.n_used, 1.2).expect("zipf");
    let skewed = k2_scenario(&m, &z, &c, vm, 8, 100.0, true).predict();
    assert!(skewed.step_nodes != b8.step_nodes);
}

#[test]
fn routing_comes_from_an_atlas_of_the_same_model() {
    let shape = ModelShape {
        moe_layers: vec![1, 2],
        n_experts: 4,
        expert_bytes: 1,
    };
    let mut a = Atlas::empty("t", shape, 2, 64);
    a.all_time = Counts {
        tokens: 10,
        activations: vec![vec![10, 10, 0, 0], vec![5, 5, 5, 5]],
        weight_sums: vec![vec![1.0; 4]; 2],
    };
    let path = tmp("a.atlas");
    a.save_atomic(&path).expect("save");
    let r = Routing::from_atlas(&path, 4, 2).expect("atlas");
    assert_eq!(r.q, vec![vec![1.0, 1.0, 0.0, 0.0], vec![0.5; 4]]);
    // layer 0 only ever uses experts 0 and 1, one on each of 2 nodes: both always called
    let l = r.node_loads(0, 2, 3);
    assert!((l[0].experts - 1.0).abs() < 1e-12 && (l[0].rows - 3.0).abs() < 1e-12);
    let e = Routing::from_atlas(&path, 8, 2)
        .expect_err("wrong model")
        .to_string();
    assert!(
        e.contains("expected an atlas of a model with 8 experts"),
        "{e}"
    );
    std::fs::write(&path, "NSATLAS nope").expect("write");
    assert!(Routing::from_atlas(&path, 4, 2).is_err());
}

#[test]
fn a_saved_calibration_must_match_the_model() {
    let k2 = ModelCost::from_preset("kimi-k2", "UD-Q2_K_XL").expect("k2");
    let v3 = ModelCost::from_preset("deepseek-v3", "Q4_K_M").expect("v3");
    let path = tmp("cal.toml");
    cal(&k2).save(&path).expect("save");
    assert_eq!(Calibration::load(&path, &k2).expect("load"), cal(&k2));
    let e = Calibration::load(&path, &v3)
        .expect_err("other experts")
        .to_string();
    assert!(e.contains("expected a calibration of Q4_K/Q6_K"), "{e}");
    let text = std::fs::read_to_string(&path)
        .expect("read")
        .replace("stream_gbs = 20.0", "stream_gbs = 0.0");
    std::fs::write(&path, text).expect("write");
    let e = Calibration::load(&path, &k2).expect_err("zero").to_string();
    assert!(e.contains("expected stream_gbs > 0"), "{e}");
}

#[test]
fn a_measured_calibration_is_positive_and_names_its_experts() {
    let spec = GenSpec::new(Preset::Tiny, Arch::Qwen3Moe, QuantMix::Q4KM);
    let m = ModelCost::from_spec(&spec).expect("tiny");
    let c = Calibration::measure(&m, 1, 8).expect("measure");
    assert_eq!(c.expert, Calibration::key(&m));
    assert!(
        c.stream_gbs > 0.0 && c.ffn_gbs > 0.0 && c.ffn_byte_rows_per_core > 0.0,
        "{c:?}"
    );
    assert!(c.efficiency() > 0.0 && c.efficiency() <= 1.0);
}

#[test]
fn nodes_on_one_machine_share_its_memory_bandwidth() {
    let (m, c, r, t) = preset_setup("qwen3-30b-a3b", "Q4_K_M");
    let vm = t.get("Standard_E32ps_v6").expect("vm");
    let bw = vm.mem_bw_gbs * 1e9 * c.efficiency();
    for nodes in [2, 3, 4] {
        for batch in [1, 8] {
            let apart = Scenario {
                nodes,
                ..k2_scenario(&m, &r, &c, vm, batch, 100.0, false)
            };
            let together = Scenario {
                shared_cores: true,
                ..apart.clone()
            };
            let loads = r.node_loads(0, nodes, batch);
            let all: f64 = loads.iter().map(|l| l.experts).sum::<f64>() * m.expert_bytes as f64;
            let (a, s) = (apart.node_time(0, batch), together.node_time(0, batch));
            // apart: the slowest node alone, well under all bytes over one machine's bandwidth
            assert!(
                a < 0.8 * all / bw,
                "{nodes} nodes, batch {batch}: {a} vs {}",
                all / bw
            );
            // together: at least every node's bytes over the one machine's bandwidth
            assert!(
                s >= all / bw * (1.0 - 1e-12),
                "{nodes} nodes, batch {batch}: {s}"
            );
            assert!(s > a);
        }
    }
}

#[test]
fn shared_cores_hide_only_the_time_nobody_computes() {
    let (m, c, r, t) = preset_setup("kimi-k2", "UD-Q2_K_XL");
    let vm = t.get("Standard_E32ps_v6").expect("vm");
    let (own, shared_layer) = (0.02, 1e-3);
    for rtt_us in [100.0, 20_000.0] {
        let apart = k2_scenario(&m, &r, &c, vm, 8, rtt_us, true);
        let together = Scenario {
            shared_cores: true,
            ..apart.clone()
        };
        let (a, s) = (
            apart.step_time(own, shared_layer),
            together.step_time(own, shared_layer),
        );
        // never faster; at least every core's work one after the other
        assert!(s >= a, "{s} vs {a}");
        let l = m.moe_layers;
        let busy: f64 = (0..l)
            .map(|i| together.node_time(i, 4) * 2.0 + together.call_overhead * 2.0)
            .sum();
        assert!(s >= own + busy - 1e-12, "{s} vs {}", own + busy);
        if rtt_us > 1e4 {
            // a 20 ms round trip outweighs all compute: both hide the same compute behind it,
            // and differ only by the nodes' FFN on one machine's bandwidth
            let slower: f64 = (0..l)
                .map(|i| together.remote_time(i, 4) - apart.remote_time(i, 4))
                .sum();
            assert!(slower >= 0.0, "{slower}");
            assert!((s - a - slower).abs() < 1e-9, "{s} vs {a} + {slower}");
        } else {
            assert!(
                s > a,
                "at 100 us the compute no longer overlaps: {s} vs {a}"
            );
        }
        // without micro-batches the shared expert hides only the idle part of the call
        let one = |shared_cores| Scenario {
            micro_batches: false,
            shared_cores,
            ..apart.clone()
        };
        let big_shared = 1.0;
        let (a1, s1) = (
            one(false).step_time(own, big_shared),
            one(true).step_time(own, big_shared),
        );
        let idle: f64 = (0..l).map(|i| one(true).idle_time(i, 8)).sum();
        let remote: f64 = (0..l).map(|i| one(true).remote_time(i, 8)).sum();
        assert!((a1 - own).abs() < 1e-9, "all hidden apart: {a1}");
        assert!((s1 - (own + remote - idle)).abs() < 1e-9, "{s1}");
    }
}

#[test]
fn rows_past_a_weights_first_add_their_compute_to_its_read() {
    // Weights stream once for the first row (the batch-1 rate, its compute included) and every
    // further row computes on top: the two add up, neither hides the other (a K2-shaped layer's
    // experts at batch 8 measured 1.6x the larger of the two).
    let (m, c, r, t) = preset_setup("kimi-k2", "UD-Q2_K_XL");
    let vm = t.get("Standard_E32ps_v6").expect("vm");
    let eb = m.expert_bytes as f64;
    let bw = vm.mem_bw_gbs * 1e9 * c.efficiency();
    let rate = c.ffn_byte_rows_per_core * f64::from(vm.cores);
    let mut last = 0.0;
    for batch in [1, 2, 8, 64] {
        let s = k2_scenario(&m, &r, &c, vm, batch, 100.0, false);
        let loads = r.node_loads(0, s.nodes, batch);
        let (read, extra) = loads
            .iter()
            .map(|l| (l.experts * eb / bw, (l.pairs - l.experts) * eb / rate))
            .fold((0.0f64, 0.0f64), |(a, b), (x, y)| (a.max(x), b.max(y)));
        let got = s.node_time(0, batch);
        assert!(
            got >= read * (1.0 - 1e-12),
            "batch {batch}: {got} < read {read}"
        );
        if batch == 1 {
            assert!(
                extra < 1e-9 * read,
                "batch 1 has one row per expert: {extra}"
            );
        } else {
            assert!(
                got > read + 0.5 * extra && extra > 0.0,
                "batch {batch}: {got} vs read {read} + rows {extra}"
            );
        }
        assert!(got > last, "batch {batch}: {got} after {last}");
        last = got;
        // the coordinator's dense weights (shared experts included) follow the same rule
        let dense = m.dense_bytes as f64;
        let kv = (batch * s.context) as f64 * m.kv_floats_per_pos as f64 * s.kv_elem_bytes / bw;
        let coord = s.predict().step_coordinator - kv;
        let rows = (batch - 1) as f64 * dense / rate;
        assert!(
            coord >= dense / bw * (1.0 - 1e-12) && coord > dense / bw + 0.5 * rows - 1e-15,
            "batch {batch}: coordinator {coord} vs read {} + rows {rows}",
            dense / bw
        );
    }
}

/// A node sends a large answer in parts while it computes (`expert-node/src/parts.rs`): on a
/// slow link the planner hides (k - 1) / k of the smaller of the answer's wire time and the
/// node's FFN, never the round trip or the request's wire; a small answer hides nothing.
#[test]
fn answers_in_parts_hide_their_wire_behind_the_nodes_compute() {
    let (m, c, r, t) = preset_setup("kimi-k2", "UD-Q2_K_XL");
    let mut slow = t.get("Standard_E32ps_v6").expect("vm").clone();
    slow.net_gbps = 0.5;
    let s = k2_scenario(&m, &r, &c, &slow, 8, 100.0, false);
    let (node, b) = (s.node_time(0, 8), s.layer_bytes(0, 8));
    assert!(b.in_max >= 2.0 * 65536.0, "{b:?}");
    let serial = node + s.link_time(&b);
    let hidden = s.answer_overlap(&b, node);
    assert!(hidden > 0.0 && hidden < node, "{hidden} of {node}");
    assert!((s.remote_time(0, 8) - (serial - hidden)).abs() < 1e-12);
    // never below the FFN, the round trip, the call's cost and the request's wire
    let out = b.out_total / (slow.net_gbps * 1e9 / 8.0);
    assert!(s.remote_time(0, 8) >= node + s.rtt + s.call_overhead + out - 1e-12);
    // what was hidden is not idle time either
    assert!((s.idle_time(0, 8) - (s.link_time(&b) - s.call_overhead - hidden)).abs() < 1e-12);
    // a one-token Qwen3 call: 8 rows of 2048 floats over the nodes, below two parts per node
    let (q, qc, qr, _) = preset_setup("qwen3-30b-a3b", "Q4_K_M");
    let vm = t.get("Standard_E32ps_v6").expect("vm");
    let qs = Scenario {
        nodes: 2,
        ..k2_scenario(&q, &qr, &qc, vm, 1, 100.0, false)
    };
    let (qn, qb) = (qs.node_time(0, 1), qs.layer_bytes(0, 1));
    assert_eq!(qs.answer_overlap(&qb, qn), 0.0, "{qb:?}");
    assert!((qs.remote_time(0, 1) - (qn + qs.link_time(&qb))).abs() < 1e-15);
}
