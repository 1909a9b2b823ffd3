//! The shared-memory link between a coordinator and an expert node on the same machine (the
//! local cluster, or one VM with a node per NUMA domain).
//!
//! Over loopback gRPC one layer call crosses six threads (engine -> client connection task ->
//! node connection task -> compute worker -> node connection task -> client connection task ->
//! engine), and on a machine whose cores are all busy each crossing is a wake-up of a parked
//! thread. Here the coordinator writes the same request a `ComputeRequest` carries into a file
//! in `/dev/shm` that both processes map and wakes the node's link thread with a futex on the
//! region's request counter; that thread computes and wakes the coordinator with a futex on the
//! response counter: two wake-ups per call. The region's pages are reserved when it is created
//! (so a full `/dev/shm` fails the attach, and the stream is used, instead of faulting later). The gRPC stream stays open beside it: the region is
//! handed over with the `AttachShm` call, control calls keep using gRPC, and requests that do not
//! fit the region go over the stream.
//!
//! Both ends run on one machine, so numbers, outputs included, are in its native byte order. The
//! region (all offsets from its start):
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `NSSHMv01` |
//! | 8..16 | region size |
//! | 16..24 | request capacity (the response area takes the rest) |
//! | 24..28 | request counter: bumped by the coordinator after writing a request (futex) |
//! | 28..32 | response counter: set to the request's counter by the node after answering (futex) |
//! | 32..36 | closed: bit 0 the coordinator left, bit 1 the node left |
//! | 36..40 | the coordinator's process id (the node stops serving when it is gone) |
//! | 64..104 | request: id u64, layer, act_type, n_rows, n_embd, n_pairs, acts_len, claim tag, owned groups (u32 each) |
//! | 128..148 | response: id u64, status i32 (0 = outputs, else a gRPC code), length u32, answered u32 |
//! | 256..264 | the request's prefetch hint: layer u32, count u32 (0: none) |
//! | 264..4096 | its experts, u32 each (at most [`MAX_HINT_EXPERTS`]) |
//! | 4096.. | request payload: experts\[n_pairs\] u32, rows\[n_pairs\] u32, activation bytes |
//! | 4096 + cap.. | response payload: one row of n_embd f32 per request pair (slot i for pair i), then the answered list; or the error message as UTF-8 |
//!
//! The node computes straight into the row slots ([`ShmServer::rows_mut`]) and the coordinator
//! reads them from there into its own buffer ([`ShmClient::wait_view`]): the outputs are not
//! copied on the way. A request with a claim tag (not 0) is a *shared* call ([`board`]): the node
//! computes only the expert groups it claims from the board, fills their slots, and lists the
//! pairs it computed ("answered" of them, `u32` indices into the request's pairs) after the
//! slots. The first "owned groups" expert groups of a shared request are this node's alone (the
//! ones it was hinted to read ahead), computed without claiming; the board's group numbers
//! count the groups after them, which every node taking part is sent in the same order. An answer to an ordinary request fills every slot and has answered = `u32::MAX`.
//!
//! The coordinator writes the request area only while no request is outstanding, the node the
//! response area only while one is; the counters' release/acquire order publishes each. The node
//! copies a request out before checking it, and checks every length against the region, so a
//! region written by anything else gives an error reply, never a read outside it.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use memmap2::MmapRaw;

use crate::v1::{ComputeRequest, PrefetchHint};

pub mod board;
mod files;
mod futex;
mod region;

pub use files::sweep_stale;
use files::{create_file, open_checked, process_alive};
use futex::{futex_wait, futex_wake};
use region::{from_u32s, u32s, Region};

/// Where regions are created; the node refuses paths elsewhere.
pub const SHM_DIR: &str = "/dev/shm";
/// File name prefix of a region; the node refuses other names.
pub const SHM_PREFIX: &str = "nightshift-";
/// Start of the request payload.
pub const HEADER_BYTES: usize = 4096;
/// Largest region a node maps.
pub const MAX_REGION: usize = 1 << 31;

