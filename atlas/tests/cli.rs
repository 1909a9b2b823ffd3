//! End-to-end tests of the `nightshift-atlas` binary: synth → report (table + PNG/SVG) → plan →
//! report --placement, and the failure paths of `plan` (infeasible or corrupt input: clear error,
//! no file written).

use std::path::Path;
use std::process::{Command, Output};

use nightshift_atlas::placement::{ModelShape, Placement};
use nightshift_atlas::trace::Atlas;

fn run(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nightshift-atlas"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the binary runs")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn nodes_toml(n: usize, memory: u64) -> String {
    (0..n)
        .map(|i| {
            format!(
                "[[node]]\nname = \"node{i}\"\naddr = \"127.0.0.1:{}\"\nmemory_bytes = {memory}\n",
                50051 + i
            )
        })
        .collect()
}

/// `synth` of `layers` x `experts`, `top_k`, written to `name` in `d`.
fn synth(d: &Path, layers: usize, experts: usize, top_k: usize, name: &str) {
    let (l, e, k) = (layers.to_string(), experts.to_string(), top_k.to_string());
    let o = run(
        &[
            "synth",
            "--layers",
            &l,
            "--experts",
            &e,
            "--top-k",
            &k,
            "-o",
            name,
        ],
        d,
    );
    assert!(o.status.success(), "{:?}", text(&o));
}

