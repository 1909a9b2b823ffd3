//! The multi-host harness on one machine (issue 23), used by `tests/cluster_netns.rs`,
//! `tests/cluster_stall.rs` and `cluster-report --netns`: the coordinator and every expert node
//! in their own network namespace, joined by veth pairs to a bridge with private addresses that
//! exist only inside the namespaces, each node's link capped both ways by a `tc tbf` qdisc
//! (`scripts/netns-cluster.sh` builds and removes the network), and, when asked, a delay relay
//! per link in the coordinator's namespace (`relay.rs`: this kernel has no `netem`). Nodes are
//! real `nightshift-expert-node` processes entered into their namespace before `exec`; the
//! coordinator side (`RemoteExperts`) is built by a thread that entered the coordinator's
//! namespace (`in_coord`), so its runtime threads and every socket they open live there.
//! Dropping a [`NetnsCluster`] kills its nodes and removes every namespace (the script also
//! removes what it made when `up` fails half way; nodes die with their parent, and the next
//! harness removes the namespaces of one whose process was killed).

pub mod relay;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nightshift_atlas_core::placement::Placement;

use super::launcher::{dials, fresh_token, wait_until_listening, write_token_file, NotListening};
use super::NodeTls;
pub use relay::Relay;

/// Port every node listens on, on its own namespace's address.
const NODE_PORT: u16 = 7000;
/// Port of every node's framed data link (`nightshift_proto::link`), beside [`NODE_PORT`].
const LINK_PORT: u16 = 7001;

/// Errors of building the harness.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("network namespaces are not available here ({0}); the harness needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2")]
    Unavailable(String),
    #[error("scripts/netns-cluster.sh {args} failed: {reason}")]
    Script { args: String, reason: String },
    #[error("cannot enter network namespace {ns}: {reason}")]
    Enter { ns: String, reason: String },
    #[error("cannot start expert node {node} in its namespace: {reason}")]
    Spawn { node: String, reason: String },
    #[error("expert node {node} exited during startup ({status})")]
    DiedAtStart { node: String, status: String },
    #[error("expert node {node} did not listen on {addr} within {secs} s")]
    StartTimeout {
        node: String,
        addr: String,
        secs: u64,
    },
    #[error("cannot write {path}: {reason}")]
    Write { path: String, reason: String },
    #[error("cannot start the delay relay of {node}: {reason}")]
    Relay { node: String, reason: String },
}

/// The network script: `NIGHTSHIFT_NETNS_SCRIPT`, else the workspace's `scripts/netns-cluster.sh`.
pub fn script_path() -> PathBuf {
    std::env::var_os("NIGHTSHIFT_NETNS_SCRIPT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/netns-cluster.sh")
        })
}

/// Whether this process may create network namespaces (`ip netns add`): Ok, or why not.
pub fn available() -> Result<(), NetnsError> {
    // One name per call: tests of one process probe side by side.
    static PROBES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = format!("nsprobe{}x{n}", std::process::id());
    let out = Command::new("ip")
        .args(["netns", "add", &probe])
        .output()
        .map_err(|e| NetnsError::Unavailable(format!("running ip: {e}")))?;
    if !out.status.success() {
        return Err(NetnsError::Unavailable(format!(
            "ip netns add: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let _ = Command::new("ip").args(["netns", "del", &probe]).status();
    Ok(())
}

/// Address of node `i` inside the harness network (what `netns-cluster.sh addr` prints).
pub fn node_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 0, 10 + i as u8)
}

/// Where node `i`'s relays listen in the coordinator's namespace: one loopback address per
/// node, so its gRPC and data-link relays keep the node's own port numbers (the coordinator
/// dials the data link on the gRPC address's host and the port the node reports).
pub fn relay_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 1, 1 + i as u8)
}

/// The names a node certificate must carry for the coordinator to dial it directly or through
/// its relay.
pub fn node_cert_names(nodes: usize) -> Vec<String> {
    let mut v = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    v.extend((0..nodes).map(|i| node_ip(i).to_string()));
    v.extend((0..nodes).map(|i| relay_ip(i).to_string()));
    v
}

/// What to start.
#[derive(Clone, Debug)]
pub struct NetnsOptions {
    pub model: PathBuf,
    /// The placement served; one node per entry, each in its namespace (addresses replaced).
    pub placement: Placement,
    pub threads_per_node: Option<usize>,
    /// TLS the nodes serve with (certificates carrying [`node_cert_names`]).
    pub tls: Option<NodeTls>,
    /// The `nightshift-expert-node` executable.
    pub exe: PathBuf,
    /// Where the placement and token files go.
    pub work_dir: PathBuf,
    /// Cap of each node's link, each way, as `tc` takes it (`10gbit`, `5mbit`).
    pub rate: String,
    /// `Some(d)`: the coordinator reaches each node through a delay relay adding `d` each way;
    /// `None`: directly.
    pub delay: Option<Duration>,
    pub start_timeout: Duration,
    /// `RUST_LOG` of the nodes.
    pub node_log: String,
}

