//! Slow reliability probes (run by `scripts/reliability.sh`, `#[ignore]`d in the default run):
//! stalled readers and proxy memory, a 20,000-request burst against the access log, and 2,000
//! concurrent streams for 60 s against the simulator.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn serve_binary(args: &[&str]) -> (ChildGuard, SocketAddr) {
    let (child, addr, _log) = spawn_logged(
        Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args),
    );
    (child, addr)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow: run by scripts/reliability.sh"]
async fn stalled_readers_hold_little_proxy_memory() {
    // Each stream is 4 MB of SSE, written by the upstream as fast as the proxy takes it.
    let event = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
        "x".repeat(1000)
    );
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    let mut steps = vec![Step::Raw(Duration::ZERO, head.as_bytes().to_vec())];
    steps.extend(
        (0..4 * 1024 * 1024 / event.len())
            .map(|_| Step::Chunk(Duration::ZERO, event.clone().into_bytes())),
    );
    steps.push(Step::Raw(Duration::ZERO, b"0\r\n\r\n".to_vec()));
    let up = FakeUpstream::start(vec![Script { steps }]).await;
    let (mut child, addr) = serve_binary(&["--upstream", &up.url()]);
    let pid = child.id();
    // Warm up allocator pools with two complete streams, then take the baseline.
    for _ in 0..2 {
        let got = raw_request(
            addr,
            &post("/v1/chat/completions", r#"{"stream":true}"#, &[]),
        )
        .await;
        assert!(got.complete && got.body.len() > 4_000_000);
    }
    let idle = rss_kib(pid);
    let mut stalled = Vec::new();
    for _ in 0..20 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&post("/v1/chat/completions", r#"{"stream":true}"#, &[]))
            .await
            .unwrap();
        stalled.push(c); // never read
    }
    // Let the pipeline fill up until the upstream is blocked.
    let mut last = 0;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = rss_kib(pid);
        if now == last {
            break;
        }
        last = now;
    }
    let held = rss_kib(pid);
    let per_stream = (held.saturating_sub(idle)) as f64 / 20.0;
    println!("proxy RSS idle {idle} KiB, with 20 stalled 4 MB streams {held} KiB: {per_stream:.1} KiB per stream");
    assert!(per_stream <= 64.0, "{per_stream} KiB per stalled stream");
    drop(stalled);
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow: run by scripts/reliability.sh"]
async fn a_burst_of_20000_requests_leaves_a_line_or_a_count_for_each() {
    let fx = fixture("01_chat_nonstream.http");
    let up = FakeUpstream::start(vec![fx.script(Duration::ZERO)]).await;
    for buffer in [65_536usize, 8] {
        let proxy = TestProxy::start(&up.url(), |c| c.access_log_buffer = buffer).await;
        let addr = proxy.addr;
        let t = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let next = next.clone();
                tokio::spawn(async move {
                    let mut ok = 0u64;
                    while next.fetch_add(1, Ordering::Relaxed) < 20_000 {
                        if raw_request(addr, &post("/v1/chat/completions", "{}", &[]))
                            .await
                            .status
                            == 200
                        {
                            ok += 1;
                        }
                    }
                    ok
                })
            })
            .collect();
        let mut ok = 0;
        for t in tasks {
            ok += t.await.unwrap();
        }
        assert_eq!(ok, 20_000);
        let stats = raw_request(
            addr,
            b"GET /stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await
        .json();
        let counters = proxy.handle.as_ref().unwrap().access_log_counters();
        let lines = proxy.finish().await;
        let (written, dropped, failed) = counters.get();
        println!("buffer {buffer}: 20000 requests in {:?}: {} lines, written {written}, dropped {dropped}, failed {failed}", t.elapsed(), lines.len());
        assert_eq!(failed, 0);
        assert_eq!(lines.len() as u64, written);
        assert_eq!(
            written + dropped,
            20_000,
            "every request has its line or is counted"
        );
        assert!(stats["access_log"]["dropped"].as_u64().unwrap() <= dropped);
        if buffer == 65_536 {
            assert_eq!(dropped, 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow: run by scripts/reliability.sh"]
async fn two_thousand_streams_for_a_minute() {
    // Simulator and proxy as their own processes, as deployed; the clients live here.
    let dir = TempDir::new("2000");
    let sim_cfg = dir.0.join("sim.toml");
    std::fs::write(
        &sim_cfg,
        "max_num_seqs = 2048\nstep_per_seq_ms = 0.02\nstop_probability_per_token = 0.0\n",
    )
    .unwrap();
    let (mut sim, sim_addr, _sim_log) = spawn_logged(
        Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
            .args(["sim", "--listen", "127.0.0.1:0", "--config"])
            .arg(&sim_cfg),
    );
    let log = dir.0.join("access.jsonl");
    // /stats on its own address: the admin listener answers from a thread of its own.
    let (mut proxy, addr, proxy_log) = spawn_logged(
        Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .args([
                "--upstream",
                &format!("http://{sim_addr}"),
                "--access-log",
                log.to_str().unwrap(),
            ]),
    );
    let stats_addr: SocketAddr = loop {
        let line = proxy_log.recv_timeout(Duration::from_secs(20)).unwrap();
        if let Some(i) = line.find("stats listening on ") {
            break line[i + 19..]
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap();
        }
    };
    // ~52 ms per step at 2,000 sequences: 1,100 tokens last about a minute.
    let clients: Vec<_> = (0..2000)
        .map(|i| {
            tokio::spawn(async move {
                let body = format!(r#"{{"model":"sim-model","messages":[{{"role":"user","content":"task {i}"}}],"max_tokens":1100,"stream":true}}"#);
                let mut c = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
                c.write_all(&post("/v1/chat/completions", &body, &[])).await.map_err(|e| e.to_string())?;
                let mut raw = Vec::new();
                tokio::time::timeout(Duration::from_secs(180), c.read_to_end(&mut raw)).await.map_err(|_| "timeout".to_string())?.map_err(|e| e.to_string())?;
                let got = parse_response(&raw);
                if got.status == 200 && got.complete && got.body.ends_with(b"data: [DONE]\n\n") {
                    Ok(())
                } else {
                    Err(format!("status {} complete {}", got.status, got.complete))
                }
            })
        })
        .collect();
    // /stats is polled from a thread of its own with a blocking client, so the figure is the
    // proxy's answer time, not this test's busy runtime.
    let t0 = Instant::now();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let done = done.clone();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            let mut took = Vec::new();
            while !done.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(200) {
                let t = Instant::now();
                let mut c = std::net::TcpStream::connect(stats_addr).unwrap();
                c.write_all(
                    b"GET /stats?window=10s HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
                )
                .unwrap();
                let mut raw = Vec::new();
                c.read_to_end(&mut raw).unwrap();
                took.push((t.elapsed(), t0.elapsed()));
                assert_eq!(parse_response(&raw).status, 200);
                std::thread::sleep(Duration::from_millis(500));
            }
            took
        })
    };
    let mut errors = Vec::new();
    for c in clients {
        if let Err(e) = c.await.unwrap() {
            errors.push(e);
        }
    }
    done.store(true, Ordering::Relaxed);
    let took = poller.join().unwrap();
    Command::new("kill")
        .args(["-TERM", &proxy.id().to_string()])
        .status()
        .unwrap();
    assert!(proxy.wait().unwrap().success());
    sim.kill().unwrap();
    let _ = sim.wait();
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ok = lines.iter().filter(|l| l["outcome"] == "ok").count();
    let mut sorted: Vec<Duration> = took.iter().map(|t| t.0).collect();
    sorted.sort();
    let slow: Vec<String> = took
        .iter()
        .filter(|t| t.0 > Duration::from_millis(50))
        .map(|t| format!("{:?} at {:.1}s", t.0, t.1.as_secs_f64()))
        .collect();
    println!(
        "2000 streams in {:?}: {} errors, {ok} ok records of {}; /stats over {} polls: p50 {:?}, p90 {:?}, max {:?}; over 50 ms: {slow:?}",
        t0.elapsed(),
        errors.len(),
        lines.len(),
        sorted.len(),
        sorted[sorted.len() / 2],
        sorted[sorted.len() * 9 / 10],
        sorted[sorted.len() - 1]
    );
    assert!(errors.is_empty(), "{:?}", &errors[..errors.len().min(5)]);
    assert_eq!((lines.len(), ok), (2000, 2000));
    assert!(
        sorted[sorted.len() - 1] < Duration::from_millis(50),
        "/stats took up to {:?}",
        sorted[sorted.len() - 1]
    );
}