const MAGIC: u64 = u64::from_le_bytes(*b"NSSHMv01");
const OFF_MAGIC: usize = 0;
const OFF_SIZE: usize = 8;
const OFF_REQ_CAP: usize = 16;
const OFF_REQ_SEQ: usize = 24;
const OFF_RESP_SEQ: usize = 28;
const OFF_CLOSED: usize = 32;
const OFF_CLIENT_PID: usize = 36;
const OFF_REQ: usize = 64;
const OFF_RESP: usize = 128;
const OFF_HINT: usize = 256;
const OFF_HINT_EXPERTS: usize = OFF_HINT + 8;
/// Most experts of a prefetch hint the region carries (the rest of the header page); a longer
/// hint is cut to its first ones (it is only a hint).
pub const MAX_HINT_EXPERTS: usize = (HEADER_BYTES - OFF_HINT_EXPERTS) / 4;
/// "answered" of a reply that covers every pair of its request.
const ALL_PAIRS: u32 = u32::MAX;
const CLOSED_CLIENT: u32 = 1;
const CLOSED_NODE: u32 = 2;
/// How long one futex wait lasts before the waiter re-checks its peer.
const SLICE: Duration = Duration::from_millis(20);

/// Errors of the shared-memory link.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("refused region {path}: {reason}")]
    Refused { path: String, reason: String },
    #[error("the request does not fit the shared region")]
    TooLarge,
    #[error("the peer closed the shared-memory link")]
    Closed,
    #[error("the peer is gone")]
    PeerGone,
    #[error("deadline of {0} ms passed")]
    Deadline(u128),
    #[error("malformed response in the shared region: {0}")]
    Malformed(String),
}

/// A node's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShmReply {
    /// One row of n_embd little-endian f32 per pair.
    Outputs(Vec<u8>),
    /// A shared call's answer: the pairs this node computed (indices into the request's pairs,
    /// in the order of `outputs`) and one row of n_embd little-endian f32 for each.
    Partial { pairs: Vec<u32>, outputs: Vec<u8> },
    /// A gRPC status code and message.
    Error { code: i32, message: String },
}

/// A node's answer as it lies in the region, borrowed until the client's next post.
#[derive(Debug, PartialEq)]
pub enum ShmView<'a> {
    /// One row of n_embd f32 per request pair; `answered` lists the pairs computed (distinct,
    /// in range) when the call was shared, `None` when every row was.
    Rows {
        rows: &'a [f32],
        answered: Option<Vec<u32>>,
    },
    /// A gRPC status code and message.
    Error { code: i32, message: String },
}

/// The request a client waits on.
#[derive(Clone, Copy)]
struct Pending {
    id: u64,
    shared: bool,
    n_pairs: usize,
    n_embd: usize,
}

/// The coordinator's end: creates the region, posts requests, waits for answers.
pub struct ShmClient {
    region: Region,
    path: PathBuf,
    unlinked: bool,
    seq: u32,
    /// The outstanding request, if any.
    pending: Option<Pending>,
}

impl ShmClient {
    /// Creates a region in [`SHM_DIR`] with room for `req_cap` request bytes and `resp_cap`
    /// response bytes (the file is private to this user and unlinked by [`ShmClient::unlink`]
    /// or on drop).
    pub fn create(req_cap: usize, resp_cap: usize) -> Result<ShmClient, ShmError> {
        Self::create_in(Path::new(SHM_DIR), req_cap, resp_cap)
    }

