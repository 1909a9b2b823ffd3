//! `memory-report`: decode and prefill speed of a model bigger than its memory, in process, for
//! four arms run interleaved in the same invocation: every expert resident (`all`), an
//! atlas-planned resident set under the budget (`planned`, with the one-layer-ahead prefetch and
//! the cold-expert staging cache, `--cold-cache`), a seeded random resident set under the same
//! budget (`random`, the same cold path), and no resident set at all (`pagecache`: the kernel's
//! page cache decides). Each arm runs in a child process inside a cgroup v1 memory cgroup whose
//! limit is the same for the budget arms (budget + the dense weights' resident copy + `--slack`,
//! plus the cold cache when it is given a size; `auto` takes half of the slack), so the page cache cannot hold what the budget does not; the page cache is dropped before each arm (`echo 1 > /proc/sys/vm/drop_caches`:
//! needs root). Prints each arm's range over the rounds, the ratios the issue targets, the
//! prefetch's precision/recall/cold hit rate, and the disk's read bandwidth measured the same way
//! (sequential over the model file, and expert-sized reads at random experts), since the cold
//! share's cost is set by it.
//!
//! What each arm reads, counted rather than timed (they hold under load): per decode token the
//! bytes this process caused to be read from disk (`/proc/self/io` `read_bytes`, prefetch
//! thread included), its major page faults (`getrusage`), and the expert hit rate: the share of
//! the experts a layer used that were resident or had all their pages in the page cache when
//! the layer started (`mincore`), or were in the staging cache. The optional arms are `planned`
//! with other cold paths, for A/B in one run: `planned-wn`, whole experts advised
//! `MADV_WILLNEED` into the page cache (no staging cache: the cold path before it), and
//! `planned-ra`, page faults and the kernel's read-around (`prefetch::ColdReads::ReadAround`);
//! `planned@N` and `random@N` read N cold experts at once into the staging cache instead of
//! `--cold-io-depth` (A/B of its depth in one run: each prints its decode steps' demand reads
//! and time waited on cold reads per token, and the MiB/s its reads got).
//!
//! `--disk-read-mbps N` caps reads from the model's disk for every arm (and the bandwidth
//! measurement) with a cgroup v1 `blkio` throttle, as a VM's network disk caps them: the cold
//! share's cost is set by the disk, and this machine's local disk is faster than most VMs' disks.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Parser;
use nightshift_benches::argmax;
use nightshift_coordinator::cluster::budget::{build_cold_cache, build_residency};
use nightshift_kernels::rng::SplitMix64;
use nightshift_model::cold::ColdCache;
use nightshift_model::prefetch::{ColdReads, Prefetcher};
use nightshift_model::resident::ExpertResidency;
use nightshift_model::{
    build_pool, ActRows, Engine, EngineOptions, ExpertBackend, ExpertError, ExpertMemory,
    ExpertPair, LoadOptions, LocalExperts, Model,
};
use rayon::ThreadPool;

const ARMS: [&str; 6] = [
    "all",
    "planned",
    "random",
    "pagecache",
    "planned-wn",
    "planned-ra",
];
/// Arm `name`'s kind (one of [`ARMS`]) and, for `planned@N` / `random@N`, its I/O depth N.
fn split_arm(name: &str) -> anyhow::Result<(&str, Option<usize>)> {
    let (kind, depth) = match name.split_once('@') {
        Some((k, d)) if k == "planned" || k == "random" => {
            let d = d
                .parse::<usize>()
                .with_context(|| format!("arm {name}: expected planned@N or random@N"))?;
            (k, Some(d))
        }
        _ => (name, None),
    };
    if !ARMS.contains(&kind) {
        bail!("arm {name}: expected one of {ARMS:?} (planned and random may take @N)");
    }
    Ok((kind, depth))
}

/// The arms run when `--arms` is not given.
const DEFAULT_ARMS: [&str; 4] = ["all", "planned", "random", "pagecache"];
const CGROUP_ROOT: &str = "/sys/fs/cgroup/memory";
const BLKIO_ROOT: &str = "/sys/fs/cgroup/blkio";

