//! The delay relay of the multi-host harness: a TCP forwarder that holds every chunk it reads for
//! a fixed time before writing it on, in each direction, so a link gets `delay` of added one-way
//! latency. The kernel here has no `netem` qdisc, so this is how the harness injects latency.
//! Each connection has, per direction, a reader thread (stamps each chunk with its release time)
//! and a writer thread (sleeps until then, with a 1 ns timer slack so the sleep ends on time,
//! then writes): chunks keep their order and bandwidth is not cut to one chunk per `delay`.
//! With `delay` zero the chunks take the same path without sleeping, which is what
//! `cluster-report --netns` measures as the relay's own cost.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
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
    client.set_nonblocking(false)?;
    let server = TcpStream::connect_timeout(&target, Duration::from_secs(2))?;
    for s in [&client, &server] {
        s.set_nodelay(true)?;
    }
    {
        let mut c = lock(conns);
        c.push(client.try_clone()?);
        c.push(server.try_clone()?);
    }
    direction(client.try_clone()?, server.try_clone()?, delay)?;
    direction(server, client, delay)
}

/// One direction: a reader that stamps chunks and a writer that releases them on time.
fn direction(mut from: TcpStream, mut to: TcpStream, delay: Duration) -> std::io::Result<()> {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::Builder::new()
        .name("relay-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; 256 << 10];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx
                            .send((Instant::now() + delay, buf[..n].to_vec()))
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
            // Dropping `tx` ends the writer once it has written what is queued.
        })?;
    std::thread::Builder::new()
        .name("relay-write".into())
        .spawn(move || {
            // SAFETY: prctl(2) with PR_SET_TIMERSLACK only sets this thread's timer slack (1 ns,
            // instead of the default 50 us that would add to every hold); no memory is passed.
            unsafe {
                libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
            }
            for (due, chunk) in rx {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
