//! The local cluster: `nightshift serve --nodes N` spawns N `nightshift-expert-node` processes on
//! this machine (one per NUMA domain when the machine has that many), writes the placement they
//! share, waits until each listens, restarts a node that dies, and stops them all on exit.
//! Unless given a token file, it makes a fresh auth token for its nodes (a 0600 file they read,
//! never a command-line argument), so no other local process can drive them.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nightshift_atlas_core::placement::{NodeSpec, Placement};

/// Errors of starting a local cluster.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot find the nightshift-expert-node binary next to {0} or on PATH")]
    NoBinary(String),
    #[error("cannot pick a free port: {0}")]
    Port(std::io::Error),
    #[error("cannot write the nodes' auth token {path}: {reason}")]
    Token { path: String, reason: String },
    #[error("cannot write the cluster placement {path}: {reason}")]
    Placement { path: String, reason: String },
    #[error("cannot start expert node {node}: {reason}")]
    Spawn { node: String, reason: String },
    #[error("expert node {node} exited during startup ({status}); see its log above")]
    DiedAtStart { node: String, status: String },
    #[error("expert node {node} did not listen on {addr} within {secs} s")]
    StartTimeout {
        node: String,
        addr: String,
        secs: u64,
    },
}

/// What to launch.
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    pub model: PathBuf,
    /// The placement to serve; its nodes are spawned here (their `addr` replaced by local ports).
    pub placement: Placement,
    /// Worker threads per node (None: the node decides).
    pub threads_per_node: Option<usize>,
    /// NUMA node per node index (empty: unpinned).
    pub numa: Vec<usize>,
    /// The token file the nodes require (None: a fresh token is made for this cluster).
    pub auth_token_file: Option<PathBuf>,
    /// TLS material the spawned nodes serve with (`None`: plaintext).
    pub tls: Option<NodeTls>,
    /// The expert-node executable (None: next to the current executable, then PATH).
    pub exe: Option<PathBuf>,
    /// Where the cluster's placement file is written.
    pub work_dir: PathBuf,
    /// How long a node may take to start listening.
    pub start_timeout: Duration,
    /// `RUST_LOG` for the nodes.
    pub node_log: String,
}

/// The TLS files a spawned node is started with (`--tls-cert`, `--tls-key`, `--tls-client-ca`).
#[derive(Clone, Debug)]
pub struct NodeTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require the coordinator's certificate to chain to this CA (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

struct Slot {
    name: String,
    addr: SocketAddr,
    args: Vec<String>,
    child: Option<Child>,
    restarts: u32,
    started: Instant,
}

struct Inner {
    exe: PathBuf,
    node_log: String,
    slots: Mutex<Vec<Slot>>,
    stopping: AtomicBool,
}

/// A supervised set of local expert-node processes; dropping it stops them.
pub struct LocalCluster {
    inner: Arc<Inner>,
    placement: Placement,
    placement_path: PathBuf,
    token: String,
    /// The token file this cluster made (removed on stop); None when the caller gave one.
    own_token_file: Option<PathBuf>,
    supervisor: Option<JoinHandle<()>>,
}

/// Free loopback ports for `n` nodes, a gRPC port and a data-link port each: all held until all
/// are picked (so no two are the same), then released for the nodes to bind. Every port a
/// local node binds comes from here: a node left to pick its own (port 0) could take one
/// reserved for a node not started yet. They are drawn at random from below the kernel's
/// ephemeral range (`ip_local_port_range`), where neither an outgoing connection's local port
/// nor anyone's bind to port 0 can land on them between their release and the node's bind (or
/// while a killed node restarts on the same port): from the ephemeral range, one start in ~12
/// of parallel test runs failed with the port taken. A port is handed out once per process
/// (`GIVEN`): two clusters started at once in one process (tests on parallel threads) cannot
/// both pick a port the first one's node has not bound yet.
fn free_ports(n: usize) -> Result<Vec<(SocketAddr, SocketAddr)>, LaunchError> {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    if given.len() > 8192 {
        // half the quiet range used up by one long-lived process: start over
        given.clear();
    }
    let mut candidates = random_ports(quiet_ports(), 64 * 2 * n.max(1)).into_iter();
    let mut held = Vec::with_capacity(2 * n);
    while held.len() < 2 * n {
        let l = match candidates.next() {
            Some(p) if given.contains(&p) => continue,
            Some(p) => match TcpListener::bind(("127.0.0.1", p)) {
                Ok(l) => l,
                // in use (or refused): try the next one
                Err(_) => continue,
            },
            // no quiet range here, or all candidates taken: the kernel's pick
            None => TcpListener::bind("127.0.0.1:0").map_err(LaunchError::Port)?,
        };
        held.push(l);
    }
    let addrs = held
        .iter()
        .map(|l| l.local_addr().map_err(LaunchError::Port))
        .collect::<Result<Vec<_>, _>>()?;
    given.extend(addrs.iter().map(|a| a.port()));
    Ok(addrs.chunks_exact(2).map(|p| (p[0], p[1])).collect())
}