#[derive(Parser)]
struct Args {
    /// The model (a `gen-model --routing-skew published` file).
    #[arg(long)]
    model: PathBuf,
    /// The planned resident set: `nightshift-atlas plan --memory-budget` output.
    #[arg(long)]
    plan: PathBuf,
    /// Resident expert budget (123, 10G, 10GiB or N% of all experts), as given to the plan.
    #[arg(long, default_value = "50%")]
    budget: String,
    /// Memory beyond the budget and the dense weights each budget arm's cgroup may use (page
    /// cache, KV cache, the process).
    #[arg(long, default_value = "768MiB")]
    slack: String,
    /// The planned and random arms' staging cache of cold experts: `auto`, what `--cold-cache
    /// auto` takes in such an arm (half of `--slack`, at least what two MoE layers of a decode
    /// step use), out of the slack; or a size (0 for none), added to the budget arms' limit.
    #[arg(long, default_value = "auto")]
    cold_cache: String,
    /// The staging cache's reads in flight (`--cold-io-depth`) for the planned and random arms;
    /// an arm named `planned@N` or `random@N` reads N at once instead, so depths run
    /// interleaved in one invocation (`--arms planned@1,planned@4`).
    #[arg(long, default_value_t = nightshift_model::cold::DEFAULT_IO_DEPTH)]
    cold_io_depth: usize,
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    #[arg(long, default_value_t = 64)]
    prefill: usize,
    #[arg(long, default_value_t = 32)]
    decode: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Cap reads from the model's disk at this many MB/s (10^6 bytes) for every arm, with a
    /// cgroup v1 blkio throttle, as a VM's network disk caps them (Azure Premium SSD P30: 200
    /// MB/s; Premium SSD v2's free baseline: 125 MB/s). 0: the disk as it is.
    #[arg(long, default_value_t = 0.0)]
    disk_read_mbps: f64,
    /// Arms to run (default all four).
    #[arg(long, value_delimiter = ',')]
    arms: Vec<String>,
    /// Internal: run one arm in this process and print its result as JSON.
    #[arg(long, hide = true)]
    child: Option<String>,
    /// Internal: the cgroup the child enters first.
    #[arg(long, hide = true)]
    cgroup: Option<PathBuf>,
}

/// One arm's measurement.
#[derive(Clone, Debug, Default)]
struct Run {
    prefill_tps: f64,
    decode_tps: f64,
    resident_mib: u64,
    /// precision, recall, cold experts requested before their layer, in time (cached when the
    /// layer started), share of requests wasted
    prefetch: Option<[f64; 5]>,
    /// per decode token: MiB read from disk, major and minor faults, expert hit rate
    disk_mib: f64,
    majflt: f64,
    minflt: f64,
    /// per decode token: CPU ms in user and system mode, all threads
    user_ms: f64,
    sys_ms: f64,
    /// per decode token, ms: attention, router, routed experts, other FFN, head, the rest
    phases: Option<[f64; 6]>,
    /// MiB of the arm's memory in transparent huge pages after decoding
    huge_mib: f64,
    hit: f64,
    /// the staging cache's counters
    cold: Option<String>,
    /// per decode token: demand reads, ms waited; MiB/s while reading
    cold_decode: Option<[f64; 3]>,
}

/// A child's JSON array of exactly `N` numbers (None when absent or of another shape).
fn floats<const N: usize>(v: Option<&serde_json::Value>) -> Option<[f64; N]> {
    let p = v?.as_array()?;
    if p.len() != N {
        return None;
    }
    let mut out = [0.0; N];
    for (o, x) in out.iter_mut().zip(p) {
        *o = x.as_f64()?;
    }
    Some(out)
}

