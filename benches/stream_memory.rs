//! Memory per open stream, counted by the allocator: the proxy runs in this process under a
//! counting global allocator; the simulator (1 event/s, so streams are open, not busy) and the
//! client that holds the streams run as child processes, so their memory is not counted.
//!
//! `cargo build --release --bin tokenmeter && cargo bench --bench stream_memory -- [--steps 1000,4000,10000]`
//!
//! Per step N: live heap bytes and live allocations with N streams held open, minus the same
//! after a warm-up with none open, divided by N; live bytes by allocation size class show which
//! allocations make up a stream; `VmRSS` of this process beside it. The soft open-files limit is
//! raised to the hard one (reported); steps above what it allows are capped.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

/// Size classes: allocation sizes up to 2^k bytes in class k (k = 0..=24), larger in the last.
const CLASSES: usize = 26;

struct Counting;

static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static LIVE_ALLOCS: AtomicI64 = AtomicI64::new(0);
static BY_CLASS: [AtomicI64; CLASSES] = [const { AtomicI64::new(0) }; CLASSES];
static COUNT_BY_CLASS: [AtomicI64; CLASSES] = [const { AtomicI64::new(0) }; CLASSES];

fn class(size: usize) -> usize {
    let k = usize::BITS - size.saturating_sub(1).leading_zeros();
    (k as usize).min(CLASSES - 1)
}