/// Unprivileged ports below the ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`'s
/// first number, 32768 by default): 16384 up to it, or none when the range starts lower.
fn quiet_ports() -> std::ops::Range<u16> {
    let first = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    16384..first.max(16384)
}

/// `count` ports drawn at random from `range` (none when it is empty or randomness fails).
fn random_ports(range: std::ops::Range<u16>, count: usize) -> Vec<u16> {
    let span = u32::from(range.end.saturating_sub(range.start));
    let mut bytes = vec![0u8; 4 * count];
    if span == 0 || urandom(&mut bytes).is_err() {
        return Vec::new();
    }
    bytes
        .chunks_exact(4)
        .map(|b| {
            let x = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            range.start + (x % span) as u16
        })
        .collect()
}

/// A fresh random token (256 bits from the kernel's generator, hex).
pub(super) fn fresh_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    urandom(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Fills `buf` from the kernel's random generator.
fn urandom(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// Writes `token` to a new file at `path` that only this user can read (mode 0600, created
/// exclusively: an existing file or symlink there is an error, never overwritten or followed).
pub(super) fn write_token_file(path: &Path, token: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    let mut f = o.open(path)?;
    f.write_all(token.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()
}

/// [`write_token_file`] at a name made of this process's id and its own counter: a file
/// already there can only be a leftover of a killed process that had the same id (this one never
/// repeats a name), so it is removed first (a symlink itself, never its target). Kept, it made
/// every later `--nodes` launch under that id fail with "File exists".
fn write_own_token_file(path: &Path, token: &str) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            tracing::warn!(path = %path.display(), "removed a token file left by a killed process")
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    write_token_file(path, token)
}

/// Reads the token of a `--auth-token-file` (trimmed; empty is an error).
fn read_token_file(path: &Path) -> Result<String, LaunchError> {
    let err = |reason: String| LaunchError::Token {
        path: path.display().to_string(),
        reason,
    };
    let t = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let t = t.trim();
    if t.is_empty() {
        return Err(err("the file is empty".into()));
    }
    Ok(t.to_string())
}

/// Finds `nightshift-expert-node`: next to the running executable, or on PATH.
pub fn find_node_binary() -> Result<PathBuf, LaunchError> {
    let me = std::env::current_exe().map_err(|e| LaunchError::NoBinary(e.to_string()))?;
    let name = format!("nightshift-expert-node{}", std::env::consts::EXE_SUFFIX);
    let mut dirs: Vec<PathBuf> = me.parent().into_iter().map(Path::to_path_buf).collect();
    // Test binaries live in target/<profile>/deps; the binaries one level up.
    if let Some(up) = me.parent().and_then(Path::parent) {
        dirs.push(up.to_path_buf());
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.into_iter()
        .map(|d| d.join(&name))
        .find(|p| p.is_file())
        .ok_or_else(|| LaunchError::NoBinary(me.display().to_string()))
}

/// Starts one node. On Linux the node gets SIGTERM when the thread that spawned it dies (the
/// caller of `start` or the supervisor, both living as long as the cluster), so a coordinator
/// that crashes never leaves orphaned nodes holding ports and memory.
fn spawn(exe: &Path, slot: &Slot, log: &str) -> Result<Child, LaunchError> {
    let mut cmd = Command::new(exe);
    cmd.args(&slot.args)
        .env("RUST_LOG", log)
        .stdin(Stdio::null());
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the forked child before exec and only calls prctl(2),
        // which is async-signal-safe; it touches no memory shared with the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.spawn().map_err(|e| LaunchError::Spawn {
        node: slot.name.clone(),
        reason: e.to_string(),
    })
}

impl LocalCluster {
    /// Spawns the nodes and waits until every one listens.
    pub fn start(opts: LaunchOptions) -> Result<LocalCluster, LaunchError> {
        let exe = match &opts.exe {
            Some(p) => p.clone(),
            None => find_node_binary()?,
        };
        let mut nodes: Vec<NodeSpec> = opts.placement.nodes.clone();
        let ports = free_ports(nodes.len())?;
        for (i, n) in nodes.iter_mut().enumerate() {
            n.addr = Some(ports[i].0.to_string());
            if n.numa.is_none() {
                n.numa = opts.numa.get(i).map(|&x| x as u32);
            }
        }
        let mut placement = opts.placement.clone();
        placement.nodes = nodes;
        std::fs::create_dir_all(&opts.work_dir).map_err(|e| LaunchError::Placement {
            path: opts.work_dir.display().to_string(),
            reason: e.to_string(),
        })?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = NEXT.fetch_add(1, Ordering::Relaxed);
        let placement_path = opts.work_dir.join(format!(
            "cluster-placement-{}-{seq}.toml",
            std::process::id()
        ));
        placement
            .save_atomic(&placement_path)
            .map_err(|e| LaunchError::Placement {
                path: placement_path.display().to_string(),
                reason: e.to_string(),
            })?;
        let (token, token_path, own_token_file) = match &opts.auth_token_file {
            Some(p) => (read_token_file(p)?, p.clone(), None),
            None => {
                let path = opts
                    .work_dir
                    .join(format!("node-token-{}-{seq}", std::process::id()));
                let token = fresh_token()
                    .and_then(|t| write_own_token_file(&path, &t).map(|()| t))
                    .map_err(|e| LaunchError::Token {
                        path: path.display().to_string(),
                        reason: e.to_string(),
                    })?;
                (token, path.clone(), Some(path))
            }
        };
        // Nodes with a bound on their resident experts default to `--cold-cache auto`, half of
        // the memory each may still take: on one machine they would each count the same free
        // memory, so each is given its share of that half instead.
        let shared = placement.nodes.len() as u64;
        let cold_share = (shared > 1)
            .then(nightshift_model::weights::mem_available)
            .flatten()
            .map(|free| (free / (2 * shared)).max(1));
        let mut slots = Vec::new();
        for (n, &(_, link_addr)) in placement.nodes.iter().zip(&ports) {
            let addr: SocketAddr =
                n.addr
                    .as_deref()
                    .unwrap_or_default()
                    .parse()
                    .map_err(|_| LaunchError::Spawn {
                        node: n.name.clone(),
                        reason: "no local address".into(),
                    })?;
            let mut args = vec![
                "--model".to_string(),
                opts.model.display().to_string(),
                "--placement".into(),
                placement_path.display().to_string(),
                "--node".into(),
                n.name.clone(),
                "--listen".into(),
                addr.to_string(),
                "--link-listen".into(),
                link_addr.to_string(),
            ];
            if let Some(numa) = n.numa {
                args.extend(["--numa".into(), numa.to_string()]);
            }
            if let Some(t) = opts.threads_per_node {
                args.extend(["--threads".into(), t.to_string()]);
            }
            if let (Some(bytes), true) = (cold_share, n.memory_bytes > 0) {
                args.extend(["--cold-cache".into(), bytes.to_string()]);
            }
            args.extend(["--auth-token-file".into(), token_path.display().to_string()]);
            if let Some(t) = &opts.tls {
                args.extend([
                    "--tls-cert".into(),
                    t.cert.display().to_string(),
                    "--tls-key".into(),
                    t.key.display().to_string(),
                ]);
                if let Some(ca) = &t.client_ca {
                    args.extend(["--tls-client-ca".into(), ca.display().to_string()]);
                }
            }
            slots.push(Slot {
                name: n.name.clone(),
                addr,
                args,
                child: None,
                restarts: 0,
                started: Instant::now(),
            });
        }
        let inner = Arc::new(Inner {
            exe,
            node_log: opts.node_log.clone(),
            slots: Mutex::new(slots),
            stopping: AtomicBool::new(false),
        });
        let mut cluster = LocalCluster {
            inner: inner.clone(),
            placement,
            placement_path,
            token,
            own_token_file,
            supervisor: None,
        };
        {
            let mut slots = lock(&inner.slots);
            for s in slots.iter_mut() {
                s.child = Some(spawn(&inner.exe, s, &inner.node_log)?);
                s.started = Instant::now();
            }
        }
        cluster.wait_listening(opts.start_timeout)?;
        let sup = inner.clone();
        cluster.supervisor = Some(
            std::thread::Builder::new()
                .name("node-supervisor".into())
                .spawn(move || supervise(sup))
                .map_err(|e| LaunchError::Spawn {
                    node: "supervisor".into(),
                    reason: e.to_string(),
                })?,
        );
        Ok(cluster)
    }

    fn wait_listening(&self, timeout: Duration) -> Result<(), LaunchError> {
        let (names, addrs): (Vec<String>, Vec<SocketAddr>) = lock(&self.inner.slots)
            .iter()
            .map(|s| (s.name.clone(), s.addr))
            .unzip();
        let waited = wait_until_listening(
            addrs.len(),
            timeout,
            |i| {
                let mut slots = lock(&self.inner.slots);
                let status = slots[i].child.as_mut().map(Child::try_wait);
                match status {
                    Some(Ok(Some(status))) => Some(status.to_string()),
                    _ => None,
                }
            },
            |pending| {
                Ok::<_, std::convert::Infallible>(
                    pending.iter().map(|&i| dials(addrs[i])).collect(),
                )
            },
        );
        match waited {
            Ok(()) => Ok(()),
            Err(NotListening::Died(i, status)) => Err(LaunchError::DiedAtStart {
                node: names[i].clone(),
                status,
            }),
            Err(NotListening::TimedOut(i)) => Err(LaunchError::StartTimeout {
                node: names[i].clone(),
                addr: addrs[i].to_string(),
                secs: timeout.as_secs(),
            }),
            Err(NotListening::Probe(never)) => match never {},
        }
    }

    /// The placement the nodes serve (with their local addresses).
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Where that placement was written.
    pub fn placement_path(&self) -> &Path {
        &self.placement_path
    }

    /// The token the nodes require (`RemoteOptions::auth_token`).
    pub fn auth_token(&self) -> &str {
        &self.token
    }

    /// Process id of a node (for tests and operators).
    pub fn pid(&self, node: &str) -> Option<u32> {
        lock(&self.inner.slots)
            .iter()
            .find(|s| s.name == node)
            .and_then(|s| s.child.as_ref().map(Child::id))
    }

    /// How often a node was restarted.
    pub fn restarts(&self, node: &str) -> u32 {
        lock(&self.inner.slots)
            .iter()
            .find(|s| s.name == node)
            .map_or(0, |s| s.restarts)
    }

    /// Pauses supervision of one node: kills it and does not restart it until `resume`.
    pub fn kill_and_hold(&self, node: &str) {
        let mut slots = lock(&self.inner.slots);
        if let Some(s) = slots.iter_mut().find(|s| s.name == node) {
            if let Some(mut c) = s.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Restarts a node held by `kill_and_hold`.
    pub fn resume(&self, node: &str) -> Result<(), LaunchError> {
        let mut slots = lock(&self.inner.slots);
        if let Some(s) = slots.iter_mut().find(|s| s.name == node) {
            if s.child.is_none() {
                s.child = Some(spawn(&self.inner.exe, s, &self.inner.node_log)?);
                s.started = Instant::now();
                s.restarts += 1;
            }
        }
        Ok(())
    }

    /// Stops every node (SIGTERM-like kill, then wait).
    pub fn stop(&mut self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        if let Some(h) = self.supervisor.take() {
            let _ = h.join();
        }
        let mut children: Vec<Child> = lock(&self.inner.slots)
            .iter_mut()
            .filter_map(|s| s.child.take())
            .collect();
        terminate_all(&mut children);
        let _ = std::fs::remove_file(&self.placement_path);
        if let Some(t) = &self.own_token_file {
            let _ = std::fs::remove_file(t);
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Asks every child to stop (SIGTERM) at once, waits for them together for a grace period,
/// then kills those still running: stopping N nodes takes one grace period, not N.
fn terminate_all(children: &mut [Child]) {
    #[cfg(unix)]
    {
        for c in children.iter() {
            // SAFETY: kill(2) on the pid of a child we own and have not reaped; no memory is
            // touched.
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        let start = Instant::now();
        let mut running: Vec<&mut Child> = children.iter_mut().collect();
        while !running.is_empty() && start.elapsed() < Duration::from_secs(3) {
            running.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for c in children.iter_mut() {
        if !matches!(c.try_wait(), Ok(Some(_))) {
            let _ = c.kill();
        }
        let _ = c.wait();
    }
}

/// Restarts nodes that exit, with a growing pause for nodes that keep dying.
fn supervise(inner: Arc<Inner>) {
    while !inner.stopping.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        let mut slots = lock(&inner.slots);
        for s in slots.iter_mut() {
            let Some(c) = s.child.as_mut() else { continue };
            let Ok(Some(status)) = c.try_wait() else {
                continue;
            };
            let pause = Duration::from_millis(200 * u64::from(s.restarts.min(25)));
            if s.started.elapsed() < pause {
                continue;
            }
            tracing::warn!(node = %s.name, "expert node exited ({status}); restarting");
            match spawn(&inner.exe, s, &inner.node_log) {
                Ok(child) => {
                    s.child = Some(child);
                    s.restarts += 1;
                    s.started = Instant::now();
                }
                Err(e) => tracing::error!("{e}"),
            }
        }
    }
}

/// Why nodes being started are not all listening.
pub(super) enum NotListening<E> {
    /// Node `i` exited, with this status.
    Died(usize, String),
    /// Node `i` still did not listen when the time was up.
    TimedOut(usize),
    /// Probing failed.
    Probe(E),
}

/// Whether something accepts TCP connections at `addr` (within 100 ms).
pub(super) fn dials(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok()
}

/// Waits until all `n` nodes being started listen: `exited(i)` gives node `i`'s exit status if
/// it died, `listening(pending)` which of the pending nodes accept connections; polled every
/// 50 ms until `timeout`. One loop for the local launcher and the network-namespace harness.
pub(super) fn wait_until_listening<E>(
    n: usize,
    timeout: Duration,
    mut exited: impl FnMut(usize) -> Option<String>,
    mut listening: impl FnMut(&[usize]) -> Result<Vec<bool>, E>,
) -> Result<(), NotListening<E>> {
    let start = Instant::now();
    let mut pending: Vec<usize> = (0..n).collect();
    while !pending.is_empty() {
        if let Some((i, status)) = pending.iter().find_map(|&i| exited(i).map(|s| (i, s))) {
            return Err(NotListening::Died(i, status));
        }
        let up = listening(&pending).map_err(NotListening::Probe)?;
        pending = pending
            .iter()
            .zip(up)
            .filter(|&(_, up)| !up)
            .map(|(&i, _)| i)
            .collect();
        if let Some(&i) = pending.first() {
            if start.elapsed() > timeout {
                return Err(NotListening::TimedOut(i));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::{free_ports, quiet_ports, write_own_token_file};

    #[test]
    fn a_token_file_left_by_a_killed_process_is_replaced() {
        let dir = std::env::temp_dir().join(format!("ns-token-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("node-token-1-0");
        std::fs::write(&path, "stale\n").expect("leftover");
        write_own_token_file(&path, "fresh").expect("a leftover does not stop the launch");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "fresh\n");
        // no file there: written as before
        std::fs::remove_file(&path).expect("remove");
        write_own_token_file(&path, "again").expect("write");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "again\n");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn local_nodes_get_distinct_ports_below_the_ephemeral_range_once_per_process() {
        let quiet = quiet_ports();
        let ports = free_ports(4).expect("ports");
        let mut all: Vec<u16> = ports
            .iter()
            .flat_map(|(a, b)| [a.port(), b.port()])
            .collect();
        assert_eq!(all.len(), 8);
        if !quiet.is_empty() {
            assert!(
                all.iter().all(|p| quiet.contains(p)),
                "{all:?} outside {quiet:?}"
            );
        }
        // a second cluster of this process never gets one of the first's ports, even unbound
        let again = free_ports(4).expect("ports");
        all.extend(again.iter().flat_map(|(a, b)| [a.port(), b.port()]));
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 16, "a port picked twice");
    }
}
