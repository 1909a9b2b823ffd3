//! An expert node under a cgroup v1 memory limit below the size of the model's experts: with
//! `--memory-budget` it keeps that much resident, serves the rest from the mapped file (page
//! cache, which the kernel reclaims under the limit instead of killing), is not killed, and its
//! outputs are bit-identical to the in-process engine. Without a budget the same node copies every
//! expert and the limit kills it, which shows the limit bites. Skipped, saying so, when the
//! cgroup v1 memory controller is not mounted writable (CI runs as root, where it is).

mod support;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nightshift_atlas_core::placement::Placement;
use nightshift_coordinator::cluster::{model_shape, LaunchOptions, LocalCluster, RemoteOptions};
use nightshift_model::gen::{generate, Arch, GenSpec, Preset, QuantMix};
use nightshift_model::{ExpertBackend, ExpertMemory, LoadOptions, LocalExperts, Model};
use support::cluster::{assert_bits_equal, connect, generate as run, node_binary, nodes, PROMPT};
use support::engine;

const CGROUP_ROOT: &str = "/sys/fs/cgroup/memory";
const MIB: u64 = 1 << 20;
/// The cgroup's limit, and the node's budget of resident experts inside it.
const LIMIT: u64 = 72 * MIB;
const BUDGET: u64 = 16 * MIB;

/// A memory cgroup made for this test, removed on drop.
struct Cgroup(PathBuf);

impl Cgroup {
    fn create(name: &str) -> Result<Cgroup, String> {
        let root = Path::new(CGROUP_ROOT);
        if !root.join("memory.limit_in_bytes").is_file() {
            return Err(format!("{CGROUP_ROOT} is not a cgroup v1 memory hierarchy"));
        }
        let dir = root.join(name);
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cg = Cgroup(dir);
        cg.write("memory.limit_in_bytes", &LIMIT.to_string())?;
        Ok(cg)
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        std::fs::write(self.0.join(file), value)
            .map_err(|e| format!("cannot write {}/{file}: {e}", self.0.display()))
    }

    fn read(&self, file: &str) -> u64 {
        std::fs::read_to_string(self.0.join(file))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// A script that enters this cgroup and runs the node with `extra` arguments after its own.
    fn wrapper(&self, dir: &Path, name: &str, extra: &str) -> PathBuf {
        let path = dir.join(name);
        let mut f = std::fs::File::create(&path).expect("wrapper");
        writeln!(
            f,
            "#!/bin/sh\necho $$ > {}/cgroup.procs || exit 70\nexec {} \"$@\" {extra}",
            self.0.display(),
            node_binary().display()
        )
        .expect("write wrapper");
        drop(f);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // the nodes have exited by now; a cgroup with no tasks can be removed
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Drops the file's pages from the page cache, so the node's reads are charged to its cgroup.
fn evict(path: &Path) {
    let f = std::fs::File::open(path).expect("open model");
    // SAFETY: a valid open file descriptor; fadvise only drops clean cached pages of the file.
    let rc = unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    assert_eq!(rc, 0, "posix_fadvise");
}

fn launch(model: &Path, exe: PathBuf, work: &Path) -> Result<LocalCluster, String> {
    let m = Model::load_with(
        model,
        LoadOptions {
            experts: ExpertMemory::Mapped,
            ..LoadOptions::default()
        },
    )
    .expect("model");
    let shape = model_shape(&m).expect("shape");
    LocalCluster::start(LaunchOptions {
        model: model.to_path_buf(),
        placement: Placement::round_robin(nodes(1), &shape.moe_layers, shape.n_experts),
        threads_per_node: Some(1),
        numa: Vec::new(),
        auth_token_file: None,
        tls: None,
        exe: Some(exe),
        work_dir: work.to_path_buf(),
        start_timeout: Duration::from_secs(120),
        node_log: "error".into(),
    })
    .map_err(|e| e.to_string())
}

#[test]
fn node_under_a_cgroup_limit_below_the_model_serves_with_a_memory_budget() {
    let name = format!("nightshift-test-{}", std::process::id());
    let cg = match Cgroup::create(&name) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIPPED: the cgroup v1 memory controller is not writable here ({why}); run as root on a machine with {CGROUP_ROOT} to test the memory budget under a limit");
            return;
        }
    };
    let work = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&work).expect("work dir");
    // 2 MoE layers x 512 experts of ~110 KB: ~113 MB of experts, well over the limit
    let mut spec = GenSpec::new(Preset::Tiny, Arch::Qwen3Moe, QuantMix::Q4KM);
    spec.experts = Some(512);
    let path = work.join("big.gguf");
    generate(&spec, &path, &mut |_| {}).expect("generate");
    let model = Model::load_with(
        &path,
        LoadOptions {
            experts: ExpertMemory::Mapped,
            ..LoadOptions::default()
        },
    )
    .expect("model");
    let experts = model.weights().expert_bytes();
    assert!(
        experts > 3 * LIMIT / 2,
        "the experts ({experts} bytes) must exceed the limit ({LIMIT})"
    );
    let local: Arc<dyn ExpertBackend> = Arc::new(LocalExperts::new(model.clone(), None));
    let want = run(&mut engine(&model, local), &PROMPT, 8, |_| {}).expect("in process");