    /// As [`ShmClient::create`], in another directory (tests of the node's path checks).
    pub fn create_in(dir: &Path, req_cap: usize, resp_cap: usize) -> Result<ShmClient, ShmError> {
        let req_cap = req_cap.max(64).next_multiple_of(4096);
        let size = HEADER_BYTES
            .checked_add(req_cap)
            .and_then(|s| s.checked_add(resp_cap.max(64).next_multiple_of(4096)))
            .filter(|&s| s <= MAX_REGION)
            .ok_or(ShmError::TooLarge)?;
        let (file, path) = create_file(dir, "", size)?;
        let io = |what: &str| {
            let what = format!("{what} {}", path.display());
            move |source| ShmError::Io { what, source }
        };
        let cleanup = |e: ShmError| {
            let _ = std::fs::remove_file(&path);
            e
        };
        let map = MmapRaw::map_raw(&file)
            .map_err(io("mapping"))
            .map_err(cleanup)?;
        let client = ShmClient {
            region: Region { map, size, req_cap },
            path: path.clone(),
            unlinked: false,
            seq: 0,
            pending: None,
        };
        let r = &client.region;
        r.wide(OFF_SIZE).store(size as u64, Ordering::Relaxed);
        r.wide(OFF_REQ_CAP).store(req_cap as u64, Ordering::Relaxed);
        r.set(OFF_CLIENT_PID, std::process::id());
        r.wide(OFF_MAGIC).store(MAGIC, Ordering::Release);
        Ok(client)
    }

    /// The region's path, for the node's `AttachShm`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the file (both ends keep their mappings): call once the node has attached.
    pub fn unlink(&mut self) {
        if !self.unlinked {
            let _ = std::fs::remove_file(&self.path);
            self.unlinked = true;
        }
    }

    /// Whether a request with these sizes and its answer fit the region.
    pub fn fits(&self, n_pairs: usize, acts_len: usize, n_embd: usize) -> bool {
        let req = n_pairs.checked_mul(8).and_then(|p| p.checked_add(acts_len));
        // the row slots, then room for the answered list of a shared call
        let resp = n_pairs
            .checked_mul(n_embd)
            .and_then(|x| x.checked_add(n_pairs))
            .and_then(|x| x.checked_mul(4));
        matches!((req, resp), (Some(q), Some(r)) if q <= self.region.req_cap && r <= self.region.resp_cap())
    }

    /// Writes `req` into the region and wakes the node. One request at a time: a second post
    /// before the answer to the first is an error.
    pub fn post(&mut self, req: &ComputeRequest) -> Result<(), ShmError> {
        self.post_tagged(req, 0, 0)
    }

    /// As [`ShmClient::post`], as a shared call under `tag` of the node's claim board
    /// ([`board`]; 0: an ordinary call), the request's first `owned` expert groups the node's
    /// alone: the answer is a [`ShmReply::Partial`].
    pub fn post_tagged(
        &mut self,
        req: &ComputeRequest,
        tag: u32,
        owned: u32,
    ) -> Result<(), ShmError> {
        let r = &self.region;
        if r.closed() != 0 {
            return Err(ShmError::Closed);
        }
        if self.pending.is_some() {
            return Err(ShmError::Malformed(
                "a request is already outstanding".into(),
            ));
        }
        if req.experts.len() != req.rows.len() {
            return Err(ShmError::Malformed(format!(
                "{} experts for {} rows",
                req.experts.len(),
                req.rows.len()
            )));
        }
        if !self.fits(req.experts.len(), req.acts.len(), req.n_embd as usize) {
            return Err(ShmError::TooLarge);
        }
        let n = req.experts.len();
        r.write(HEADER_BYTES, &u32s(&req.experts));
        r.write(HEADER_BYTES + 4 * n, &u32s(&req.rows));
        r.write(HEADER_BYTES + 8 * n, &req.acts);
        let hint = req.prefetch.as_ref().map_or(&[][..], |h| {
            &h.experts[..h.experts.len().min(MAX_HINT_EXPERTS)]
        });
        r.write(OFF_HINT_EXPERTS, &u32s(hint));
        r.set(OFF_HINT, req.prefetch.as_ref().map_or(0, |h| h.layer));
        r.set(OFF_HINT + 4, hint.len() as u32);
        r.wide(OFF_REQ).store(req.request_id, Ordering::Relaxed);
        for (i, v) in [
            req.layer,
            req.act_type,
            req.n_rows,
            req.n_embd,
            n as u32,
            req.acts.len() as u32,
            tag,
            owned,
        ]
        .into_iter()
        .enumerate()
        {
            r.set(OFF_REQ + 8 + 4 * i, v);
        }
        self.seq = self.seq.wrapping_add(1);
        self.pending = Some(Pending {
            id: req.request_id,
            shared: tag != 0,
            n_pairs: n,
            n_embd: req.n_embd as usize,
        });
        r.word(OFF_REQ_SEQ).store(self.seq, Ordering::Release);
        futex_wake(r.word(OFF_REQ_SEQ));
        Ok(())
    }

