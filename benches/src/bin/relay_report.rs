//! `relay-report`: what the netns harness's delay relay (`coordinator/src/cluster/netns/relay.rs`)
//! adds to a round trip beyond the delay it is configured with. A ping-pong client and an echo
//! server on loopback (no namespaces, no root), dialled directly and through a relay at each
//! `--delays-us`: the client sends a request of `--request` bytes in one write, the server
//! answers `--reply` bytes in `chunks` writes `--gap-us` apart (a TLS/HTTP/2 answer reaches the
//! relay as several chunks: the old relay held each one for its own timer slot). Per case it
//! prints the round trip's median and p10-p90 and the relay's own cost: median through the relay
//! minus median direct minus twice the added delay. The cases alternate round by round (A B A B),
//! so host drift hits all alike.
//!
//! `cargo run --release -p nightshift-benches --bin relay-report [-- --delays-us 0,50,200
//! --chunks 1,4 --rounds 5 --iters 200]`

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use nightshift_benches::percentile;
use nightshift_coordinator::cluster::netns::Relay;

#[derive(Parser)]
struct Args {
    /// One-way delays the relay is set to, in microseconds.
    #[arg(long, value_delimiter = ',', default_values_t = [0u64, 50, 200])]
    delays_us: Vec<u64>,
    /// Writes the reply is split into (each its own chunk at the relay).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4])]
    chunks: Vec<usize>,
    /// Request bytes (one write).
    #[arg(long, default_value_t = 4096)]
    request: usize,
    /// Reply bytes.
    #[arg(long, default_value_t = 32 << 10)]
    reply: usize,
    /// Time between the reply's writes, in microseconds.
    #[arg(long, default_value_t = 20)]
    gap_us: u64,
    /// Alternating rounds over all cases.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Round trips per case and round (after 20 not timed).
    #[arg(long, default_value_t = 200)]
    iters: usize,
}

/// The echo server: per request (a 12-byte header: request bytes, reply bytes, reply writes,
/// little-endian u32 each, then the request), the reply in that many writes `gap` apart.
fn serve(listener: TcpListener, gap: Duration) {
    for conn in listener.incoming() {
        let Ok(mut s) = conn else { return };
        std::thread::spawn(move || {
            let _ = s.set_nodelay(true);
            let mut head = [0u8; 12];
            let mut body = Vec::new();
            while s.read_exact(&mut head).is_ok() {
                let field = |i: usize| {
                    u32::from_le_bytes(head[4 * i..4 * i + 4].try_into().expect("4 bytes")) as usize
                };
                let (req, reply, writes) = (field(0), field(1), field(2).max(1));
                body.resize(req.max(reply), 0);
                if s.read_exact(&mut body[..req]).is_err() {
                    return;
                }
                let per = reply.div_ceil(writes);
                for (k, part) in body[..reply].chunks(per).enumerate() {
                    if k > 0 {
                        let t = Instant::now();
                        while t.elapsed() < gap {
                            std::hint::spin_loop();
                        }
                    }
                    if s.write_all(part).is_err() {
                        return;
                    }
                }
            }
        });
    }
}

/// `iters` timed round trips (after 20 untimed) on `addr`; the round trips in microseconds.
fn ping(addr: SocketAddr, a: &Args, chunks: usize) -> anyhow::Result<Vec<f64>> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting {addr}"))?;
    s.set_nodelay(true)?;
    let mut msg = Vec::with_capacity(12 + a.request);
    for v in [a.request, a.reply, chunks] {
        msg.extend_from_slice(&(v as u32).to_le_bytes());
    }
    msg.resize(12 + a.request, 7);
    let mut reply = vec![0u8; a.reply];
    let mut out = Vec::with_capacity(a.iters);
    for i in 0..a.iters + 20 {
        let t = Instant::now();
        s.write_all(&msg)?;
        s.read_exact(&mut reply)?;
        if i >= 20 {
            out.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(out)
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    anyhow::ensure!(
        a.rounds > 0 && a.iters > 0 && !a.chunks.contains(&0),
        "expected --rounds, --iters and --chunks of at least 1"
    );
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let target = listener.local_addr()?;
    let gap = Duration::from_micros(a.gap_us);
    std::thread::spawn(move || serve(listener, gap));
    let mut relays = Vec::new();
    for &d in &a.delays_us {
        relays.push(Relay::start(
            "127.0.0.1:0".parse()?,
            target,
            Duration::from_micros(d),
        )?);
    }
    // case: (chunks, None = direct | Some(index into delays))
    let mut cases: Vec<(usize, Option<usize>)> = Vec::new();
    for &c in &a.chunks {
        cases.push((c, None));
        cases.extend((0..a.delays_us.len()).map(|i| (c, Some(i))));
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..a.rounds {
        for (k, &(c, via)) in cases.iter().enumerate() {
            let addr = via.map_or(target, |i| relays[i].addr());
            samples[k].extend(ping(addr, &a, c)?);
        }
    }
    println!(
        "request {} B in one write, reply {} B in N writes {} us apart | {} rounds x {} round trips per case, interleaved",
        a.request, a.reply, a.gap_us, a.rounds, a.iters
    );
    println!(
        "{:>6} | {:>8} | {:>10} | {:>19} | {:>22}",
        "writes", "path", "rtt p50", "rtt p10-p90", "relay's own cost p50"
    );
    let mut direct_p50 = 0.0;
    for (k, &(c, via)) in cases.iter().enumerate() {
        let v = &mut samples[k];
        let (p10, p50, p90) = (percentile(v, 0.1), percentile(v, 0.5), percentile(v, 0.9));
        let (path, own) = match via {
            None => {
                direct_p50 = p50;
                ("direct".to_string(), "-".to_string())
            }
            Some(i) => {
                let d = a.delays_us[i] as f64;
                (
                    format!("+{} us", a.delays_us[i]),
                    format!("{:.1} us", p50 - direct_p50 - 2.0 * d),
                )
            }
        };
        println!(
            "{:>6} | {:>8} | {:>7.1} us | {:>7.1}-{:>7.1} us | {:>22}",
            c, path, p50, p10, p90, own
        );
    }
    Ok(())
}