    // with a budget: alive and bit-identical
    evict(&path);
    let exe = cg.wrapper(
        &work,
        "node-budget.sh",
        &format!("--memory-budget {BUDGET}"),
    );
    let cluster = launch(&path, exe, &work).expect("a node with a budget starts under the limit");
    let remote = connect(&model, &cluster, RemoteOptions::default());
    let got = run(&mut engine(&model, remote.clone()), &PROMPT, 8, |_| {}).expect("node");
    assert_bits_equal(&got, &want, "node under a cgroup limit");
    assert!(
        remote.status().iter().all(|s| s.up),
        "the node stays up: {:?}",
        remote.status()
    );
    let peak = cg.read("memory.max_usage_in_bytes");
    assert!(
        peak <= LIMIT,
        "cgroup peak {peak} bytes over the limit {LIMIT}"
    );
    eprintln!(
        "experts {} MiB, limit {} MiB, budget {} MiB, cgroup peak {} MiB (page cache included)",
        experts / MIB,
        LIMIT / MIB,
        BUDGET / MIB,
        peak / MIB
    );
    drop(remote);
    drop(cluster);

    // without a budget every expert is copied and the limit kills the node
    evict(&path);
    let exe = cg.wrapper(&work, "node-all.sh", "");
    match launch(&path, exe, &work) {
        Ok(_) => panic!("a node copying every expert under the limit should have been killed"),
        Err(e) => assert!(e.contains("signal"), "killed by the limit, found: {e}"),
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// The `capacity N MiB` that `nightshift generate` prints for its cold-expert staging cache.
fn cold_capacity_mib(stderr: &str) -> f64 {
    let at = stderr
        .find("(capacity ")
        .unwrap_or_else(|| panic!("no cold cache line in: {stderr}"));
    stderr[at + "(capacity ".len()..]
        .split_whitespace()
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("unreadable capacity in: {stderr}"))
}

#[test]
fn generate_sizes_its_cold_cache_by_the_cgroup_limit_it_runs_under() {
    let name = format!("nightshift-test-cold-{}", std::process::id());
    let cg = match Cgroup::create(&name) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIPPED: the cgroup v1 memory controller is not writable here ({why}); run as root on a machine with {CGROUP_ROOT} to test the cold cache's size under a limit");
            return;
        }
    };
    let limit = 256 * MIB;
    cg.write("memory.limit_in_bytes", &limit.to_string())
        .expect("limit");
    let model = support::fixture("tiny-qwen3moe-Q4_K_M.gguf");
    let args = format!(
        "generate --model {} --prompt hi -n 4 --temp 0 --memory-budget 33%",
        model.display()
    );
    let run = |inside: bool| -> String {
        let enter = if inside {
            format!("echo $$ > {}/cgroup.procs || exit 70; ", cg.0.display())
        } else {
            String::new()
        };
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{enter}exec {} {args}",
                env!("CARGO_BIN_EXE_nightshift")
            ))
            .output()
            .expect("run nightshift");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "inside {inside}: {err}");
        err
    };
    // a quarter of what the process may still take: under 256 MiB, at most 64 MiB
    let inside = cold_capacity_mib(&run(true));
    assert!(
        inside > 0.0 && inside <= 64.0,
        "a cache of {inside} MiB under a {} MiB limit",
        limit / MIB
    );
    let host = nightshift_model::weights::mem_available().expect("meminfo") / MIB;
    let outside = cold_capacity_mib(&run(false));
    if host > 1024 {
        assert!(
            outside > 64.0,
            "outside the cgroup ({host} MiB available) the cache took only {outside} MiB"
        );
    }
}