fn count(size: usize, sign: i64) {
    let s = size as i64 * sign;
    LIVE_BYTES.fetch_add(s, Ordering::Relaxed);
    LIVE_ALLOCS.fetch_add(sign, Ordering::Relaxed);
    BY_CLASS[class(size)].fetch_add(s, Ordering::Relaxed);
    COUNT_BY_CLASS[class(size)].fetch_add(sign, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counters only observe.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(l.size(), 1);
        // SAFETY: the caller's layout contract is passed through.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count(l.size(), 1);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        count(l.size(), -1);
        // SAFETY: `p` came from this allocator with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count(l.size(), -1);
        count(new, 1);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

struct Snapshot {
    bytes: i64,
    allocs: i64,
    by_class: [i64; CLASSES],
    count_by_class: [i64; CLASSES],
    rss_kib: u64,
}

fn snapshot() -> Snapshot {
    let rss_kib = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    Snapshot {
        bytes: LIVE_BYTES.load(Ordering::Relaxed),
        allocs: LIVE_ALLOCS.load(Ordering::Relaxed),
        by_class: std::array::from_fn(|k| BY_CLASS[k].load(Ordering::Relaxed)),
        count_by_class: std::array::from_fn(|k| COUNT_BY_CLASS[k].load(Ordering::Relaxed)),
        rss_kib,
    }
}

/// The client child: holds `n` streamed chat requests open at `addr` (each read to its first
/// event, then read on), prints `held N` once all are, and exits when its stdin closes.
fn client_main(addr: &str, n: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    support::raise_nofile();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let opened = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let body = r#"{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":600,"stream":true}"#;
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
authorization: Bearer sk-stream-memory-0123456789\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        for _ in 0..n {
            let (addr, req, opened) = (addr.to_string(), req.clone(), opened.clone());
            tokio::spawn(async move {
                let mut s = loop {
                    match tokio::net::TcpStream::connect(&addr).await {
                        Ok(s) => break s,
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                };
                s.write_all(req.as_bytes()).await.unwrap();
                let mut buf = vec![0u8; 4096];
                let mut seen = Vec::new();
                let mut counted = false;
                loop {
                    let Ok(k) = s.read(&mut buf).await else { return };
                    if k == 0 {
                        return;
                    }
                    if !counted {
                        seen.extend_from_slice(&buf[..k]);
                        if memchr::memmem::find(&seen, b"data: {").is_some() {
                            counted = true;
                            seen = Vec::new();
                            opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                }
            });
        }
        let t = Instant::now();
        while opened.load(std::sync::atomic::Ordering::SeqCst) < n && t.elapsed() < Duration::from_secs(90) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!("held {}", opened.load(std::sync::atomic::Ordering::SeqCst));
        // Stdin closing ends the run.
        tokio::task::spawn_blocking(|| {
            let mut s = String::new();
            let _ = std::io::stdin().read_line(&mut s);
        })
        .await
        .unwrap();
    });
}

fn kib(b: i64) -> f64 {
    b as f64 / 1024.0
}

fn main() {
    let mut args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("--client") {
        client_main(&args[1], args[2].parse().unwrap());
        return;
    }
    let mut steps = vec![1000usize, 4000, 10000];
    if let Some(i) = args.iter().position(|a| a == "--steps") {
        steps = args[i + 1].split(',').map(|s| s.parse().unwrap()).collect();
        args.drain(i..=i + 1);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bin = target.join("release/tokenmeter");
    assert!(
        bin.exists(),
        "{} missing: cargo build --release first",
        bin.display()
    );
    let hard = support::raise_nofile();
    // The proxy holds two descriptors per stream.
    let cap = (hard.saturating_sub(100) / 2) as usize;
    for s in &mut steps {
        if *s > cap {
            println!("open-files hard limit {hard}: step {s} capped to {cap}");
            *s = cap;
        }
    }
    println!(
        "load average {}, open-files hard limit {hard}",
        support::loadavg()
    );

    let sim_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut sim = Command::new(&bin)
        .args([
            "sim",
            "--listen",
            &sim_addr.to_string(),
            "--fixed-pace",
            "--fixed-ttft-ms",
            "0",
        ])
        .args(["--fixed-gap-ms", "1000", "--max-num-seqs", "100000"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let dir = std::env::temp_dir().join(format!("tm-stream-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let config = tokenmeter::config::ServeConfig {
        listen: "127.0.0.1:0".into(),
        upstream: format!("http://{sim_addr}"),
        access_log: Some(dir.join("access.jsonl")),
        ..Default::default()
    };
    let proxy = rt.block_on(async {
        // Wait for the simulator.
        for _ in 0..300 {
            if tokio::net::TcpStream::connect(sim_addr).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokenmeter::app::spawn(config, Vec::new()).await.unwrap()
    });
    let addr = proxy.addr().to_string();
    let me = std::env::current_exe().unwrap();
    let hold = |n: usize| {
        let mut c = Command::new(&me)
            .args(["--client", &addr, &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(c.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let held: usize = line.trim().strip_prefix("held ").unwrap().parse().unwrap();
        (c, held)
    };
    // Warm-up: a few streams opened and closed, so pools, buffers and the meter are set up.
    let (mut c, _) = hold(16);
    drop(c.stdin.take());
    c.wait().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let idle = snapshot();
    println!(
        "idle: live heap {:.0} KiB in {} allocations, RSS {} KiB\n",
        kib(idle.bytes),
        idle.allocs,
        idle.rss_kib
    );
    println!(
        "| streams | held | live heap KiB/stream | allocations/stream | RSS KiB/stream | load |"
    );
    println!("|---|---|---|---|---|---|");
    let mut classes = Vec::new();
    for &n in &steps {
        let (mut c, held) = hold(n);
        std::thread::sleep(Duration::from_millis(500));
        let s = snapshot();
        let per = |x: i64, y: i64| (x - y) as f64 / n as f64;
        println!(
            "| {n} | {held} | {:.2} | {:.1} | {:.2} | {} |",
            kib(s.bytes - idle.bytes) / n as f64,
            per(s.allocs, idle.allocs),
            (s.rss_kib as f64 - idle.rss_kib as f64) / n as f64,
            support::loadavg()
        );
        classes.push((n, s));
        drop(c.stdin.take());
        c.wait().unwrap();
        std::thread::sleep(Duration::from_secs(2));
    }
    if let Some((n, s)) = classes.last() {
        println!("\nlive heap per stream by allocation size at {n} streams (classes with ≥ 0.05 allocations/stream):\n");
        println!("| size up to | allocations/stream | bytes/stream |\n|---|---|---|");
        for k in 0..CLASSES {
            let cnt = (s.count_by_class[k] - idle.count_by_class[k]) as f64 / *n as f64;
            let b = (s.by_class[k] - idle.by_class[k]) as f64 / *n as f64;
            if cnt.abs() >= 0.05 {
                println!("| {} B | {cnt:.2} | {b:.0} |", 1u64 << k);
            }
        }
    }
    rt.block_on(proxy.shutdown());
    let _ = sim.kill();
    let _ = sim.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
