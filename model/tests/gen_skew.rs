//! `gen-model --routing-skew published` against uniform routing on the tiny shapes of both
//! architectures: running the same prompts, the skewed file's routers concentrate a layer's
//! traffic on fewer experts, repeat the previous token's experts far more often, and pick
//! different hot experts in different layers; the uniform file is byte-identical to the default
//! generation (parity fixtures unchanged).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nightshift_model::gen::{generate, Arch, GenSpec, Preset, QuantMix, RoutingSkew};
use nightshift_model::sampler::argmax;
use nightshift_model::{Engine, EngineOptions, ExpertPair, LocalExperts, Model, RouteObserver};

const TEXTS: [&str; 6] = [
    "Explain how a hash map handles collisions and why the load factor matters.",
    "Write a short story about a lighthouse keeper and the fog that speaks at night.",
    "What were the main causes of the French Revolution? Summarise them briefly.",
    "Give me a recipe for a vegetarian lasagna that can be prepared the day before.",
    "Describe the life cycle of a star like the Sun, from nebula to white dwarf.",
    "How does a TCP connection get established and closed? Walk through the packets.",
];

/// Every MoE layer's expert sets, token by token, and where each sequence starts.
#[derive(Default)]
struct Trace {
    sets: HashMap<usize, Vec<Vec<u32>>>,
    starts: HashMap<usize, Vec<usize>>,
    top_k: usize,
}

struct Obs(Mutex<Trace>);

impl RouteObserver for Obs {
    fn observe(&self, layer: usize, pairs: &[ExpertPair], _w: &[f32]) {
        let mut t = self.0.lock().unwrap();
        let k = t.top_k;
        let sets = t.sets.entry(layer).or_default();
        for row in pairs.chunks(k) {
            sets.push(row.iter().map(|p| p.expert).collect());
        }
    }
}

fn gen(dir: &Path, arch: Arch, routing: RoutingSkew) -> PathBuf {
    let mut spec = GenSpec::new(Preset::Tiny, arch, QuantMix::Q4KM);
    spec.routing = routing;
    let path = dir.join(spec.file_name());
    generate(&spec, &path, &mut |_| {}).expect("generate");
    path
}

/// (mean share of a layer's activations its hottest half takes, share of a token's experts the
/// previous token also chose, mean share of hot-half ids shared between consecutive MoE layers)
fn stats(path: &Path) -> (f64, f64, f64) {
    let model = Model::load(path).expect("model");
    let k = model.config().n_expert_used;
    let n_exp = model.config().n_expert;
    let obs = Arc::new(Obs(Mutex::new(Trace {
        top_k: k,
        ..Trace::default()
    })));
    let mut e = Engine::new(
        model.clone(),
        Arc::new(LocalExperts::new(model.clone(), None)),
        EngineOptions::default(),
    )
    .expect("engine");
    e.set_route_observer(Some(obs.clone() as Arc<dyn RouteObserver>));
    let tok = model.tokenizer();
    for text in TEXTS {
        {
            let mut t = obs.0.lock().unwrap();
            let lens: Vec<(usize, usize)> = t.sets.iter().map(|(&l, s)| (l, s.len())).collect();
            for (l, n) in lens {
                t.starts.entry(l).or_default().push(n);
            }
        }
        let ids = tok.encode(text, tok.add_bos(), false);
        let seq = e.add_sequence().expect("seq");
        let mut logits = e.prefill(seq, &ids).expect("prefill");
        for _ in 0..16 {
            logits = e.prefill(seq, &[argmax(&logits)]).expect("step");
        }
        e.remove_sequence(seq);
    }
    let t = obs.0.lock().unwrap();
    let mut layers: Vec<usize> = t.sets.keys().copied().collect();
    layers.sort_unstable();
    let (mut share, mut lag) = (0.0, (0usize, 0usize));
    let mut halves = Vec::new();
    for l in &layers {
        let sets = &t.sets[l];
        let mut counts = vec![0u64; n_exp];
        for s in sets {
            for &x in s {
                counts[x as usize] += 1;
            }
        }
        let mut ids: Vec<usize> = (0..n_exp).collect();
        ids.sort_by_key(|&i| (std::cmp::Reverse(counts[i]), i));
        let hot: u64 = ids[..n_exp / 2].iter().map(|&i| counts[i]).sum();
        share += hot as f64 / counts.iter().sum::<u64>() as f64;
        let mut half = ids[..n_exp / 2].to_vec();
        half.sort_unstable();
        halves.push(half);
        let starts = t.starts.get(l).cloned().unwrap_or_default();
        for i in 1..sets.len() {
            if starts.contains(&i) {
                continue;
            }
            lag.0 += sets[i].iter().filter(|x| sets[i - 1].contains(x)).count();
            lag.1 += k;
        }
    }
    let across: Vec<f64> = halves
        .windows(2)
        .map(|w| w[1].iter().filter(|x| w[0].contains(x)).count() as f64 / w[0].len() as f64)
        .collect();
    (
        share / layers.len() as f64,
        lag.0 as f64 / lag.1 as f64,
        across.iter().sum::<f64>() / across.len().max(1) as f64,
    )
}

fn check(arch: Arch) {
    let dir = tempfile::tempdir().expect("tempdir");
    let uniform = gen(dir.path(), arch, RoutingSkew::Uniform);
    let skewed = gen(dir.path(), arch, RoutingSkew::Published);
    assert_ne!(uniform, skewed, "the routing is part of the file name");
    let (us, ul, _) = stats(&uniform);
    let (ss, sl, sx) = stats(&skewed);
    eprintln!(
        "{}: hottest half {us:.3} -> {ss:.3}, previous token {ul:.3} -> {sl:.3}, hot halves shared across layers {sx:.3}",
        arch.name()
    );
    assert!(ss > us + 0.05, "{}: skew {us} -> {ss}", arch.name());
    assert!(sl > ul + 0.15, "{}: locality {ul} -> {sl}", arch.name());
    assert!(
        sx < 0.9,
        "{}: every layer has the same hot experts ({sx})",
        arch.name()
    );
}

#[test]
fn skewed_routing_is_skewed_and_local_qwen3moe() {
    check(Arch::Qwen3Moe);
}

#[test]
fn skewed_routing_is_skewed_and_local_deepseek2() {
    check(Arch::Deepseek2);
}

#[test]
fn uniform_routing_is_the_default_and_unchanged() {
    let spec = GenSpec::new(Preset::Tiny, Arch::Qwen3Moe, QuantMix::Q4KM);
    assert_eq!(spec.routing, RoutingSkew::Uniform);
    assert!(!spec.file_name().contains("-r"), "{}", spec.file_name());
    let mut skew = spec.clone();
    skew.routing = RoutingSkew::Published;
    assert!(
        skew.file_name().contains("-rpublished"),
        "{}",
        skew.file_name()
    );
}