    /// Waits for the answer to the posted request until `deadline`, re-checking `alive` (the
    /// node's other link) every few milliseconds so a dead node fails the call quickly. The
    /// answer is read in place ([`ShmView`]).
    pub fn wait_view(
        &mut self,
        deadline: Instant,
        alive: &mut dyn FnMut() -> bool,
    ) -> Result<ShmView<'_>, ShmError> {
        let Some(p) = self.pending else {
            return Err(ShmError::Malformed("no request is outstanding".into()));
        };
        let r = &self.region;
        let started = Instant::now();
        loop {
            let seen = r.word(OFF_RESP_SEQ).load(Ordering::Acquire);
            if seen == self.seq {
                self.pending = None;
                return self.view(p);
            }
            if r.closed() & CLOSED_NODE != 0 {
                return Err(ShmError::Closed);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ShmError::Deadline((now - started).as_millis()));
            }
            if !alive() {
                return Err(ShmError::PeerGone);
            }
            futex_wait(r.word(OFF_RESP_SEQ), seen, SLICE.min(deadline - now));
        }
    }

    /// As [`ShmClient::wait_view`], copied out: the rows computed as little-endian bytes (all
    /// of them, or those of a shared call's answered pairs in its list's order).
    pub fn wait(
        &mut self,
        deadline: Instant,
        alive: &mut dyn FnMut() -> bool,
    ) -> Result<ShmReply, ShmError> {
        let n_pairs = self.pending.map_or(0, |p| p.n_pairs);
        Ok(match self.wait_view(deadline, alive)? {
            ShmView::Error { code, message } => ShmReply::Error { code, message },
            ShmView::Rows {
                rows,
                answered: None,
            } => ShmReply::Outputs(crate::f32s_to_le_bytes(rows)),
            ShmView::Rows {
                rows,
                answered: Some(pairs),
            } => {
                let e = rows.len() / n_pairs.max(1);
                let mut out = Vec::with_capacity(pairs.len() * e);
                for &j in &pairs {
                    out.extend_from_slice(&rows[j as usize * e..(j as usize + 1) * e]);
                }
                ShmReply::Partial {
                    pairs,
                    outputs: crate::f32s_to_le_bytes(&out),
                }
            }
        })
    }

    fn view(&self, p: Pending) -> Result<ShmView<'_>, ShmError> {
        let r = &self.region;
        let got = r.wide(OFF_RESP).load(Ordering::Relaxed);
        if got != p.id {
            return Err(ShmError::Malformed(format!(
                "answer to request {got}, expected {}",
                p.id
            )));
        }
        let status = r.get(OFF_RESP + 8) as i32;
        let len = r.get(OFF_RESP + 12) as usize;
        if len > r.resp_cap() {
            return Err(ShmError::Malformed(format!(
                "length {len} exceeds the response area ({})",
                r.resp_cap()
            )));
        }
        let base = HEADER_BYTES + r.req_cap;
        if status != 0 {
            return Ok(ShmView::Error {
                code: status,
                message: String::from_utf8_lossy(&r.read(base, len)).into_owned(),
            });
        }
        // post() checked that the slots and a full answered list fit the response area.
        let n_rows = p.n_pairs * p.n_embd;
        let answered = match r.get(OFF_RESP + 16) {
            ALL_PAIRS if len == 4 * n_rows => None,
            k if k != ALL_PAIRS
                && p.shared
                && (k as usize) <= p.n_pairs
                && len == 4 * n_rows + 4 * k as usize =>
            {
                let list = from_u32s(&r.read(base + 4 * n_rows, 4 * k as usize));
                let mut seen = vec![false; p.n_pairs];
                for &j in &list {
                    match seen.get_mut(j as usize) {
                        Some(s) if !*s => *s = true,
                        _ => {
                            return Err(ShmError::Malformed(format!(
                                "the answer lists pair {j} twice or of {} pairs",
                                p.n_pairs
                            )))
                        }
                    }
                }
                Some(list)
            }
            k => {
                return Err(ShmError::Malformed(format!(
                    "{} answered in {len} bytes, for a{} call of {} pairs of {} values",
                    if k == ALL_PAIRS {
                        "all pairs".to_string()
                    } else {
                        format!("{k} pairs")
                    },
                    if p.shared { " shared" } else { "n ordinary" },
                    p.n_pairs,
                    p.n_embd
                )))
            }
        };
        // SAFETY: in bounds (checked above), f32-aligned (the response area starts at a
        // multiple of 4096 from the page-aligned map), and the node no longer writes it: it
        // published its answer and takes no request before our next post, which needs `&mut
        // self` and so ends this borrow.
        let rows = unsafe { std::slice::from_raw_parts(r.base().add(base) as *const f32, n_rows) };
        Ok(ShmView::Rows { rows, answered })
    }
}