/// Nodes in their namespaces, the network between them, and the relays; see the module doc.
pub struct NetnsCluster {
    prefix: String,
    script: PathBuf,
    children: Vec<Option<Child>>,
    names: Vec<String>,
    relays: Vec<Relay>,
    placement: Placement,
    token: String,
    files: Vec<PathBuf>,
}

fn run_script(script: &Path, args: &[&str]) -> Result<(), NetnsError> {
    let out = Command::new("bash")
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| NetnsError::Script {
            args: args.join(" "),
            reason: e.to_string(),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetnsError::Script {
            args: args.join(" "),
            reason: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Moves the calling thread into network namespace `ns` (threads it spawns afterwards start
/// there too).
fn enter(ns: &str) -> Result<(), NetnsError> {
    let err = |reason: String| NetnsError::Enter {
        ns: ns.to_string(),
        reason,
    };
    let f =
        std::fs::File::open(Path::new("/run/netns").join(ns)).map_err(|e| err(e.to_string()))?;
    // SAFETY: setns(2) on a namespace file descriptor we hold open; it changes only this
    // thread's network namespace and touches no memory.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(err(std::io::Error::last_os_error().to_string()));
    }
    Ok(())
}

/// Runs `f` on a fresh thread inside network namespace `ns` and returns its result.
pub fn in_ns<R: Send>(ns: &str, f: impl FnOnce() -> R + Send) -> Result<R, NetnsError> {
    std::thread::scope(|s| {
        s.spawn(|| enter(ns).map(|()| f()))
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Removes the namespaces of harnesses whose process died without dropping them (killed): named
/// `nsc<pid>x<seq>-*` after a pid that no longer runs.
fn sweep_stale(script: &Path) {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    let mut dead: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|name| name.split_once('-').map(|(prefix, _)| prefix.to_string()))
        .filter(|prefix| {
            prefix
                .strip_prefix("nsc")
                .and_then(|r| r.split_once('x'))
                .and_then(|(pid, _)| pid.parse::<u32>().ok())
                .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        })
        .collect();
    dead.sort();
    dead.dedup();
    for prefix in dead {
        match run_script(script, &["down", &prefix]) {
            Ok(()) => tracing::info!("removed the namespaces of a dead harness ({prefix})"),
            Err(e) => tracing::warn!("{e}"),
        }
    }
}

impl NetnsCluster {
    /// Builds the network (`netns-cluster.sh up`), starts every node in its namespace, waits
    /// until each listens (checked from the coordinator's namespace), and starts the relays.
    pub fn start(opts: NetnsOptions) -> Result<NetnsCluster, NetnsError> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let seq = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let prefix = format!("nsc{}x{seq}", std::process::id());
        let script = script_path();
        sweep_stale(&script);
        let n = opts.placement.nodes.len();
        run_script(&script, &["up", &prefix, &n.to_string(), &opts.rate])?;
        // From here on, Drop removes the namespaces whatever fails.
        let mut c = NetnsCluster {
            prefix,
            script,
            children: Vec::new(),
            names: opts
                .placement
                .nodes
                .iter()
                .map(|n| n.name.clone())
                .collect(),
            relays: Vec::new(),
            placement: opts.placement.clone(),
            token: String::new(),
            files: Vec::new(),
        };
        c.launch(&opts)?;
        Ok(c)
    }

    fn launch(&mut self, opts: &NetnsOptions) -> Result<(), NetnsError> {
        let write_err = |p: &Path, e: String| NetnsError::Write {
            path: p.display().to_string(),
            reason: e,
        };
        std::fs::create_dir_all(&opts.work_dir)
            .map_err(|e| write_err(&opts.work_dir, e.to_string()))?;
        let token_path = opts.work_dir.join(format!("{}-token", self.prefix));
        self.token = fresh_token()
            .and_then(|t| write_token_file(&token_path, &t).map(|()| t))
            .map_err(|e| write_err(&token_path, e.to_string()))?;
        self.files.push(token_path.clone());
        let targets: Vec<SocketAddr> = (0..self.names.len())
            .map(|i| SocketAddr::new(IpAddr::V4(node_ip(i)), NODE_PORT))
            .collect();
        // The relays first: their ports are the addresses the coordinator dials. Each node
        // has two, its gRPC port's and its data link's, on a loopback address of its own.
        if let Some(delay) = opts.delay {
            let names = self.names.clone();
            self.relays = in_ns(&self.coord_ns(), || {
                let mut relays = Vec::new();
                for (i, name) in names.iter().enumerate() {
                    for port in [NODE_PORT, LINK_PORT] {
                        let listen = SocketAddr::new(IpAddr::V4(relay_ip(i)), port);
                        let target = SocketAddr::new(IpAddr::V4(node_ip(i)), port);
                        let relay =
                            Relay::start(listen, target, delay).map_err(|e| NetnsError::Relay {
                                node: name.clone(),
                                reason: format!("{listen}: {e}"),
                            })?;
                        relays.push(relay);
                    }
                }
                Ok::<_, NetnsError>(relays)
            })??;
        }
        for (i, n) in self.placement.nodes.iter_mut().enumerate() {
            let dial = self.relays.get(2 * i).map_or(targets[i], Relay::addr);
            n.addr = Some(dial.to_string());
        }
        let placement_path = opts
            .work_dir
            .join(format!("{}-placement.toml", self.prefix));
        self.placement
            .save_atomic(&placement_path)
            .map_err(|e| write_err(&placement_path, e.to_string()))?;
        self.files.push(placement_path.clone());
        for (i, name) in self.names.clone().iter().enumerate() {
            let mut args = vec![
                "--model".to_string(),
                opts.model.display().to_string(),
                "--placement".into(),
                placement_path.display().to_string(),
                "--node".into(),
                name.clone(),
                "--listen".into(),
                targets[i].to_string(),
                "--link-listen".into(),
                SocketAddr::new(IpAddr::V4(node_ip(i)), LINK_PORT).to_string(),
                "--auth-token-file".into(),
                token_path.display().to_string(),
            ];
            if let Some(t) = opts.threads_per_node {
                args.extend(["--threads".into(), t.to_string()]);
            }
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
            let child = self.spawn_node(i, &opts.exe, &args, &opts.node_log)?;
            self.children.push(Some(child));
        }
        self.wait_listening(&targets, opts.start_timeout)
    }

    fn spawn_node(
        &self,
        i: usize,
        exe: &Path,
        args: &[String],
        log: &str,
    ) -> Result<Child, NetnsError> {
        let ns = self.node_ns(i);
        let err = |reason: String| NetnsError::Spawn {
            node: self.names[i].clone(),
            reason,
        };
        let f = std::fs::File::open(Path::new("/run/netns").join(&ns))
            .map_err(|e| err(format!("{ns}: {e}")))?;
        let fd = f.as_raw_fd();
        let mut cmd = Command::new(exe);
        cmd.args(args).env("RUST_LOG", log).stdin(Stdio::null());
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the forked child before exec and only makes the
        // async-signal-safe calls setns(2) (on `fd`, open until `f` drops after spawn) and
        // prctl(2); it touches no memory shared with the parent.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0
                    || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| err(e.to_string()));
        drop(f);
        child
    }

    fn wait_listening(
        &mut self,
        targets: &[SocketAddr],
        timeout: Duration,
    ) -> Result<(), NetnsError> {
        let coord = self.coord_ns();
        let children = &mut self.children;
        let waited = wait_until_listening(
            targets.len(),
            timeout,
            |i| match children[i].as_mut().map(Child::try_wait) {
                Some(Ok(Some(status))) => Some(status.to_string()),
                _ => None,
            },
            // dialled from the coordinator's namespace, where the nodes' addresses are
            |pending| {
                in_ns(&coord, || {
                    pending.iter().map(|&i| dials(targets[i])).collect()
                })
            },
        );
        match waited {
            Ok(()) => Ok(()),
            Err(NotListening::Died(i, status)) => Err(NetnsError::DiedAtStart {
                node: self.names[i].clone(),
                status,
            }),
            Err(NotListening::TimedOut(i)) => Err(NetnsError::StartTimeout {
                node: self.names[i].clone(),
                addr: targets[i].to_string(),
                secs: timeout.as_secs(),
            }),
            Err(NotListening::Probe(e)) => Err(e),
        }
    }

    /// The coordinator's namespace.
    pub fn coord_ns(&self) -> String {
        format!("{}-coord", self.prefix)
    }

    /// Node `i`'s namespace.
    pub fn node_ns(&self, i: usize) -> String {
        format!("{}-node{i}", self.prefix)
    }

    /// Runs `f` in the coordinator's namespace (build `RemoteExperts` there).
    pub fn in_coord<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R, NetnsError> {
        in_ns(&self.coord_ns(), f)
    }

    /// The placement with the addresses the coordinator dials (relays, or the nodes).
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The token the nodes require.
    pub fn auth_token(&self) -> &str {
        &self.token
    }

    /// Process id of node `i`.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.children.get(i)?.as_ref().map(Child::id)
    }

    /// Sends `signal` (e.g. `libc::SIGSTOP`, `libc::SIGCONT`) to node `i`.
    pub fn signal(&self, i: usize, signal: i32) -> std::io::Result<()> {
        let pid = self
            .pid(i)
            .ok_or_else(|| std::io::Error::other(format!("no node {i}")))?;
        // SAFETY: kill(2) on the pid of a child we own and have not reaped; no memory is touched.
        if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sets node `i`'s link up or down inside its namespace.
    pub fn set_link(&self, i: usize, up: bool) -> Result<(), NetnsError> {
        let state = if up { "up" } else { "down" };
        run_script(&self.script, &["link", &self.prefix, &i.to_string(), state])
    }

    /// Changes node `i`'s bandwidth cap (each way).
    pub fn set_rate(&self, i: usize, rate: &str) -> Result<(), NetnsError> {
        run_script(&self.script, &["rate", &self.prefix, &i.to_string(), rate])
    }
}

impl Drop for NetnsCluster {
    fn drop(&mut self) {
        self.relays.clear();
        for c in self.children.iter_mut().filter_map(Option::take) {
            let mut c = c;
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Err(e) = run_script(&self.script, &["down", &self.prefix]) {
            tracing::warn!("{e}");
        }
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}