/// MiB of this process's memory in transparent huge pages (`AnonHugePages` of
/// `/proc/self/smaps_rollup`; 0 where it cannot be read).
fn anon_huge_mib() -> f64 {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("AnonHugePages:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// This process's (all threads) bytes read from storage (`/proc/self/io`), major faults, minor
/// faults, user CPU seconds and system CPU seconds so far (`getrusage`).
fn io_counters() -> (u64, u64, u64, f64, f64) {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let read = io
        .lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    // SAFETY: getrusage only writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage struct.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (
        read,
        ru.ru_majflt as u64,
        ru.ru_minflt as u64,
        secs(ru.ru_utime),
        secs(ru.ru_stime),
    )
}

/// The arm's expert backend, counting for each layer call the distinct experts used and those
/// already in memory when it started (resident, or every page cached by `mincore`).
struct Observed {
    inner: LocalExperts,
    model: Arc<Model>,
    residency: Option<Arc<ExpertResidency>>,
    cold: Option<Arc<ColdCache>>,
    /// every expert was copied at load (the `all` arm)
    all_resident: bool,
    counting: AtomicBool,
    used: AtomicU64,
    hits: AtomicU64,
}

impl ExpertBackend for Observed {
    fn run_experts(
        &self,
        layer: usize,
        acts: &ActRows,
        pairs: &[ExpertPair],
        out: &mut [f32],
    ) -> Result<(), ExpertError> {
        if self.counting.load(Ordering::Relaxed) {
            let mut used: Vec<u32> = pairs.iter().map(|p| p.expert).collect();
            used.sort_unstable();
            used.dedup();
            let g = self.model.gguf();
            let mut hits = 0;
            for &e in &used {
                let resident = self.all_resident
                    || self
                        .residency
                        .as_ref()
                        .is_some_and(|r| r.is_resident(layer, e));
                let w = self.model.expert_weights(layer, e)?;
                if resident
                    || self.cold.as_ref().is_some_and(|c| c.is_ready(layer, e))
                    || [w.gate.bytes(), w.up.bytes(), w.down.bytes()]
                        .iter()
                        .all(|m| g.is_cached(m) == Some(true))
                {
                    hits += 1;
                }
            }
            self.used.fetch_add(used.len() as u64, Ordering::Relaxed);
            self.hits.fetch_add(hits, Ordering::Relaxed);
        }
        self.inner.run_experts(layer, acts, pairs, out)
    }

    fn computes_on(&self, pool: &ThreadPool) -> bool {
        self.inner.computes_on(pool)
    }
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    if let Some(arm) = a.child.clone() {
        return child(&a, &arm);
    }
    parent(&a)
}

fn child(a: &Args, arm: &str) -> anyhow::Result<()> {
    if let Some(cg) = &a.cgroup {
        // "0" moves the writing process itself
        std::fs::write(cg.join("cgroup.procs"), "0")
            .with_context(|| format!("entering cgroup {}", cg.display()))?;
    }
    let (arm, depth) = split_arm(arm)?;
    let depth = depth.unwrap_or(a.cold_io_depth);
    let experts = if arm == "all" {
        ExpertMemory::Resident
    } else {
        ExpertMemory::Mapped
    };
    let model = Model::load_with(
        &a.model,
        LoadOptions {
            experts,
            ..LoadOptions::default()
        },
    )?;
    let pool = build_pool(a.threads)?;
    let mut local = LocalExperts::new(model.clone(), Some(pool.clone()));
    let mut prefetch = None;
    let mut residency = None;
    let mut cold = None;
    let mut resident = 0u64;
    if arm.starts_with("planned") || arm == "random" {
        let set = arm.starts_with("planned").then_some(a.plan.as_path());
        let r = build_residency(&model, &a.budget, set, Some(&pool))?;
        resident = r.resident_bytes();
        let reads = match arm {
            "planned-ra" => ColdReads::ReadAround,
            _ => ColdReads::WholeExperts,
        };
        let mut p = Prefetcher::with_cold_reads(model.clone(), reads)?;
        local = local.with_residency(r.clone());
        if arm == "planned" || arm == "random" {
            cold = build_cold_cache(&model, &a.cold_cache, depth, &r)?;
        }
        if let Some(c) = &cold {
            p = p.with_cold_cache(c.clone());
            local = local.with_cold_cache(c.clone());
        }
        let p = Arc::new(p);
        local = local.with_prefetch(p.clone());
        prefetch = Some(p);
        residency = Some(r);
    } else if arm == "all" {
        resident = model.weights().expert_bytes();
    }
    let observed = Arc::new(Observed {
        inner: local,
        model: model.clone(),
        residency,
        cold: cold.clone(),
        all_resident: arm == "all",
        counting: AtomicBool::new(false),
        used: AtomicU64::new(0),
        hits: AtomicU64::new(0),
    });
    let opts = EngineOptions {
        threads: a.threads,
        pool: Some(pool),
        ..Default::default()
    };
    let mut eng = Engine::new(model.clone(), observed.clone(), opts)?;
    let tok = model.tokenizer();
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../atlas/prompts/routing.jsonl"),
    )
    .unwrap_or_else(|_| "The quick brown fox jumps over the lazy dog. ".repeat(64));
    let mut ids = tok.encode(&text, tok.add_bos(), false);
    ids.truncate(a.prefill);
    if ids.len() < a.prefill {
        bail!("the prompt text gives only {} tokens", ids.len());
    }
    let seq = eng.add_sequence()?;
    let t = Instant::now();
    let mut logits = eng.prefill(seq, &ids)?;
    let prefill = t.elapsed().as_secs_f64();
    observed.counting.store(true, Ordering::Relaxed);
    let (read0, flt0, min0, user0, sys0) = io_counters();
    let cold0 = cold.as_ref().map(|c| c.stats());
    eng.reset_profile();
    let t = Instant::now();
    for _ in 0..a.decode {
        let next = argmax(&logits) as u32;
        logits = eng.prefill(seq, &[next])?;
    }
    let decode = t.elapsed().as_secs_f64();
    let pr = eng.profile();
    let phases = [
        pr.attention,
        pr.router,
        pr.experts,
        pr.ffn_other,
        pr.output,
        pr.other(),
    ]
    .map(|x| x * 1e3 / a.decode.max(1) as f64);
    let (read1, flt1, min1, user1, sys1) = io_counters();
    let n = a.decode.max(1) as f64;
    // the staging cache over the decode steps: demand reads and time calls waited per token,
    // and MiB/s while reads were in flight
    let cold_decode = cold.as_ref().zip(cold0).map(|(c, s0)| {
        let s1 = c.stats();
        let busy = (s1.busy_us - s0.busy_us).max(1) as f64 / 1e6;
        [
            (s1.misses - s0.misses) as f64 / n,
            (s1.wait_us - s0.wait_us) as f64 / 1e3 / n,
            (s1.bytes_read - s0.bytes_read) as f64 / (1u64 << 20) as f64 / busy,
        ]
    });
    let used = observed.used.load(Ordering::Relaxed).max(1) as f64;
    let p = prefetch.map(|p| {
        let s = p.stats();
        [
            s.precision().unwrap_or(0.0),
            s.recall().unwrap_or(0.0),
            s.cold_hit_rate().unwrap_or(0.0),
            s.in_time_rate().unwrap_or(0.0),
            s.wasted_rate().unwrap_or(0.0),
        ]
    });
    println!(
        "{}",
        serde_json::json!({
            "prefill_tps": a.prefill as f64 / prefill,
            "decode_tps": a.decode as f64 / decode,
            "resident_mib": resident >> 20,
            "prefetch": p,
            "disk_mib": (read1 - read0) as f64 / n / (1u64 << 20) as f64,
            "majflt": (flt1 - flt0) as f64 / n,
            "minflt": (min1 - min0) as f64 / n,
            "user_ms": (user1 - user0) * 1e3 / n,
            "sys_ms": (sys1 - sys0) * 1e3 / n,
            // ms per decode token in the engine's phases
            "phases": phases,
            "huge_mib": anon_huge_mib(),
            "hit": observed.hits.load(Ordering::Relaxed) as f64 / used,
            "cold": cold.map(|c| format!(
                "{} (capacity {} MiB, {} MiB of it the budget's)",
                c.stats().summary(),
                c.capacity() >> 20,
                c.lent() >> 20
            )),
            "cold_decode": cold_decode,
        })
    );
    Ok(())
}