impl Drop for ShmClient {
    fn drop(&mut self) {
        self.region.close(CLOSED_CLIENT);
        self.unlink();
    }
}

/// What the node found in the request area.
#[derive(Debug)]
pub enum Incoming {
    /// The request as the stream would carry it (`step_id` is not carried: 0).
    Request(ComputeRequest),
    /// Lengths that do not fit the region: answer `request_id` with an error.
    Malformed { request_id: u64, reason: String },
}

/// The node's end: maps a region the coordinator created, takes requests, writes answers.
pub struct ShmServer {
    region: Region,
    client_pid: u32,
    seen: u32,
    /// Counter of the request being answered.
    current: Option<u32>,
    /// Its claim tag.
    tag: u32,
    /// Its expert groups this node computes without claiming (the first ones).
    owned: u32,
    /// Its pairs and row width (the shape of the row slots).
    shape: (usize, usize),
}

impl ShmServer {
    /// Maps the region at `path` after checking it is a regular file named
    /// `SHM_PREFIX*` directly in `dir` (not a link), that its header matches its size, and that
    /// the process that created it is alive.
    pub fn open_in(dir: &Path, path: &Path) -> Result<ShmServer, ShmError> {
        let refuse = |reason: String| ShmError::Refused {
            path: path.display().to_string(),
            reason,
        };
        let (map, size) = open_checked(dir, path, HEADER_BYTES + 2 * 64..=MAX_REGION)?;
        let mut region = Region {
            map,
            size,
            req_cap: 0,
        };
        if region.wide(OFF_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(refuse("bad magic".into()));
        }
        let (stated, req_cap) = (
            region.wide(OFF_SIZE).load(Ordering::Relaxed),
            region.wide(OFF_REQ_CAP).load(Ordering::Relaxed),
        );
        if stated != size as u64
            || req_cap == 0
            || !req_cap.is_multiple_of(4096)
            || req_cap >= (size - HEADER_BYTES) as u64
        {
            return Err(refuse(format!(
                "header says size {stated} and request capacity {req_cap}, the file has {size} bytes"
            )));
        }
        region.req_cap = req_cap as usize;
        let client_pid = region.get(OFF_CLIENT_PID);
        if region.closed() != 0 {
            return Err(refuse("already closed".into()));
        }
        let server = ShmServer {
            seen: region.word(OFF_REQ_SEQ).load(Ordering::Acquire),
            region,
            client_pid,
            current: None,
            tag: 0,
            owned: 0,
            shape: (0, 0),
        };
        if !server.client_alive() {
            return Err(refuse(format!(
                "its creator (process {client_pid}) is not running here"
            )));
        }
        Ok(server)
    }

    /// As [`ShmServer::open_in`] for [`SHM_DIR`].
    pub fn open(path: &Path) -> Result<ShmServer, ShmError> {
        Self::open_in(Path::new(SHM_DIR), path)
    }