#[test]
fn synth_report_plan_report() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    synth(d, 4, 32, 4, "a.atlas");
    let atlas = Atlas::load(&d.join("a.atlas")).unwrap();
    assert_eq!(atlas.shape.moe_layers, vec![1, 2, 3, 4]);

    let o = run(&["report", "a.atlas", "--out", "pics"], d);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("coverage: the hottest 50% of experts take"),
        "{out}"
    );
    for name in ["heatmap", "coverage"] {
        let png = std::fs::read(d.join(format!("pics/{name}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let svg = std::fs::read_to_string(d.join(format!("pics/{name}.svg"))).unwrap();
        assert!(
            svg.contains("<svg") && svg.contains("<text"),
            "{name}.svg has no text"
        );
    }

    std::fs::write(d.join("nodes.toml"), nodes_toml(4, 0)).unwrap();
    let o = run(
        &[
            "plan",
            "--atlas",
            "a.atlas",
            "--nodes",
            "nodes.toml",
            "--replicas",
            "3",
            "-o",
            "p.toml",
        ],
        d,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("round-robin") && out.contains("expected max/mean load"),
        "{out}"
    );
    let p = Placement::load(&d.join("p.toml")).unwrap();
    p.validate(&atlas.shape).unwrap();
    assert_eq!(p.nodes[2].addr.as_deref(), Some("127.0.0.1:50053"));

    let o = run(
        &[
            "plan",
            "--atlas",
            "a.atlas",
            "--nodes",
            "nodes.toml",
            "--previous",
            "p.toml",
            "--replica-memory",
            "5%",
            "-o",
            "p2.toml",
        ],
        d,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("bytes to move from --previous"), "{out}");

    let o = run(
        &[
            "report",
            "a.atlas",
            "--placement",
            "p.toml",
            "--out",
            "pics",
        ],
        d,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("load imbalance (max/mean): per-step"), "{out}");
}

#[test]
fn plan_failures_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    synth(d, 2, 8, 2, "a.atlas");
    let expert_bytes = Atlas::load(&d.join("a.atlas")).unwrap().shape.expert_bytes;
    std::fs::write(d.join("nodes.toml"), nodes_toml(2, 0)).unwrap();
    // room for one copy only: a replicated (hot) copy cannot be resident
    std::fs::write(d.join("tiny.toml"), nodes_toml(2, expert_bytes)).unwrap();
    let mut corrupt = std::fs::read(d.join("a.atlas")).unwrap();
    let last = corrupt.len() - 3;
    corrupt[last] ^= 0x20;
    std::fs::write(d.join("corrupt.atlas"), corrupt).unwrap();
    let other = ModelShape {
        moe_layers: vec![1, 2],
        n_experts: 9,
        expert_bytes,
    };
    let nodes = Placement::nodes_from_toml_str(&nodes_toml(2, 0)).unwrap();
    // explicit tables for 9 experts (a round-robin file would fit any shape)
    let layers = Placement::round_robin(nodes.clone(), &other.moe_layers, 9)
        .layers()
        .to_vec();
    Placement::from_layers(nodes, layers)
        .unwrap()
        .save_atomic(&d.join("other.toml"))
        .unwrap();
    // Counts crafted to overflow a 64-bit sum (a Gini of 15.9 before they were checked).
    let mut huge = Atlas::load(&d.join("a.atlas")).unwrap();
    huge.all_time.activations[0][0] = u64::MAX;
    huge.all_time.activations[0][1] = u64::MAX;
    std::fs::write(d.join("overflow.atlas"), huge.to_bytes()).unwrap();
    std::fs::write(
        d.join("bad-nodes.toml"),
        "[[node]]\nname = \"a\"\nram = 3\n",
    )
    .unwrap();

    let rows: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "--atlas",
                "a.atlas",
                "--nodes",
                "tiny.toml",
                "--replicas",
                "2",
            ],
            "cannot keep its",
        ),
        (
            vec!["--atlas", "corrupt.atlas", "--nodes", "nodes.toml"],
            "atlas body corrupt",
        ),
        (
            vec!["--atlas", "missing.atlas", "--nodes", "nodes.toml"],
            "cannot access atlas file",
        ),
        (
            vec!["--atlas", "overflow.atlas", "--nodes", "nodes.toml"],
            "fits in 64 bits",
        ),
        (
            vec![
                "--atlas",
                "a.atlas",
                "--nodes",
                "nodes.toml",
                "--previous",
                "other.toml",
            ],
            "expected replicas for 8 experts, found 9",
        ),
        (
            vec![
                "--atlas",
                "a.atlas",
                "--nodes",
                "nodes.toml",
                "--replicas",
                "9",
            ],
            "can hold at most 8",
        ),
        (
            vec!["--atlas", "a.atlas", "--nodes", "bad-nodes.toml"],
            "unknown field `ram`",
        ),
        (
            vec![
                "--atlas",
                "a.atlas",
                "--nodes",
                "nodes.toml",
                "--replica-memory",
                "12 parsecs",
            ],
            "expected a unit",
        ),
    ];
    for (args, expect) in rows {
        let mut all = vec!["plan"];
        all.extend(&args);
        all.extend(["-o", "out.toml"]);
        let o = run(&all, d);
        let (_, err) = text(&o);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(
            err.contains(expect),
            "{args:?}: expected {expect:?} in {err}"
        );
        assert!(!d.join("out.toml").exists(), "{args:?} wrote a file");
    }
}

#[test]
fn simulate_prints_ours_and_round_robin() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(
        &[
            "simulate",
            "--layers",
            "4",
            "--experts",
            "64",
            "--nodes",
            "2,4",
        ],
        dir.path(),
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("round-robin")
            && out
                .lines()
                .filter(|l| l.trim_start().starts_with(['2', '4']))
                .count()
                == 2,
        "{out}"
    );
}

/// An atlas of 4 MoE layers x 32 experts, top-4, whose counts and decode trace are `tokens`
/// (per token, per layer, 4 expert ids).
fn traced_atlas(d: &Path, name: &str, tokens: &[Vec<[u16; 4]>]) {
    synth(d, 4, 32, 4, name);
    let mut a = Atlas::load(&d.join(name)).unwrap();
    let mut t = nightshift_atlas::trace::TemporalTracker::new(4, 4).snapshot();
    for row in &mut a.all_time.activations {
        row.iter_mut().for_each(|c| *c = 0);
    }
    a.all_time.tokens = tokens.len() as u64;
    for tok in tokens {
        for (s, ids) in tok.iter().enumerate() {
            t.trace[s].extend_from_slice(ids);
            for &e in ids {
                a.all_time.activations[s][e as usize] += 1;
            }
        }
    }
    a.window = a.all_time.clone();
    a.temporal = Some(t);
    a.save_atomic(&d.join(name)).unwrap();
}

