//! An expert node under a cgroup v1 memory limit below the size of the model's experts: with
//! `--memory-budget` it keeps that much resident and serves the rest either from the mapped file
//! (`--cold-cache 0`: page cache, which the kernel reclaims under the limit instead of killing)
//! or read whole into its staging cache (`--cold-cache auto`, its default with a budget, sized
//! by the limit); either way it is not killed and its outputs are bit-identical to the
//! in-process engine. Each arm's major page faults per token from a dropped page cache are
//! printed (the cache's reads are O_DIRECT: it takes none for experts). Without a budget the
//! same node copies every expert and the limit kills it, which shows the limit bites. Skipped,
//! saying so, when the cgroup v1 memory controller is not mounted writable (CI runs as root,
//! where it is).

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

    /// A script that enters this cgroup and runs the node with `extra` arguments after its own
    /// (and its stderr appended to `log`, if given).
    fn wrapper(&self, dir: &Path, name: &str, extra: &str, log: Option<&Path>) -> PathBuf {
        let path = dir.join(name);
        let mut f = std::fs::File::create(&path).expect("wrapper");
        let redirect = log.map_or(String::new(), |l| format!(" 2>>{}", l.display()));
        writeln!(
            f,
            "#!/bin/sh\necho $$ > {}/cgroup.procs || exit 70\nexec {} \"$@\" {extra}{redirect}",
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

/// Major page faults of process `pid` so far (`/proc/<pid>/stat` field 12).
fn major_faults(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // fields after the command name, which is in parentheses: state is field 3
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    rest.split_whitespace()
        .nth(12 - 3)
        .and_then(|f| f.parse().ok())
        .expect("majflt")
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
        node_log: "info".into(),
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
    let load = || {
        Model::load_with(
            &path,
            LoadOptions {
                experts: ExpertMemory::Mapped,
                ..LoadOptions::default()
            },
        )
        .expect("model")
    };
    let want = {
        let model = load();
        let local: Arc<dyn ExpertBackend> = Arc::new(LocalExperts::new(model.clone(), None));
        run(&mut engine(&model, local), &PROMPT, 8, |_| {}).expect("in process")
    };
    // a fresh map whose experts this process never touches: the file's pages can be dropped
    // (pages mapped here would stay cached, and the node would fault them in without a read)
    let model = load();
    let experts = model.weights().expert_bytes();
    assert!(
        experts > 3 * LIMIT / 2,
        "the experts ({experts} bytes) must exceed the limit ({LIMIT})"
    );

    // with a budget, cold experts through the page cache or the staging cache: alive and
    // bit-identical
    let mut faults = Vec::new();
    // `--cold-cache 0`, then no flag: `auto` is the default with a budget
    for cold in ["0", "auto"] {
        evict(&path);
        cg.write("memory.max_usage_in_bytes", "0")
            .expect("reset the peak");
        let log = work.join(format!("node-cold-{cold}.log"));
        let _ = std::fs::remove_file(&log);
        let exe = cg.wrapper(
            &work,
            &format!("node-budget-{cold}.sh"),
            &match cold {
                "0" => format!("--memory-budget {BUDGET} --cold-cache 0"),
                _ => format!("--memory-budget {BUDGET}"),
            },
            Some(&log),
        );
        let mut cluster =
            launch(&path, exe, &work).expect("a node with a budget starts under the limit");
        let remote = connect(&model, &cluster, RemoteOptions::default());
        // the node's major faults per token over a generation from a dropped page cache
        let pid = cluster.pid("node0").expect("node pid");
        let before = major_faults(pid);
        let got = run(&mut engine(&model, remote.clone()), &PROMPT, 8, |_| {}).expect("node");
        let per_token = (major_faults(pid) - before) as f64 / (PROMPT.len() + 8) as f64;
        assert_bits_equal(
            &got,
            &want,
            &format!("node under a cgroup limit, --cold-cache {cold}"),
        );
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
        drop(remote);
        cluster.stop();
        let text = support::plain(&std::fs::read_to_string(&log).expect("node log"));
        let summary = text.lines().find(|l| l.contains("cold cache: "));
        let ready = text
            .lines()
            .find(|l| l.contains("node ready"))
            .unwrap_or_else(|| panic!("no ready line in {text}"));
        if cold == "0" {
            assert!(ready.contains("cold_cache_kib=0"), "{ready}");
            assert!(summary.is_none(), "no cache, yet: {text}");
        } else {
            assert!(!ready.contains("cold_cache_kib=0"), "{ready}");
            let summary = summary.unwrap_or_else(|| panic!("no cache summary in {text}"));
            assert!(
                !summary.contains(" 0 misses"),
                "the cache was not read through: {summary}"
            );
            eprintln!("--cold-cache auto: {summary}");
        }
        eprintln!(
            "--cold-cache {cold}: experts {} MiB, limit {} MiB, budget {} MiB, cgroup peak {} MiB \
             (page cache included), {per_token:.1} major faults per token",
            experts / MIB,
            LIMIT / MIB,
            BUDGET / MIB,
            peak / MIB
        );
        faults.push(per_token);
    }
    assert!(
        faults[1] <= faults[0],
        "the staging cache took more major faults per token ({:.1}) than the page cache ({:.1})",
        faults[1],
        faults[0]
    );

    // without a budget every expert is copied and the limit kills the node
    evict(&path);
    let exe = cg.wrapper(&work, "node-all.sh", "", None);
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
    // half of what the process may still take: under 256 MiB, at most 128 MiB
    let inside = cold_capacity_mib(&run(true));
    assert!(
        inside > 0.0 && inside <= 128.0,
        "a cache of {inside} MiB under a {} MiB limit",
        limit / MIB
    );
    let host = nightshift_model::weights::mem_available().expect("meminfo") / MIB;
    let outside = cold_capacity_mib(&run(false));
    if host > 1024 {
        assert!(
            outside > 128.0,
            "outside the cgroup ({host} MiB available) the cache took only {outside} MiB"
        );
    }
}
