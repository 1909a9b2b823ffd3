//! The delay relay of the multi-host harness: a TCP forwarder adding a fixed one-way delay to
//! each direction of every connection it forwards. The kernel here has no `netem` qdisc, so this
//! is how the harness injects latency. One thread per direction of a connection: it reads what
//! has arrived, stamps each chunk with its arrival (the kernel's receive timestamp,
//! `SO_TIMESTAMPNS`, so the thread's own wake-up is inside the delay, not added to it) plus the
//! delay, and writes every chunk that is due, waiting in `ppoll(2)` (1 ns timer slack) for the
//! source, for the destination to take more, or for the next chunk's due time, whichever comes
//! first. A chunk thus leaves at its arrival + delay (plus one timer wake-up), never behind the
//! timer slot of the chunk before it: chunks that arrived back to back leave together in one
//! `writev`, in order, and bandwidth is not cut to one chunk per `delay`. With `delay` zero a
//! chunk is written by the thread that read it, with no hand-over between threads.
//! `relay-report` (benches) measures what the relay adds beyond its delay.

use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A running relay: accepts on `addr`, forwards each connection to its target.
pub struct Relay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Every socket of every connection, shut down when the relay stops.
    conns: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Relay {
    /// Listens on `listen` (port 0: any) in the calling thread's network namespace and forwards
    /// every accepted connection to `target` with `delay` added each way.
    pub fn start(
        listen: SocketAddr,
        target: SocketAddr,
        delay: Duration,
    ) -> std::io::Result<Relay> {
        let listener = TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (s, c) = (stop.clone(), conns.clone());
        let acceptor = std::thread::Builder::new()
            .name("delay-relay".into())
            .spawn(move || accept_loop(listener, target, delay, s, c))?;
        Ok(Relay {
            addr,
            stop,
            conns,
            acceptor: Some(acceptor),
        })
    }

    /// Where the relay listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every forwarded connection (both ends), as a link that resets would.
    pub fn reset_connections(&self) {
        for c in lock(&self.conns).drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
        self.reset_connections();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    delay: Duration,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                if let Err(e) = forward(client, target, delay, &conns) {
                    tracing::debug!("delay relay to {target}: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::debug!("delay relay accept: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Connects to `target` and starts the two directions of `client`'s connection.
fn forward(
    client: TcpStream,
    target: SocketAddr,
    delay: Duration,
    conns: &Mutex<Vec<TcpStream>>,
) -> std::io::Result<()> {
    let server = TcpStream::connect_timeout(&target, Duration::from_secs(2))?;
    for s in [&client, &server] {
        s.set_nodelay(true)?;
        // Shared by every clone of the socket: both directions' pumps wait in ppoll.
        s.set_nonblocking(true)?;
        receive_timestamps(s)?;
    }
    {
        let mut c = lock(conns);
        c.push(client.try_clone()?);
        c.push(server.try_clone()?);
    }
    direction(client.try_clone()?, server.try_clone()?, delay)?;
    direction(server, client, delay)
}

/// Asks the kernel to stamp what `s` receives (`SO_TIMESTAMPNS`), read back by [`read_stamped`].
fn receive_timestamps(s: &TcpStream) -> std::io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt(2) on a socket we own, reading a c_int that lives across the call.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Starts one direction's pump; it shuts `to` down for writing when `from` ends.
fn direction(from: TcpStream, to: TcpStream, delay: Duration) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("relay-pump".into())
        .spawn(move || {
            // SAFETY: prctl(2) with PR_SET_TIMERSLACK only sets this thread's timer slack (1 ns,
            // instead of the default 50 us that would add to every hold); no memory is passed.
            unsafe {
                libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
            }
            pump(&from, &to, delay);
            let _ = to.shutdown(Shutdown::Write);
        })?;
    Ok(())
}

/// Bytes one direction holds before it stops reading (TCP then pushes back on the sender).
const MAX_HELD: usize = 16 << 20;

/// Chunks one `writev` takes at most.
const MAX_IOV: usize = 64;

/// A chunk read and not yet written on, with the time it is due.
struct Held {
    due: Instant,
    bytes: Vec<u8>,
}

/// Forwards `from` to `to`, each chunk at its arrival + `delay`, until `from` ends (and all it
/// sent is written) or either socket fails. Both sockets are non-blocking.
fn pump(from: &TcpStream, mut to: &TcpStream, delay: Duration) {
    let mut queue: VecDeque<Held> = VecDeque::new();
    // bytes of the queue's front already written
    let mut head = 0usize;
    let mut held = 0usize;
    let mut eof = false;
    let mut buf = vec![0u8; 256 << 10];
    loop {
        while !eof && held < MAX_HELD {
            match read_stamped(from, &mut buf) {
                Ok((0, _)) => eof = true,
                Ok((n, arrived)) => {
                    held += n;
                    queue.push_back(Held {
                        due: arrived + delay,
                        bytes: buf[..n].to_vec(),
                    });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => eof = true,
            }
        }
        let mut blocked = false;
        loop {
            let now = Instant::now();
            let due: Vec<IoSlice<'_>> = queue
                .iter()
                .take_while(|h| h.due <= now)
                .take(MAX_IOV)
                .enumerate()
                .map(|(i, h)| IoSlice::new(if i == 0 { &h.bytes[head..] } else { &h.bytes }))
                .collect();
            if due.is_empty() {
                break;
            }
            match to.write_vectored(&due) {
                Ok(0) => return,
                Ok(mut n) => {
                    held -= n;
                    while let Some(front) = queue.front() {
                        let left = front.bytes.len() - head;
                        if n < left {
                            head += n;
                            break;
                        }
                        n -= left;
                        head = 0;
                        queue.pop_front();
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    blocked = true;
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
        if eof && queue.is_empty() {
            return;
        }
        // Wait for more input (while reading), for room to write (when full), or for the front
        // chunk's due time (when not full); a socket not waited on is left out (-1), so a
        // closed one does not wake the loop over and over.
        let reading = !eof && held < MAX_HELD;
        let mut fds = [
            libc::pollfd {
                fd: if reading { from.as_raw_fd() } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if blocked { to.as_raw_fd() } else { -1 },
                events: libc::POLLOUT,
                revents: 0,
            },
        ];
        let wait = match queue.front() {
            Some(h) if !blocked => Some(h.due.saturating_duration_since(Instant::now())),
            _ => None,
        };
        let ts = wait.map(|d| libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        });
        let ts_ptr = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: ppoll(2) on two pollfds that live across the call (negative fds are ignored),
        // an optional timespec that outlives it, and no signal mask.
        let rc = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, ts_ptr, std::ptr::null()) };
        if rc < 0 && std::io::Error::last_os_error().kind() != ErrorKind::Interrupted {
            return;
        }
    }
}

/// Reads what `s` has into `buf`: the bytes read and when they arrived (the kernel's receive
/// timestamp of the newest of them; the time of the read when there is none).
fn read_stamped(s: &TcpStream, buf: &mut [u8]) -> std::io::Result<(usize, Instant)> {
    // room for one cmsg carrying a timespec, 8-byte aligned
    let mut control = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is a valid empty one; the fields set below point at `iov` and
    // `control`, which outlive the recvmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: recvmsg(2) writes at most `iov_len` bytes into `buf` and at most `msg_controllen`
    // into `control`, both borrowed mutably for the call.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, 0) };
    let read_at = Instant::now();
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut arrived = read_at;
    // SAFETY: the CMSG_* walk stays inside `msg_controllen` bytes of `control`, which recvmsg
    // filled; a SCM_TIMESTAMPNS message's data is one (possibly unaligned) timespec.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>());
                arrived = read_at.checked_sub(age(ts)).unwrap_or(read_at);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, arrived))
}

/// How long ago the `CLOCK_REALTIME` time `ts` was (zero if in the future; at most 1 s, so a
/// clock step cannot hold a chunk for long).
fn age(ts: libc::timespec) -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one timespec into `now`, which we own.
    unsafe {
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut now);
    }
    let ns = |t: &libc::timespec| t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128;
    let d = (ns(&now) - ns(&ts)).clamp(0, 1_000_000_000);
    Duration::from_nanos(d as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Bytes go through unchanged and in order both ways, and each way takes at least the delay.
    #[test]
    fn forwards_in_order_and_holds_each_chunk() {
        let echo = TcpListener::bind("127.0.0.1:0").expect("bind");
        let target = echo.local_addr().expect("addr");
        std::thread::spawn(move || {
            let (mut s, _) = echo.accept().expect("accept");
            let mut buf = [0u8; 4096];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => s.write_all(&buf[..n]).expect("echo"),
                }
            }
        });
        let delay = Duration::from_millis(30);
        let relay =
            Relay::start("127.0.0.1:0".parse().expect("addr"), target, delay).expect("relay");
        let mut c = TcpStream::connect(relay.addr()).expect("connect");
        let msg: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let started = Instant::now();
        let mut w = c.try_clone().expect("clone");
        let sent = msg.clone();
        let writer = std::thread::spawn(move || w.write_all(&sent).expect("write"));
        let mut got = vec![0u8; msg.len()];
        c.read_exact(&mut got).expect("read back");
        writer.join().expect("writer");
        assert!(got == msg, "bytes changed or reordered through the relay");
        assert!(
            started.elapsed() >= 2 * delay,
            "a round trip took {:?}, less than twice the {delay:?} hold",
            started.elapsed()
        );
        drop(relay);
        // The relay closed its side: the client sees the end of the stream.
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
    }

    /// More than a direction holds (`MAX_HELD`) sent to a reader that starts late: the relay
    /// stops reading, waits for room to write, and delivers every byte in order; then the
    /// sender's end reaches the reader.
    #[test]
    fn pushes_back_when_the_reader_is_slow() {
        let sink = TcpListener::bind("127.0.0.1:0").expect("bind");
        let target = sink.local_addr().expect("addr");
        let relay = Relay::start(
            "127.0.0.1:0".parse().expect("addr"),
            target,
            Duration::from_micros(50),
        )
        .expect("relay");
        let len = MAX_HELD * 2 + 12_345;
        let msg: Vec<u8> = (0..len as u32).map(|i| (i % 253) as u8).collect();
        let sent = msg.clone();
        let addr = relay.addr();
        let writer = std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).expect("connect");
            // small writes: many chunks at the relay
            for part in sent.chunks(100_003) {
                c.write_all(part).expect("write");
            }
        });
        let (mut s, _) = sink.accept().expect("accept");
        std::thread::sleep(Duration::from_millis(300));
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("read to the end");
        writer.join().expect("writer");
        assert_eq!(
            got.len(),
            msg.len(),
            "bytes lost or added through the relay"
        );
        assert!(got == msg, "bytes changed or reordered through the relay");
    }

    /// A chunk's arrival is the kernel's receive timestamp, not the time the relay read it: a
    /// reader that wakes late still releases the chunk at arrival + delay. The kernel turns
    /// receive stamps on for the whole machine lazily (a deferred static key, when the first
    /// socket asks): a packet that arrives before that carries none and counts from its read,
    /// so the test sends until one is stamped, and fails if none of 40 is.
    #[test]
    fn a_chunk_arrives_when_the_kernel_received_it() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut c = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (s, _) = listener.accept().expect("accept");
        receive_timestamps(&s).expect("SO_TIMESTAMPNS");
        // each ping leaves at once (Nagle would hold it for the previous one's ACK)
        c.set_nodelay(true).expect("nodelay");
        let late = Duration::from_millis(50);
        let mut ages = Vec::new();
        for _ in 0..40 {
            c.write_all(b"ping").expect("write");
            std::thread::sleep(late);
            let mut buf = [0u8; 16];
            let (n, arrived) = read_stamped(&s, &mut buf).expect("read");
            assert_eq!(&buf[..n], b"ping");
            let age = arrived.elapsed();
            if age >= late - Duration::from_millis(5) {
                return;
            }
            ages.push(age);
        }
        panic!("no chunk was stamped at its arrival {late:?} before the read: ages {ages:?}");
    }
}