fn resident_count(p: &Path) -> usize {
    let p = Placement::load(p).unwrap();
    p.experts_on(&p.nodes[0].name)
        .unwrap()
        .iter()
        .filter(|s| s.resident)
        .count()
}

/// `plan --memory-budget` replays the recorded decode routing: where experts come in topics that
/// last a while, an LRU of the budget finds more of them than the hottest set by count, so most
/// of the budget is left to the staging cache; where every token draws its experts afresh from a
/// skewed distribution, the hottest set wins and the whole budget stays resident.
#[test]
fn plan_splits_the_budget_by_replaying_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) % n
    };
    // 8 topics, each 4 experts per layer (disjoint); 4 phases of 256 tokens, each alternating
    // between two topics every 16 tokens (a topic comes back while an LRU still holds it)
    let topical: Vec<Vec<[u16; 4]>> = (0..1024)
        .map(|t| {
            let topic = (t / 256 * 2 + t / 16 % 2) as u16;
            (0..4)
                .map(|_| [0, 1, 2, 3].map(|i| topic * 4 + i))
                .collect()
        })
        .collect();
    // every token draws 4 distinct experts per layer, expert i with weight ~ 1 / (i + 1)
    let skewed: Vec<Vec<[u16; 4]>> = (0..1024)
        .map(|_| {
            (0..4)
                .map(|_| {
                    let mut ids = [u16::MAX; 4];
                    let mut n = 0;
                    while n < 4 {
                        // inverse of a harmonic-like CDF: small ids far more often
                        let u = next(1 << 20) as f64 / (1 << 20) as f64;
                        let e = ((33f64.powf(u) - 1.0) as u16).min(31);
                        if !ids.contains(&e) {
                            ids[n] = e;
                            n += 1;
                        }
                    }
                    ids
                })
                .collect()
        })
        .collect();
    traced_atlas(d, "topical.atlas", &topical);
    traced_atlas(d, "skewed.atlas", &skewed);
    // 25% of the 128 experts: 32
    for (atlas, out) in [("topical.atlas", "t.toml"), ("skewed.atlas", "s.toml")] {
        let o = run(
            &[
                "plan",
                "--atlas",
                atlas,
                "--memory-budget",
                "25%",
                "-o",
                out,
            ],
            d,
        );
        let (stdout, err) = text(&o);
        assert!(o.status.success(), "{stdout}\n{err}");
        assert!(
            stdout.contains("replaying 1024 recorded decode tokens"),
            "{stdout}"
        );
        assert!(stdout.contains("resident share:"), "{stdout}");
        // the oracle's reads per token (same memory, the future known) bound every split's
        let reads = |first: &str| -> Vec<f64> {
            stdout
                .lines()
                .map(str::split_whitespace)
                .filter_map(|mut w| {
                    let head = w.next()?;
                    let is_row = if first == "oracle" {
                        head == "oracle"
                    } else {
                        head.ends_with('%')
                    };
                    let cols: Vec<&str> = std::iter::once(head).chain(w).collect();
                    is_row.then(|| cols.get(4)?.parse().ok()).flatten()
                })
                .collect()
        };
        let (splits, oracle) = (reads("split"), reads("oracle"));
        assert_eq!((splits.len(), oracle.len()), (9, 1), "{stdout}");
        let least = splits.iter().copied().fold(f64::INFINITY, f64::min);
        assert!(oracle[0] <= least && oracle[0] > 0.0, "{stdout}");
        // the placement names the whole budget as the node's memory
        let p = Placement::load(&d.join(out)).unwrap();
        let eb = Atlas::load(&d.join(atlas)).unwrap().shape.expert_bytes;
        assert_eq!(p.nodes[0].memory_bytes, 32 * eb, "{stdout}");
    }
    let topical_resident = resident_count(&d.join("t.toml"));
    let skewed_resident = resident_count(&d.join("s.toml"));
    assert!(topical_resident <= 8, "topics: {topical_resident} resident");
    assert!(skewed_resident >= 24, "skewed: {skewed_resident} resident");
    // a fixed share is taken as given; 100% is the whole budget resident
    let share = |share: &str, out: &str| {
        run(
            &[
                "plan",
                "--atlas",
                "topical.atlas",
                "--memory-budget",
                "25%",
                "--resident-share",
                share,
                "-o",
                out,
            ],
            d,
        )
    };
    let o = share("100%", "full.toml");
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(resident_count(&d.join("full.toml")), 32);
    std::fs::write(d.join("nodes.toml"), nodes_toml(2, 0)).unwrap();
    let o = run(
        &[
            "plan",
            "--atlas",
            "topical.atlas",
            "--nodes",
            "nodes.toml",
            "--resident-share",
            "50%",
            "-o",
            "bad.toml",
        ],
        d,
    );
    let (_, err) = text(&o);
    assert!(
        !o.status.success() && err.contains("take --memory-budget"),
        "{err}"
    );
    // each node's budget splits the same way (nodes lend their staging cache what their
    // resident experts leave): 12.5% each, 25% over both, and per node the topics' experts fit
    // its LRU
    let nodes_plan = |extra: &[&str], out: &str| {
        let mut args = vec![
            "plan",
            "--atlas",
            "topical.atlas",
            "--nodes",
            "nodes.toml",
            "--memory-budget",
            "12.5%",
            "-o",
            out,
        ];
        args.extend_from_slice(extra);
        run(&args, d)
    };
    let o = nodes_plan(&[], "n.toml");
    let (stdout, err) = text(&o);
    assert!(o.status.success(), "{stdout}\n{err}");
    assert!(stdout.contains("over all nodes"), "{stdout}");
    let p = Placement::load(&d.join("n.toml")).unwrap();
    let eb = Atlas::load(&d.join("topical.atlas"))
        .unwrap()
        .shape
        .expert_bytes;
    let mut resident = 0;
    for n in &p.nodes {
        assert_eq!(
            n.memory_bytes,
            16 * eb,
            "every node's memory is its whole budget"
        );
        let slots = p.experts_on(&n.name).unwrap();
        assert!(slots.len() >= 32, "{}: holds {}", n.name, slots.len());
        resident += slots.iter().filter(|s| s.resident).count();
    }
    // (the whole budget resident would be 32)
    assert!(
        resident <= 16,
        "topics over 2 nodes: {resident} resident\n{stdout}"
    );
    // extra copies keep the whole budget resident; a fixed share with them is refused
    let o = nodes_plan(&["--replicas", "1"], "r.toml");
    let (stdout, err) = text(&o);
    assert!(o.status.success(), "{stdout}\n{err}");
    assert!(stdout.contains("extra copies asked for"), "{stdout}");
    let o = nodes_plan(&["--replicas", "1", "--resident-share", "50%"], "bad.toml");
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("--replicas"), "{err}");
    let o = share("150%", "bad.toml");
    let (_, err) = text(&o);
    assert!(
        !o.status.success() && err.contains("--resident-share"),
        "{err}"
    );
    assert!(!d.join("bad.toml").exists());
}

/// A report piped into a reader that is gone (`| head`) ends quietly on SIGPIPE, as other tools
/// do, instead of panicking on the failed write.
#[test]
fn a_closed_stdout_ends_the_report_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    synth(d, 2, 8, 2, "a.atlas");
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let o = Command::new(env!("CARGO_BIN_EXE_nightshift-atlas"))
        .args(["report", "a.atlas"])
        .current_dir(d)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("the binary runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    // ended by SIGPIPE (13 on Linux), not a panic's exit status
    assert_eq!(o.status.signal(), Some(13), "{:?}: {err}", o.status);
}