    /// Whether the coordinator that created the region still runs.
    pub fn client_alive(&self) -> bool {
        process_alive(self.client_pid)
    }

    /// The claim tag of the request being answered (0: an ordinary call, answered in full).
    pub fn claim_tag(&self) -> u32 {
        self.tag
    }

    /// How many of the shared request's first expert groups are this node's alone.
    pub fn owned_groups(&self) -> u32 {
        self.owned
    }

    /// Waits up to `timeout` for a request. `Ok(None)`: nothing came; `Err(Closed)`: the
    /// coordinator left (or died). A request must be answered before the next is taken.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Incoming>, ShmError> {
        let r = &self.region;
        let deadline = Instant::now() + timeout;
        loop {
            let seq = r.word(OFF_REQ_SEQ).load(Ordering::Acquire);
            if r.closed() & CLOSED_CLIENT != 0 {
                return Err(ShmError::Closed);
            }
            if seq != self.seen {
                self.seen = seq;
                self.current = Some(seq);
                self.tag = r.get(OFF_REQ + 8 + 4 * 6);
                self.owned = r.get(OFF_REQ + 8 + 4 * 7);
                return Ok(Some(self.take()));
            }
            let now = Instant::now();
            if now >= deadline {
                return if self.client_alive() {
                    Ok(None)
                } else {
                    Err(ShmError::Closed)
                };
            }
            futex_wait(r.word(OFF_REQ_SEQ), seq, deadline - now);
        }
    }

    fn take(&mut self) -> Incoming {
        let r = &self.region;
        let request_id = r.wide(OFF_REQ).load(Ordering::Relaxed);
        let f: Vec<u32> = (0..6).map(|i| r.get(OFF_REQ + 8 + 4 * i)).collect();
        let (n, acts_len) = (f[4] as usize, f[5] as usize);
        self.shape = (n, f[3] as usize);
        let need = n.checked_mul(8).and_then(|p| p.checked_add(acts_len));
        match need {
            Some(need) if need <= r.req_cap => {}
            _ => {
                return Incoming::Malformed {
                    request_id,
                    reason: format!(
                    "{n} pairs and {acts_len} activation bytes exceed the request area ({} bytes)",
                    r.req_cap
                ),
                }
            }
        }
        // a hint whose count does not fit the header is no hint (never an error: it is one)
        let hint_len = r.get(OFF_HINT + 4) as usize;
        let prefetch = (hint_len > 0 && hint_len <= MAX_HINT_EXPERTS).then(|| PrefetchHint {
            layer: r.get(OFF_HINT),
            experts: from_u32s(&r.read(OFF_HINT_EXPERTS, 4 * hint_len)),
        });
        Incoming::Request(ComputeRequest {
            request_id,
            step_id: 0,
            layer: f[0],
            act_type: f[1],
            n_rows: f[2],
            n_embd: f[3],
            experts: from_u32s(&r.read(HEADER_BYTES, 4 * n)),
            rows: from_u32s(&r.read(HEADER_BYTES + 4 * n, 4 * n)),
            acts: r.read(HEADER_BYTES + 8 * n, acts_len),
            prefetch,
            parts: false,
        })
    }

    /// The row slots of the request taken last: one row of n_embd f32 per pair, to compute
    /// into before [`ShmServer::reply_rows`]. `None` when they (and a full answered list) do
    /// not fit the response area, or no request is being answered.
    pub fn rows_mut(&mut self) -> Option<&mut [f32]> {
        self.current?;
        if !self.slots_fit() {
            return None;
        }
        let (n, e) = self.shape;
        let r = &self.region;
        // SAFETY: in bounds (checked), f32-aligned (the response area starts at a multiple of
        // 4096 from the page-aligned map: `open_in` checked the request capacity), and the
        // coordinator does not touch the response area while a request is outstanding; the
        // borrow of `self` keeps this end from answering meanwhile.
        Some(unsafe {
            std::slice::from_raw_parts_mut(
                r.base().add(HEADER_BYTES + r.req_cap) as *mut f32,
                n * e,
            )
        })
    }

    /// Answers the request taken last with the rows written through [`ShmServer::rows_mut`]:
    /// all of them (`answered` None) or, for a shared call, the pairs listed.
    pub fn reply_rows(&mut self, request_id: u64, answered: Option<&[u32]>) {
        if self.current.is_none() {
            return;
        }
        if !self.slots_fit() {
            let message = "outputs exceed the shared response area".to_string();
            return self.reply(request_id, &ShmReply::Error { code: 8, message });
        }
        let (n, e) = self.shape;
        let list = answered.map_or(&[][..], |a| &a[..a.len().min(n)]);
        let r = &self.region;
        r.write(HEADER_BYTES + r.req_cap + 4 * n * e, &u32s(list));
        let answered = answered.map_or(ALL_PAIRS, |_| list.len() as u32);
        self.publish(request_id, 0, 4 * (n * e + list.len()));
        self.region.set(OFF_RESP + 16, answered);
        self.wake();
    }

    /// Answers the request taken last. Outputs that do not fit the response area, or do not
    /// match the request's pairs, become an error.
    pub fn reply(&mut self, request_id: u64, reply: &ShmReply) {
        if self.current.is_none() {
            return;
        }
        let e = self.shape.1;
        let error = match reply {
            ShmReply::Outputs(b) => match self.rows_mut() {
                Some(rows) if b.len() == 4 * rows.len() => {
                    crate::le_bytes_to_f32s(b, rows);
                    return self.reply_rows(request_id, None);
                }
                Some(_) => (13, "outputs do not match the request's pairs".to_string()), // INTERNAL
                None => (8, "outputs exceed the shared response area".to_string()), // RESOURCE_EXHAUSTED
            },
            ShmReply::Partial { pairs, outputs } => match self.rows_mut() {
                Some(rows)
                    if outputs.len() == 4 * e * pairs.len()
                        && pairs.iter().all(|&j| (j as usize + 1) * e <= rows.len()) =>
                {
                    for (i, &j) in pairs.iter().enumerate() {
                        let j = j as usize;
                        crate::le_bytes_to_f32s(
                            &outputs[4 * i * e..4 * (i + 1) * e],
                            &mut rows[j * e..(j + 1) * e],
                        );
                    }
                    return self.reply_rows(request_id, Some(pairs));
                }
                Some(_) => (13, "outputs do not match the request's pairs".to_string()),
                None => (8, "outputs exceed the shared response area".to_string()),
            },
            ShmReply::Error { code, message } => (*code, message.clone()),
        };
        let r = &self.region;
        let m = error.1.as_bytes();
        let m = &m[..m.len().min(r.resp_cap())];
        r.write(HEADER_BYTES + r.req_cap, m);
        self.publish(request_id, error.0, m.len());
        self.region.set(OFF_RESP + 16, ALL_PAIRS);
        self.wake();
    }

    /// Whether the current request's row slots and a full answered list fit the response area.
    fn slots_fit(&self) -> bool {
        let (n, e) = self.shape;
        n.checked_mul(e)
            .and_then(|x| x.checked_add(n))
            .and_then(|x| x.checked_mul(4))
            .is_some_and(|b| b <= self.region.resp_cap())
    }

    /// Writes the response header (the caller wrote the payload).
    fn publish(&self, request_id: u64, status: i32, len: usize) {
        let r = &self.region;
        r.wide(OFF_RESP).store(request_id, Ordering::Relaxed);
        r.set(OFF_RESP + 8, status as u32);
        r.set(OFF_RESP + 12, len as u32);
    }

    /// Publishes the answer (after its header) and wakes the coordinator.
    fn wake(&mut self) {
        let Some(seq) = self.current.take() else {
            return;
        };
        let r = &self.region;
        r.word(OFF_RESP_SEQ).store(seq, Ordering::Release);
        futex_wake(r.word(OFF_RESP_SEQ));
    }
}

impl Drop for ShmServer {
    fn drop(&mut self) {
        self.region.close(CLOSED_NODE);
    }
}

#[cfg(test)]
mod tests;