/// The whole disk (`major:minor`) holding `path`: blkio throttles disks, not partitions.
fn disk_of(path: &Path) -> anyhow::Result<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if !sys.exists() {
        bail!(
            "{} is on device {major}:{minor}, which is not a block device (tmpfs or overlay?): its reads cannot be capped",
            path.display()
        );
    }
    let disk = if sys.join("partition").exists() {
        sys.join("..")
    } else {
        sys
    };
    Ok(std::fs::read_to_string(disk.join("dev"))
        .with_context(|| format!("reading {}", disk.join("dev").display()))?
        .trim()
        .to_string())
}

/// A cgroup directory this run made, removed on drop (also when an arm fails).
struct TempCgroup(PathBuf);

impl TempCgroup {
    fn new(root: &str) -> anyhow::Result<TempCgroup> {
        let dir = PathBuf::from(root).join(format!("nightshift-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating {} (needs root and cgroup v1)", dir.display()))?;
        Ok(TempCgroup(dir))
    }
}

impl Drop for TempCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A blkio cgroup capping reads from one disk, which this process joins (and with it every
/// arm's child, started after); left on drop.
struct ReadCap {
    dir: TempCgroup,
}

impl ReadCap {
    fn new(path: &Path, mbps: f64) -> anyhow::Result<ReadCap> {
        anyhow::ensure!(
            mbps.is_finite() && mbps >= 1.0,
            "--disk-read-mbps: expected at least 1 MB/s, found {mbps}"
        );
        let disk = disk_of(path)?;
        let cap = ReadCap {
            dir: TempCgroup::new(BLKIO_ROOT)?,
        };
        let rule = format!("{disk} {}", (mbps * 1e6) as u64);
        std::fs::write(cap.dir.0.join("blkio.throttle.read_bps_device"), &rule)
            .with_context(|| format!("writing '{rule}' to blkio.throttle.read_bps_device"))?;
        // "0" moves the writing process itself
        std::fs::write(cap.dir.0.join("cgroup.procs"), "0").context("entering the blkio cgroup")?;
        Ok(cap)
    }
}

impl Drop for ReadCap {
    fn drop(&mut self) {
        // back to the root before the directory goes (an occupied cgroup cannot be removed)
        let _ = std::fs::write(Path::new(BLKIO_ROOT).join("cgroup.procs"), "0");
    }
}

fn drop_caches() -> anyhow::Result<()> {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "1")
        .context("dropping the page cache needs root (/proc/sys/vm/drop_caches)")
}

