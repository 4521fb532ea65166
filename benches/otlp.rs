//! OTLP export overhead per request: off, metrics, metrics and traces.
//!
//! `cargo bench --bench otlp -- [--rounds 20] [--per-round 250]`
//!
//! Two parts:
//! 1. **The exporter alone**: what a finished generation record costs the data path (the
//!    observer's `finished`: an `Arc` clone offered to the bounded queue), and what it costs the
//!    recording thread (recording its GenAI histograms), per record. Off, the observer is not
//!    installed at all, so the data path pays nothing. With traces the recording thread also
//!    builds the span and queues it for the span export thread.
//! 2. **End to end, in process**: three real proxies (`app::spawn`, access log and metering
//!    on) in front of one raw-socket upstream answering a short stream with usage at once: one
//!    without `otlp_endpoint`, one exporting metrics and one metrics and traces (to a local
//!    receiver answering 200, every second). A raw-socket keep-alive client goes round the three
//!    in rounds, each round starting at the next arm; per arm: the median over rounds of the mean
//!    wall time and of the process CPU time per request (client, upstream, proxy and exporter
//!    threads all in this process, so the difference between the arms is what OTLP adds,
//!    background threads included).

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenmeter::observe::Observer;
use tokenmeter::otlp::OtlpExport;
use tokenmeter::record::RequestRecord;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BODY: &[u8] = br#"{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":4,"stream":true}"#;

