//! Placement tests: good files round-trip, every kind of bad file gives its own exact message
//! (data-driven rows: toml text -> expected error), and shape/capacity validation.

use super::*;

const NODES: &str = r#"version = 1
[[node]]
name = "a"
addr = "127.0.0.1:50051"
memory_bytes = 0
[[node]]
name = "b"
numa = 1
"#;

fn shape() -> ModelShape {
    ModelShape {
        moe_layers: vec![1, 2],
        n_experts: 4,
        expert_bytes: 100,
    }
}

fn explicit() -> String {
    format!(
        "{NODES}[[layer]]\nindex = 1\nreplicas = [[\"a\"], [\"b\"], [\"a\", \"b\"], [\"b\"]]\nresident = [[\"a\"], [], [\"b\"], [\"b\"]]\n\
         [[layer]]\nindex = 2\nreplicas = [[\"b\"], [\"a\"], [\"a\"], [\"b\"]]\n"
    )
}

/// Parses `text` and, if that works, validates it against `shape()`; returns the error message.
fn error_of(text: &str) -> String {
    match Placement::from_toml_str(text).and_then(|p| p.validate(&shape())) {
        Ok(()) => "ok".to_string(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_inputs_give_exact_errors() {
    let layer1 = "[[layer]]\nindex = 1\nreplicas = [[\"a\"], [\"b\"], [\"a\"], [\"b\"]]\n";
    let layer2 = "[[layer]]\nindex = 2\nreplicas = [[\"a\"], [\"b\"], [\"a\"], [\"b\"]]\n";
    let rows: Vec<(String, &str)> = vec![
        (explicit(), "ok"),
        (NODES.to_string(), "ok"),
        (NODES.replace("version = 1\n", "version = 1\nstrategy = \"round-robin\"\n"), "ok"),
        ("".to_string(), "line 1, column 1: missing field `version`"),
        ("version = 2\n[[node]]\nname = \"a\"\n".to_string(), "line 1: version: expected 1, found 2"),
        ("version = 1\nstrategy = \"zipf\"\n[[node]]\nname = \"a\"\n".to_string(),
         "line 2: strategy: expected \"round-robin\", found \"zipf\""),
        (format!("version = 1\nstrategy = \"round-robin\"\n[[node]]\nname = \"a\"\n[[node]]\nname = \"b\"\n{layer1}"),
         "line 8: strategy = \"round-robin\" expects no [[layer]] tables, found 1"),
        ("version = 1\n".to_string(), "expected at least one [[node]], found none"),
        ("version = 1\n[[node]]\nname = \"\"\n".to_string(),
         "line 3: node[0].name: expected a non-empty node name without surrounding spaces, found \"\""),
        ("version = 1\n[[node]]\nname = \"a\"\n[[node]]\nname = \"a\"\n".to_string(),
         "line 5: node[1].name: node \"a\" listed twice (first at node[0].name)"),
        ("version = 1\n[[node]]\nname = \"a\"\naddr = \"localhost\"\n".to_string(),
         "line 4: node[0].addr: expected \"host:port\" with a port in 1..=65535, found \"localhost\""),
        ("version = 1\n[[node]]\nname = \"a\"\naddr = \"h:70000\"\n".to_string(),
         "line 4: node[0].addr: expected \"host:port\" with a port in 1..=65535, found \"h:70000\""),
        ("version = 1\n[[node]]\nname = \"a\"\nmemory_bytes = -1\n".to_string(),
         "line 4, column 16: invalid value: integer `-1`, expected u64"),
        ("version = 1\n[[node]]\nname = \"a\"\nmemroy_bytes = 1\n".to_string(),
         "line 4, column 1: unknown field `memroy_bytes`, expected one of `name`, `addr`, `numa`, `memory_bytes`, `cores`"),
        ("version = 1\n[[node]\nname = \"a\"\n".to_string(), "line 2, column 8: unclosed array table, expected `]`"),
        (format!("{NODES}[[layer]]\nindex = 1\nreplicas = [[\"a\"], [\"c\"], [\"a\"], [\"b\"]]\n{layer2}"),
         "line 11: layer[1].replicas[1]: unknown node \"c\" (nodes: a, b)"),
        (format!("{NODES}[[layer]]\nindex = 1\nreplicas = [[\"a\"], [\"b\", \"b\"], [\"a\"], [\"b\"]]\n{layer2}"),
         "line 11: layer[1].replicas[1]: node \"b\" listed twice for the same expert"),
        (format!("{NODES}[[layer]]\nindex = 1\nreplicas = [[\"a\"], [], [\"a\"], [\"b\"]]\n{layer2}"),
         "line 11: layer[1].replicas[1]: expected at least one node holding this expert, found none"),
        (format!("{NODES}[[layer]]\nindex = 1\nreplicas = [[\"a\"], [\"b\"], [\"a\"], [\"b\"]]\nresident = [[\"b\"], [], [], []]\n{layer2}"),
         "line 12: layer[1].resident[0]: node \"b\" is resident but is not among the expert's replicas"),
        (format!("{NODES}[[layer]]\nindex = 1\nreplicas = [[\"a\"], [\"b\"], [\"a\"], [\"b\"]]\nresident = [[\"a\"]]\n{layer2}"),
         "line 12: layer 1: expected resident to list 4 experts like replicas, found 1"),
        (format!("{NODES}{layer1}{layer1}"), "line 13: layer index 1 appears in two [[layer]] tables"),
        (format!("{NODES}{layer1}{layer2}[[layer]]\nindex = 99999999999\nreplicas = [[\"a\"]]\n"),
         "line 16: layer index: expected at most 65536, found 99999999999"),
        (format!("{NODES}{layer1}"), "layer 2: expected a [[layer]] table for this MoE layer, found none"),
        (format!("{NODES}{layer1}{layer2}[[layer]]\nindex = 0\nreplicas = [[\"a\"]]\n"),
         "layer 0: not a MoE layer of this model (MoE layers: [1, 2])"),
        (format!("{NODES}{layer1}[[layer]]\nindex = 2\nreplicas = [[\"a\"], [\"b\"], [\"a\"]]\n"),
         "layer 2: expected replicas for 4 experts, found 3"),
        (format!("{NODES}{layer1}{layer2}").replace("memory_bytes = 0", "memory_bytes = 399"),
         "node \"a\": resident experts need 400 bytes, capacity memory_bytes is 399"),
        (format!("{NODES}{layer1}{layer2}").replace("memory_bytes = 0", "memory_bytes = 400"), "ok"),
        (format!("{}{}", NODES.replace("memory_bytes = 0", "memory_bytes = 100"), "[[layer]]\nindex = 1\nreplicas = [[\"a\"], [\"b\"], [\"a\"], [\"b\"]]\nresident = [[\"a\"], [\"b\"], [], [\"b\"]]\n[[layer]]\nindex = 2\nreplicas = [[\"b\"], [\"b\"], [\"a\"], [\"b\"]]\nresident = [[\"b\"], [\"b\"], [], [\"b\"]]\n"), "ok"),
        ("version = 1\n[[node]]\nname = \"a\"\n[[layer]]\nindex = 1\nreplicas = [[\"a\"]]\nextra = 3\n".to_string(),
         "line 7, column 1: unknown field `extra`, expected one of `index`, `replicas`, `resident`"),
    ];
    let mut failures = Vec::new();
    for (i, (text, expect)) in rows.iter().enumerate() {
        let got = error_of(text);
        if got != *expect {
            failures.push(format!("row {i}:\n  expected: {expect}\n  found:    {got}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn explicit_round_trips_and_answers_lookups() {
    let p = Placement::from_toml_str(&explicit()).unwrap();
    p.validate(&shape()).unwrap();
    assert_eq!(p.strategy(), Strategy::Explicit);
    assert_eq!(p.replicas(1, 2), &[0, 1]);
    assert_eq!(p.replicas(2, 0), &[1]);
    assert_eq!(p.replicas(0, 0), &[] as &[NodeId]);
    assert_eq!(p.replicas(1, 9), &[] as &[NodeId]);
    assert_eq!(
        (0..4)
            .map(|row| p.pick_replica(1, 2, row))
            .collect::<Vec<_>>(),
        vec![Some(0), Some(1), Some(0), Some(1)]
    );
    assert_eq!(p.pick_replica(0, 0, 0), None);
    assert!(p.is_resident(1, 2, 1));
    assert!(!p.is_resident(1, 2, 0));
    assert!(!p.is_resident(1, 1, 1));
    let on_a = p.experts_on("a").unwrap();
    let expect = vec![
        ExpertSlot {
            layer: 1,
            expert: 0,
            resident: true,
        },
        ExpertSlot {
            layer: 1,
            expert: 2,
            resident: false,
        },
        ExpertSlot {
            layer: 2,
            expert: 1,
            resident: true,
        },
        ExpertSlot {
            layer: 2,
            expert: 2,
            resident: true,
        },
    ];
    assert_eq!(on_a, expect);
    assert_eq!(
        p.experts_on("zz").unwrap_err().to_string(),
        "node \"zz\" is not in the placement"
    );
    assert_eq!(p.nodes[0].addr.as_deref(), Some("127.0.0.1:50051"));
    assert_eq!(p.nodes[1].numa, Some(1));
    assert_eq!(p.resident_bytes(100), vec![300, 400]);
    assert_eq!(p.held_bytes(100), vec![400, 500]);

    let text = p.to_toml_string();
    let q = Placement::from_toml_str(&text).unwrap();
    assert_eq!(p, q, "{text}");
}

#[test]
fn round_robin_file_resolves() {
    let p = Placement::from_toml_str(
        &NODES.replace("version = 1\n", "version = 1\nstrategy = \"round-robin\"\n"),
    )
    .unwrap();
    assert_eq!(p.strategy(), Strategy::RoundRobin);
    assert!(p.layers().is_empty());
    assert_eq!(p.replicas(7, 5), &[1]);
    assert_eq!(p.replicas(1, 4), &[0]);
    assert!(matches!(p.experts_on("a"), Err(PlacementError::Unresolved)));
    p.validate(&shape()).unwrap();
    let r = p.resolve(&shape()).unwrap();
    assert_eq!(r.layers().len(), 2);
    assert_eq!(r.experts_on("b").unwrap().len(), 4);
    assert_eq!(r, Placement::round_robin(p.nodes.clone(), &[1, 2], 4));
    // written back without layer tables
    let text = r.to_toml_string();
    assert!(
        text.contains("strategy = \"round-robin\"") && !text.contains("[[layer]]"),
        "{text}"
    );
    assert_eq!(
        Placement::from_toml_str(&text)
            .unwrap()
            .resolve(&shape())
            .unwrap(),
        r
    );
    // capacity applies to round-robin too: each node holds 2 experts x 2 layers x 100 bytes
    let tight = NODES.replace("memory_bytes = 0", "memory_bytes = 399");
    let e = Placement::from_toml_str(&tight)
        .unwrap()
        .validate(&shape())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "node \"a\": resident experts need 400 bytes, capacity memory_bytes is 399"
    );
}

#[test]
fn from_layers_checks_structure() {
    let nodes = vec![NodeSpec::named("a"), NodeSpec::named("b")];
    let good = LayerPlacement {
        index: 3,
        replicas: vec![vec![0], vec![1, 0]],
        resident: vec![vec![0], vec![]],
    };
    let p = Placement::from_layers(nodes.clone(), vec![good.clone()]).unwrap();
    assert_eq!(p.replicas(3, 1), &[1, 0]);
    let rows: Vec<(Vec<NodeSpec>, LayerPlacement, &str)> =
        vec![
        (nodes.clone(), LayerPlacement { replicas: vec![vec![0], vec![2]], ..good.clone() },
         "layer[3].replicas[1]: unknown node \"#2\" (nodes: 2 nodes)"),
        (nodes.clone(), LayerPlacement { replicas: vec![vec![0], vec![1, 1]], ..good.clone() },
         "layer[3].replicas[1]: node \"#1\" listed twice for the same expert"),
        (nodes.clone(), LayerPlacement { resident: vec![vec![1], vec![]], ..good.clone() },
         "layer[3].resident[0]: node \"#1\" is resident but is not among the expert's replicas"),
        (vec![NodeSpec::named("a"), NodeSpec::named("a")], good.clone(),
         "node[1].name: node \"a\" listed twice (first at node[0].name)"),
        (vec![], good.clone(), "expected at least one [[node]], found none"),
    ];
    for (nodes, layer, expect) in rows {
        let got = Placement::from_layers(nodes, vec![layer])
            .unwrap_err()
            .to_string();
        assert_eq!(got, expect);
    }
}

#[test]
fn save_atomic_writes_and_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("placement.toml");
    let p = Placement::from_toml_str(&explicit()).unwrap();
    p.save_atomic(&path).unwrap();
    assert_eq!(Placement::load(&path).unwrap(), p);
    let rr = Placement::round_robin(p.nodes.clone(), &[1, 2], 4);
    rr.save_atomic(&path).unwrap();
    assert_eq!(
        Placement::load(&path).unwrap().resolve(&shape()).unwrap(),
        rr
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "temporary file left behind");
    let missing = Placement::load(&dir.path().join("nope.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        missing.starts_with("cannot access placement file "),
        "{missing}"
    );
}

#[test]
fn bytes_to_move_counts_new_copies_by_name() {
    let p = Placement::from_toml_str(&explicit()).unwrap();
    let rr = Placement::round_robin(p.nodes.clone(), &[1, 2], 4);
    // layer 1: a,b,ab,b vs rr a,b,a,b -> new copy (2,b); layer 2: b,a,a,b vs a,b,a,b -> 2 new copies
    assert_eq!(p.bytes_to_move_from(&rr, 10), 30);
    assert_eq!(p.bytes_to_move_from(&p, 10), 0);
}