/// Sequential read bandwidth of `path` (up to 2 GiB) and of `n` reads of `chunk` bytes at
/// random offsets, from a dropped page cache, in GB/s.
fn disk_bandwidth(path: &Path, chunk: usize, n: usize) -> anyhow::Result<(f64, f64)> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    drop_caches()?;
    let mut buf = vec![0u8; 8 << 20];
    let (mut done, t) = (0u64, Instant::now());
    while done < len.min(2 << 30) {
        let r = f.read(&mut buf)?;
        if r == 0 {
            break;
        }
        done += r as u64;
    }
    let seq = done as f64 / t.elapsed().as_secs_f64() / 1e9;
    drop_caches()?;
    let mut rng = SplitMix64::new(9);
    let mut one = vec![0u8; chunk];
    let t = Instant::now();
    for _ in 0..n {
        let at = rng.below(len.saturating_sub(chunk as u64).max(1));
        f.seek(SeekFrom::Start(at))?;
        f.read_exact(&mut one)?;
    }
    let random = (n * chunk) as f64 / t.elapsed().as_secs_f64() / 1e9;
    Ok((seq, random))
}

fn parent(a: &Args) -> anyhow::Result<()> {
    let arms: Vec<String> = if a.arms.is_empty() {
        DEFAULT_ARMS.iter().map(|s| s.to_string()).collect()
    } else {
        a.arms.clone()
    };
    for arm in &arms {
        split_arm(arm).context("--arms")?;
    }
    let model = Model::load_with(
        &a.model,
        LoadOptions {
            experts: ExpertMemory::Mapped,
            ..LoadOptions::default()
        },
    )?;
    let all = model.weights().expert_bytes();
    let dense = model.resident_bytes() as u64;
    // N% is of the placement shape's experts (the largest expert's size x count), as `plan` and
    // `--memory-budget` read it; the children get the bytes
    let shape = nightshift_coordinator::cluster::model_shape(&model)?;
    let full = shape.expert_bytes * (shape.moe_layers.len() * shape.n_experts) as u64;
    let budget = nightshift_atlas_core::size::parse_size(&a.budget, full)?;
    let slack = nightshift_atlas_core::size::parse_size(&a.slack, 0)?;
    let c = model.config();
    let one = all
        / (c.n_expert as u64 * (0..c.n_layer).filter(|&l| c.is_moe_layer(l)).count() as u64).max(1);
    let (cold, limit) = match a.cold_cache.trim() {
        // what `--cold-cache auto` takes in a budget arm, whose process may still take the
        // slack once its resident set and dense weights are in: the cache comes out of it
        x if x.eq_ignore_ascii_case("auto") => (
            ColdCache::auto_capacity(slack, &*model),
            budget + dense + slack,
        ),
        x => {
            let cold = nightshift_atlas_core::size::parse_size(x, full)?;
            (cold, budget + dense + cold + slack)
        }
    };
    drop(model);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    println!(
        "model {}: experts {:.2} GiB ({:.1} MiB each), dense {:.2} GiB; budget {:.2} GiB ({:.0}% of the experts); cold cache {:.0} MiB; budget arms' cgroup limit {:.2} GiB",
        a.model.display(),
        gib(all),
        one as f64 / (1 << 20) as f64,
        gib(dense),
        gib(budget),
        100.0 * budget as f64 / all as f64,
        cold as f64 / (1u64 << 20) as f64,
        gib(limit)
    );
    let _cap = if a.disk_read_mbps > 0.0 {
        let cap = ReadCap::new(&a.model, a.disk_read_mbps)?;
        println!(
            "reads from {}'s disk capped at {} MB/s for every arm (blkio throttle)",
            a.model.display(),
            a.disk_read_mbps
        );
        Some(cap)
    } else {
        None
    };
    let (seq_bw, rnd_bw) = disk_bandwidth(&a.model, one as usize, 64)?;
    println!("disk read bandwidth (page cache dropped): sequential {seq_bw:.2} GB/s, expert-sized random reads {rnd_bw:.2} GB/s");
    let cg_dir = TempCgroup::new(CGROUP_ROOT)?;
    let cg = &cg_dir.0;
    let exe = std::env::current_exe()?;
    let mut results: Vec<Vec<Run>> = vec![Vec::new(); arms.len()];
    for round in 0..a.rounds {
        for (i, arm) in arms.iter().enumerate() {
            drop_caches()?;
            let lim = if arm == "all" { u64::MAX / 2 } else { limit };
            std::fs::write(cg.join("memory.limit_in_bytes"), lim.to_string())?;
            let out = Command::new(&exe)
                .args(["--model", &a.model.display().to_string()])
                .args(["--plan", &a.plan.display().to_string()])
                .args(["--budget", &budget.to_string()])
                .args(["--cold-cache", &cold.to_string()])
                .args(["--cold-io-depth", &a.cold_io_depth.to_string()])
                .args(["--prefill", &a.prefill.to_string()])
                .args(["--decode", &a.decode.to_string()])
                .args(["--threads", &a.threads.to_string()])
                .args(["--child", arm])
                .args(["--cgroup", &cg.display().to_string()])
                .output()?;
            if !out.status.success() {
                bail!(
                    "arm {arm} failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            let v: serde_json::Value = serde_json::from_slice(&out.stdout)
                .with_context(|| format!("arm {arm} printed no result"))?;
            let f = |k: &str| v.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0);
            let run = Run {
                prefill_tps: f("prefill_tps"),
                decode_tps: f("decode_tps"),
                resident_mib: f("resident_mib") as u64,
                prefetch: floats(v.get("prefetch")),
                disk_mib: f("disk_mib"),
                majflt: f("majflt"),
                minflt: f("minflt"),
                user_ms: f("user_ms"),
                huge_mib: f("huge_mib"),
                sys_ms: f("sys_ms"),
                phases: floats(v.get("phases")),
                hit: f("hit"),
                cold: v.get("cold").and_then(|c| c.as_str()).map(str::to_string),
                cold_decode: floats(v.get("cold_decode")),
            };
            println!(
                "round {round} {arm:<10} prefill {:7.2} tok/s  decode {:6.2} tok/s  resident {} MiB  per decode token: {:.1} ms, CPU {:.1} ms user + {:.1} ms system, read {:.1} MiB, {:.0} major / {:.0} minor faults, experts in memory {:.1}%{}",
                run.prefill_tps,
                run.decode_tps,
                run.resident_mib,
                1e3 / run.decode_tps.max(1e-9),
                run.user_ms,
                run.sys_ms,
                run.disk_mib,
                run.majflt,
                run.minflt,
                100.0 * run.hit,
                run.prefetch.map_or(String::new(), |[p, r, h, t, w]| format!(
                    "  prefetch precision {:.0}% recall {:.0}% cold requested {:.0}% (cached in time {:.0}%) wasted {:.0}%",
                    100.0 * p,
                    100.0 * r,
                    100.0 * h,
                    100.0 * t,
                    100.0 * w
                ))
            );
            if let Some([at, ro, ex, ff, he, re]) = run.phases {
                println!("    decode phases, ms per token: attention {at:.2}, router {ro:.2}, routed experts {ex:.2}, other FFN {ff:.2}, head {he:.2}, the rest {re:.2}; {:.0} MiB in huge pages", run.huge_mib);
            }
            if let Some(c) = &run.cold {
                println!("    {c}");
            }
            if let Some([m, w, bw]) = run.cold_decode {
                println!("    decode: {m:.1} demand reads and {w:.2} ms waiting on cold reads per token, {bw:.0} MiB/s while reading");
            }
            results[i].push(run);
        }
    }
    drop(cg_dir);
    println!("\n| arm | decode tok/s | prefill tok/s | read MiB / decode token | major faults / token | experts in memory at layer start |\n|---|---|---|---|---|---|");
    let range = |v: Vec<f64>| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        (lo, hi)
    };
    let mean = |v: &[Run], f: fn(&Run) -> f64| v.iter().map(f).sum::<f64>() / v.len().max(1) as f64;
    for (arm, runs) in arms.iter().zip(&results) {
        let (dl, dh) = range(runs.iter().map(|r| r.decode_tps).collect());
        let (pl, ph) = range(runs.iter().map(|r| r.prefill_tps).collect());
        let (rl, rh) = range(runs.iter().map(|r| r.disk_mib).collect());
        let (fl, fh) = range(runs.iter().map(|r| r.majflt).collect());
        let (hl, hh) = range(runs.iter().map(|r| 100.0 * r.hit).collect());
        println!("| {arm} | {dl:.2}-{dh:.2} | {pl:.2}-{ph:.2} | {rl:.1}-{rh:.1} | {fl:.0}-{fh:.0} | {hl:.1}-{hh:.1}% |");
    }
    let by = |name: &str| arms.iter().position(|x| x == name).map(|i| &results[i]);
    if let Some(p) = by("planned") {
        println!("\nratios of mean decode tok/s (targets: planned >= 1.5x pagecache, >= 1.3x random, >= 0.5x all):");
        let targets = [
            ("pagecache", Some(1.5)),
            ("random", Some(1.3)),
            ("all", Some(0.5)),
            // the staging cache vs whole experts through the page cache, and vs page faults
            // with the kernel's read-around
            ("planned-wn", None),
            ("planned-ra", None),
        ];
        for (other, target) in targets {
            if let Some(o) = by(other) {
                // per-round ratios give the range: the arms of one round ran back to back
                let per: Vec<f64> = p
                    .iter()
                    .zip(o)
                    .map(|(x, y)| x.decode_tps / y.decode_tps.max(1e-9))
                    .collect();
                let (lo, hi) = range(per);
                let m = mean(p, |r| r.decode_tps) / mean(o, |r| r.decode_tps).max(1e-9);
                let verdict = target.map_or(String::new(), |t| {
                    format!("  target {t}x  {}", if m >= t { "met" } else { "not met" })
                });
                println!("  planned / {other:<10} {m:.2}x (per round {lo:.2}-{hi:.2}){verdict}");
            }
        }
        let stats: Vec<[f64; 5]> = p.iter().filter_map(|r| r.prefetch).collect();
        if !stats.is_empty() {
            let avg =
                |i: usize| 100.0 * stats.iter().map(|s| s[i]).sum::<f64>() / stats.len() as f64;
            println!(
                "  prefetch: cold experts requested before their layer {:.0}% (target >= 60%), their pages all cached when it started {:.0}%; precision {:.0}%, recall {:.0}%, requests wasted {:.0}%",
                avg(2),
                avg(3),
                avg(0),
                avg(1),
                avg(4)
            );
        }
    }
    Ok(())
}