fn cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Waits until the recording thread has taken `n` records.
fn drained(export: &OtlpExport, n: u64) {
    while export.counters().recorded.load(Ordering::Relaxed) < n {
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Part 1: ns per record on the data path and on the recording thread.
fn exporter_alone(rt: &tokio::runtime::Runtime, traces: bool) -> (f64, f64) {
    let (sink, _) = rt.block_on(receiver());
    let records: Vec<Arc<RequestRecord>> = (0..4096u64)
        .map(|i| {
            let mut r = tokenmeter::analyze::synth::record(
                i * 1_000_000,
                2_000.0,
                Some(80.0),
                200,
                true,
                "u",
            );
            r.model = Some(format!("model-{}", i % 4));
            r.prompt_tokens = Some(100 + i % 50);
            Arc::new(r)
        })
        .collect();
    let export =
        OtlpExport::start(&format!("http://{sink}"), Duration::from_secs(1), traces).unwrap();
    let mut offered = 0u64;
    let mut data_path = Vec::new();
    let mut recording = Vec::new();
    for _ in 0..15 {
        let t = Instant::now();
        for r in &records {
            export.finished(0, 0, r, true);
        }
        let offer = t.elapsed();
        offered += records.len() as u64;
        drained(&export, offered);
        // The recording thread ran while the records were offered and after: from the first
        // offer to the last record taken (the 100 µs poll adds at most 25 ns per record).
        let all = t.elapsed();
        data_path.push(offer.as_nanos() as f64 / records.len() as f64);
        recording.push(all.as_nanos() as f64 / records.len() as f64);
    }
    assert_eq!(export.counters().dropped.load(Ordering::Relaxed), 0);
    export.shutdown();
    (median(&mut data_path), median(&mut recording))
}

/// A local OTLP/HTTP receiver: reads each request and answers 200 with an empty body.
async fn receiver() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut tmp = [0u8; 16 * 1024];
                loop {
                    let Ok(k) = s.read(&mut tmp).await else {
                        return;
                    };
                    if k == 0 {
                        return;
                    }
                    buf.extend_from_slice(&tmp[..k]);
                    if let Some(end) = memchr::memmem::find(&buf, b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    (addr, task)
}

/// A raw-socket upstream: every request gets a two-token stream with usage, then `[DONE]`.
async fn raw_upstream() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let chunk = |e: &str| format!("{:x}\r\n{e}\r\n", e.len());
    let token = |t: &str| {
        format!("data: {{\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"sim-model\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}},\"finish_reason\":null}}]}}\n\n")
    };
    let usage = "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"sim-model\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n";
    let resp: Arc<[u8]> = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{}{}{}{}0\r\n\r\n",
        chunk(&token("hi")),
        chunk(&token(" there")),
        chunk(usage),
        chunk("data: [DONE]\n\n"),
    )
    .into_bytes()
    .into();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let resp = resp.clone();
            tokio::spawn(async move {
                s.set_nodelay(true).unwrap();
                let mut buf = Vec::new();
                let mut tmp = [0u8; 16 * 1024];
                loop {
                    // One request: its head, then content-length bytes.
                    let need = loop {
                        if let Some(end) = memchr::memmem::find(&buf, b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                            let len: usize = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .and_then(|v| v.trim().parse().ok())
                                .unwrap_or(0);
                            if buf.len() >= end + 4 + len {
                                break end + 4 + len;
                            }
                        }
                        match s.read(&mut tmp).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => buf.extend_from_slice(&tmp[..k]),
                        }
                    };
                    buf.drain(..need);
                    if s.write_all(&resp).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Sends one request on `s` and reads its response to the terminating chunk.
fn one(s: &mut TcpStream, head: &[u8], buf: &mut Vec<u8>) {
    buf.clear();
    let mut tmp = [0u8; 8192];
    s.write_all(head).unwrap();
    s.write_all(BODY).unwrap();
    loop {
        let k = s.read(&mut tmp).unwrap();
        assert!(k > 0, "connection closed: {}", String::from_utf8_lossy(buf));
        buf.extend_from_slice(&tmp[..k]);
        if buf.ends_with(b"0\r\n\r\n") {
            assert!(buf.starts_with(b"HTTP/1.1 200"));
            return;
        }
    }
}

/// Per arm (off, metrics, metrics and traces): the median over rounds of the mean wall µs and of
/// the process CPU µs per request.
fn end_to_end(rt: &tokio::runtime::Runtime, rounds: usize, per_round: usize) -> [(f64, f64); 3] {
    let up = rt.block_on(raw_upstream());
    let (sink, _) = rt.block_on(receiver());
    let dir = std::env::temp_dir().join(format!("tm-otlp-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let proxy = |name: &str, otlp: Option<String>, traces: bool| {
        let config = tokenmeter::config::ServeConfig {
            listen: "127.0.0.1:0".into(),
            upstream: format!("http://{up}"),
            access_log: Some(dir.join(format!("{name}.jsonl"))),
            otlp_endpoint: otlp,
            otlp_export_interval_ms: 1_000,
            otlp_traces: traces,
            ..Default::default()
        };
        rt.block_on(tokenmeter::app::spawn(config, Vec::new()))
            .unwrap()
    };
    let arms = [
        proxy("off", None, false),
        proxy("metrics", Some(format!("http://{sink}")), false),
        proxy("traces", Some(format!("http://{sink}")), true),
    ];
    let mut conns: Vec<(TcpStream, Vec<u8>)> = arms
        .iter()
        .map(|p| {
            let s = TcpStream::connect(p.addr()).unwrap();
            s.set_nodelay(true).unwrap();
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                p.addr(),
                BODY.len()
            );
            (s, head.into_bytes())
        })
        .collect();
    let mut buf = Vec::new();
    let mut wall: [Vec<f64>; 3] = Default::default();
    let mut cpu: [Vec<f64>; 3] = Default::default();
    for round in 0..rounds + 2 {
        // Each round starts at another arm, so no arm always follows the same one (and pays for
        // what that one left running).
        for k in 0..conns.len() {
            let arm = (round + k) % conns.len();
            let (s, head) = &mut conns[arm];
            let c0 = cpu_ns();
            let t0 = Instant::now();
            for _ in 0..per_round {
                one(s, head, &mut buf);
            }
            let t = t0.elapsed();
            let c = cpu_ns() - c0;
            // The first two rounds warm up pools, caches and the exporter.
            if round >= 2 {
                wall[arm].push(t.as_nanos() as f64 / 1e3 / per_round as f64);
                cpu[arm].push(c as f64 / 1e3 / per_round as f64);
            }
        }
    }
    drop(conns);
    for p in arms {
        rt.block_on(p.shutdown());
    }
    let _ = std::fs::remove_dir_all(&dir);
    let mut out = [(0.0, 0.0); 3];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (median(&mut wall[i]), median(&mut cpu[i]));
    }
    out
}

fn main() {
    let mut rounds = 20;
    let mut per_round = 250;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => {}
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--rounds N");
            }
            "--per-round" => {
                per_round = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--per-round N");
            }
            _ => {
                println!("usage: cargo bench --bench otlp -- [--rounds 20] [--per-round 250]");
                return;
            }
        }
    }
    println!("load average before: {}", support::loadavg());
    // The proxies' accept loops, the upstream and the receiver run on this runtime's worker
    // while the client blocks the main thread.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (m_path, m_rec) = exporter_alone(&rt, false);
    let (t_path, t_rec) = exporter_alone(&rt, true);
    println!("\n## The exporter alone (ns per generation record, median of 15 batches of 4096)\n");
    println!("| where | OTLP off | metrics | metrics + traces |\n|---|---|---|---|");
    println!(
        "| data path (`finished`: queue offer) | 0 (not installed) | {m_path:.0} | {t_path:.0} |"
    );
    println!("| recording thread (offer to recorded, wall) | 0 | {m_rec:.0} | {t_rec:.0} |");
    let [off, met, tr] = end_to_end(&rt, rounds, per_round);
    println!(
        "\n## End to end in process ({rounds} rounds of {per_round} streamed requests per arm, one keep-alive connection each)\n"
    );
    println!(
        "| | OTLP off | metrics | metrics + traces | metrics − off | metrics + traces − off |\n|---|---|---|---|---|---|"
    );
    println!(
        "| wall µs per request (median of round means) | {:.1} | {:.1} | {:.1} | {:+.1} | {:+.1} |",
        off.0,
        met.0,
        tr.0,
        met.0 - off.0,
        tr.0 - off.0
    );
    println!(
        "| process CPU µs per request (all threads, median of round means) | {:.1} | {:.1} | {:.1} | {:+.1} | {:+.1} |",
        off.1,
        met.1,
        tr.1,
        met.1 - off.1,
        tr.1 - off.1
    );
    println!("\nload average after: {}", support::loadavg());
}
