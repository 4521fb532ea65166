//! What `ttft_for_non_streamed` costs (docs/proxy.md, "TTFT for non-streamed requests"). Slow and
//! machine-dependent, so ignored by default:
//! `cargo test --release --test proxy -- --ignored --nocapture --test-threads 1 nonstream_cost::`.
//!
//! - Added latency at the end of a 250-token answer: an in-process scripted upstream notes when it
//!   wrote the last byte of its answer (the stream's end, or the non-streamed JSON); the client
//!   notes when it has the whole non-streamed answer. The difference, setting on against off.
//! - CPU per request: the proxy and the simulator as separate processes; the proxy's user+system
//!   CPU time (`/proc/PID/stat`) over many 250-token non-streamed requests, setting on and off
//!   (and a client stream for reference), interleaved.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TOKENS: usize = 250;

fn chunk(body: &str) -> Vec<u8> {
    let ev = format!("data: {body}\n\n");
    let mut c = format!("{:x}\r\n", ev.len()).into_bytes();
    c.extend_from_slice(ev.as_bytes());
    c.extend_from_slice(b"\r\n");
    c
}

fn event(content: &str, finish: &str) -> String {
    format!(
        r#"{{"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{{"index":0,"delta":{{"content":"{content}"}},"logprobs":null,"finish_reason":{finish},"token_ids":null}}]}}"#
    )
}

/// Reads one request: head and `content-length` body.
async fn read_request(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    loop {
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + len {
                return Some(buf[end + 4..end + 4 + len].to_vec());
            }
        }
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// An upstream answering 250 tokens, 1 ms apart when streamed (after the same time otherwise),
/// noting when the last byte of each answer was written.
async fn upstream(done: Arc<Mutex<Vec<Instant>>>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            s.set_nodelay(true).unwrap();
            let done = done.clone();
            tokio::spawn(async move {
                while let Some(body) = read_request(&mut s).await {
                    if find(&body, br#""stream":true"#).is_some() {
                        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n").await.unwrap();
                        s.write_all(&chunk(r#"{"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}"#)).await.unwrap();
                        for i in 0..TOKENS {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            let fin = if i + 1 == TOKENS {
                                "\"length\",\"stop_reason\":null"
                            } else {
                                "null"
                            };
                            s.write_all(&chunk(&event(" tok", fin))).await.unwrap();
                        }
                        let mut tail = chunk(
                            r#"{"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"total_tokens":255,"completion_tokens":250},"system_fingerprint":"fp"}"#,
                        );
                        tail.extend_from_slice(&chunk("[DONE]"));
                        tail.extend_from_slice(b"0\r\n\r\n");
                        s.write_all(&tail).await.unwrap();
                    } else {
                        tokio::time::sleep(Duration::from_millis(TOKENS as u64 + 20)).await;
                        let text = " tok".repeat(TOKENS);
                        let json = format!(
                            r#"{{"id":"chatcmpl-x","object":"chat.completion","created":1,"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"{text}","refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":null}},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"routed_experts":null}}],"service_tier":null,"system_fingerprint":"fp","usage":{{"prompt_tokens":5,"total_tokens":255,"completion_tokens":250,"prompt_tokens_details":null,"completion_tokens_details":null}},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}}"#
                        );
                        let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", json.len());
                        s.write_all(format!("{head}{json}").as_bytes())
                            .await
                            .unwrap();
                    }
                    done.lock().unwrap().push(Instant::now());
                }
            });
        }
    });
    addr
}

/// Sends a non-streamed request and returns when the whole answer has arrived.
async fn ask(addr: SocketAddr, body: &str) -> (Instant, Vec<u8>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(&post("/v1/chat/completions", body, &[]))
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut tmp = [0u8; 65536];
    loop {
        let n = s.read(&mut tmp).await.unwrap();
        buf.extend_from_slice(&tmp[..n]);
        if n == 0 {
            return (Instant::now(), buf);
        }
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            if let Some(len) = head.lines().find_map(|l| l.strip_prefix("content-length:")) {
                if buf.len() >= end + 4 + len.trim().parse::<usize>().unwrap() {
                    return (Instant::now(), buf);
                }
            }
        }
    }
}

