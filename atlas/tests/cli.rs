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

#[test]
fn synth_report_plan_report() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let o = run(
        &[
            "synth",
            "--layers",
            "4",
            "--experts",
            "32",
            "--top-k",
            "4",
            "-o",
            "a.atlas",
        ],
        d,
    );
    assert!(o.status.success(), "{:?}", text(&o));
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
    let o = run(
        &[
            "synth",
            "--layers",
            "2",
            "--experts",
            "8",
            "--top-k",
            "2",
            "-o",
            "a.atlas",
        ],
        d,
    );
    assert!(o.status.success(), "{:?}", text(&o));
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