fn median_us(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e6
}

#[tokio::test]
#[ignore = "measurement; run with --ignored --nocapture"]
async fn added_latency_at_the_end_of_a_250_token_answer() {
    let done = Arc::new(Mutex::new(Vec::new()));
    let up = format!("http://{}", upstream(done.clone()).await);
    let on = TestProxy::start(&up, |c| c.ttft_for_non_streamed.chat = true).await;
    let off = TestProxy::start(&up, |_| {}).await;
    let req = r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":250}"#;
    let (mut on_lat, mut off_lat) = (Vec::new(), Vec::new());
    for round in 0..40 {
        for (addr, lat) in [(on.addr, &mut on_lat), (off.addr, &mut off_lat)] {
            let (arrived, raw) = ask(addr, req).await;
            let wrote = *done.lock().unwrap().last().unwrap();
            assert!(find(&raw, b"\"finish_reason\":\"length\"").is_some());
            if round >= 5 {
                lat.push(arrived.saturating_duration_since(wrote));
            }
        }
    }
    let lines = on.finish().await;
    assert!(lines.iter().all(|l| l["ttft_source"] == "upstream_stream"));
    off.stop().await;
    let (a, b) = (median_us(on_lat), median_us(off_lat));
    println!("last upstream byte -> whole answer at the client, median of 35: setting on {a:.0} us, off {b:.0} us, added {:.0} us", a - b);
}

/// `getconf CLK_TCK`: the unit of `/proc/PID/stat`'s CPU times.
fn clock_ticks_per_second() -> f64 {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3; utime and stime are fields 14 and 15.
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / clock_ticks_per_second()
}

#[tokio::test]
#[ignore = "measurement; run with --ignored --nocapture"]
async fn cpu_per_request_with_the_setting_on_and_off() {
    let bin = env!("CARGO_BIN_EXE_tokenmeter");
    let (mut sim, sim_addr, _sim_log) = spawn_logged(std::process::Command::new(bin).args([
        "sim",
        "--listen",
        "127.0.0.1:0",
        "--fixed-pace",
        "--fixed-ttft-ms",
        "1",
        "--fixed-gap-ms",
        "0.2",
    ]));
    let upstream = format!("http://{sim_addr}");
    let serve = |extra: &[&str]| {
        spawn_logged(
            std::process::Command::new(bin)
                .args([
                    "serve",
                    "--listen",
                    "127.0.0.1:0",
                    "--upstream",
                    &upstream,
                    "--set",
                    "serving_threads=1",
                ])
                .args(extra),
        )
    };
    let (mut p_off, off, _l1) = serve(&[]);
    let (mut p_on, on, _l2) = serve(&["--set", "ttft_for_non_streamed.chat=true"]);
    let non_streamed =
        r#"{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":250}"#;
    let streamed = r#"{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":250,"stream":true}"#;
    let arms = [
        ("off, non-streamed", off, p_off.id(), non_streamed),
        ("on, non-streamed", on, p_on.id(), non_streamed),
        ("client stream", off, p_off.id(), streamed),
    ];
    let mut cpu = [0.0f64; 3];
    let per_round = 50;
    let rounds = 6;
    for round in 0..=rounds {
        for (i, (_, addr, pid, body)) in arms.iter().enumerate() {
            let before = cpu_seconds(*pid);
            for _ in 0..per_round {
                let r = raw_request(*addr, &post("/v1/chat/completions", body, &[])).await;
                assert_eq!(r.status, 200);
            }
            if round > 0 {
                cpu[i] += cpu_seconds(*pid) - before;
            }
        }
    }
    let n = (per_round * rounds) as f64;
    for (i, (name, ..)) in arms.iter().enumerate() {
        println!(
            "proxy CPU per 250-token request, {name}: {:.0} us (over {n} requests)",
            cpu[i] / n * 1e6
        );
    }
    for c in [&mut p_off, &mut p_on, &mut sim] {
        let _ = c.kill();
        let _ = c.wait();
    }
}
