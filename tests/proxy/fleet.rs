//! Two simulated replicas with different step times behind one proxy: 16 long streams spread
//! evenly, each replica's `/stats` window against that simulator's own token counter, then one
//! replica stopped mid-run: its streams are cut (`upstream_aborted`, never retried) and new
//! requests all succeed on the other.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::*;
use tokenmeter::clock::{Clock, NANOS_PER_SEC};
use tokenmeter::fleet::settings::UpstreamConfig;
use tokenmeter::sim::{SimConfig, SimHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

async fn sim(step_base_ms: f64, step_per_seq_ms: f64) -> SimHandle {
    crate::common::start_sim(SimConfig {
        stop_probability_per_token: 0.0,
        step_base_ms,
        step_per_seq_ms,
        log_stats_interval_s: 0.0,
        ..Default::default()
    })
    .await
}

fn chat(max_tokens: u32, user: &str) -> Vec<u8> {
    let body = format!(
        r#"{{"model":"sim-model","messages":[{{"role":"user","content":"task of {user}"}}],"max_tokens":{max_tokens},"stream":true}}"#
    );
    post(
        "/v1/chat/completions",
        &body,
        &[("x-tokenmeter-user", user)],
    )
}

/// What a client saw of one stream.
#[derive(Debug)]
struct Seen {
    status_ok: bool,
    events: usize,
    done: bool,
}

/// Sends one streamed request and reads it until EOF, or until `stop` flips (then drops it).
async fn stream(addr: SocketAddr, req: Vec<u8>, mut stop: watch::Receiver<bool>) -> Seen {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&req).await.unwrap();
    let mut buf = vec![0u8; 16 * 1024];
    let mut all = Vec::new();
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            r = c.read(&mut buf) => match r {
                Ok(0) | Err(_) => break,
                Ok(k) => all.extend_from_slice(&buf[..k]),
            },
        }
    }
    let text = String::from_utf8_lossy(&all);
    Seen {
        status_ok: text.starts_with("HTTP/1.1 200"),
        events: text.matches("\"content\":\"").count(),
        done: text.contains("data: [DONE]"),
    }
}

async fn stats(addr: SocketAddr) -> serde_json::Value {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET /stats?window=10s HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    let (_, body) = text.split_once("\r\n\r\n").unwrap();
    serde_json::from_str(body).unwrap()
}

/// A TCP relay in front of a replica, to kill it as a crashing process would: every connection
/// is dropped mid-stream and new ones are refused.
struct Relay {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(to: SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                conns.spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(to).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        });
        Relay { addr, task }
    }

    /// Drops the listener and every relayed connection (the JoinSet aborts them).
    async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

async fn wait_into_next_second(margin_ms: u64) {
    let into = Clock::global().now() % NANOS_PER_SEC;
    tokio::time::sleep(Duration::from_nanos(
        NANOS_PER_SEC - into + margin_ms * 1_000_000,
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_balance_measure_and_survive_a_stop() {
    let fast = sim(12.2, 2.1).await;
    let slow = sim(20.0, 3.0).await;
    let slow_relay = Relay::start(slow.addr()).await;
    let urls = [
        format!("http://{}", fast.addr()),
        format!("http://{}", slow_relay.addr),
    ];
    let proxy = TestProxy::start("http://127.0.0.1:1", |c| {
        c.upstreams = vec![
            UpstreamConfig {
                name: "fast".into(),
                url: urls[0].clone(),
                metrics_url: None,
            },
            UpstreamConfig {
                name: "slow".into(),
                url: urls[1].clone(),
                metrics_url: None,
            },
        ];
    })
    .await;
    let addr = proxy.addr;

    // 16 long streams (2,000 tokens: about a minute each), all open at once.
    let (stop_tx, stop_rx) = watch::channel(false);
    let long: Vec<_> = (0..16)
        .map(|i| {
            tokio::spawn(stream(
                addr,
                chat(2000, &format!("agent{i}")),
                stop_rx.clone(),
            ))
        })
        .collect();
    let t0 = Instant::now();
    loop {
        let s = stats(addr).await;
        let up = s["upstreams"].as_array().unwrap();
        if up
            .iter()
            .map(|u| u["in_flight"].as_u64().unwrap())
            .sum::<u64>()
            == 16
        {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "streams did not start: {s}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One full 10 s window with all 16 in flight.
    wait_into_next_second(0).await;
    let mut spreads = Vec::new();
    let mut samples = Vec::new();
    for _ in 0..10 {
        let s = stats(addr).await;
        let now: Vec<u64> = s["upstreams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["in_flight_now"].as_u64().unwrap())
            .collect();
        spreads.push(now[0].abs_diff(now[1]));
        samples.push(now);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("in flight now (fast, slow), one sample a second: {samples:?}");
    wait_into_next_second(150).await;
    let sec = Clock::global().now() / NANOS_PER_SEC;
    let s = stats(addr).await;
    let up = s["upstreams"].as_array().unwrap().clone();
    assert_eq!(up.len(), 2);
    for (u, sim) in up.iter().zip([&fast, &slow]) {
        let w = &u["windows"]["10s"];
        let proxy_rate = w["gen_tok_s"].as_f64().unwrap();
        let truth = sim.generated_tokens_in(sec - 10, sec) as f64 / 10.0;
        let err = (proxy_rate - truth).abs() / truth;
        eprintln!(
            "{}: in flight {} (min {}, max {}), proxy {proxy_rate:.1} tok/s, simulator {truth:.1} tok/s, difference {:.3}%",
            u["name"], u["in_flight"], w["in_flight"]["min"], w["in_flight"]["max"], err * 100.0
        );
        assert_eq!(w["steady"], true, "{}: window not steady: {w}", u["name"]);
        assert!(
            err < 0.01,
            "{}: proxy {proxy_rate} vs simulator {truth}",
            u["name"]
        );
        assert!(u["totals"]["requests_started"].as_u64().unwrap() > 0);
        assert_eq!(u["models"], serde_json::json!(["sim-model"]));
    }
    let (a, b) = (
        up[0]["in_flight"].as_u64().unwrap(),
        up[1]["in_flight"].as_u64().unwrap(),
    );
    assert!(a.abs_diff(b) <= 1, "in flight {a} vs {b}");
    assert!(
        spreads.iter().all(|d| *d <= 1),
        "in-flight spreads {spreads:?}"
    );
    let fast_rate = up[0]["windows"]["10s"]["gen_tok_s"].as_f64().unwrap();
    let slow_rate = up[1]["windows"]["10s"]["gen_tok_s"].as_f64().unwrap();
    assert!(
        fast_rate > slow_rate * 1.2,
        "fast {fast_rate} vs slow {slow_rate}"
    );

    // Kill the slow replica mid-stream: its streams are cut, new connections refused.
    let cut_at = Clock::global().now();
    slow_relay.kill().await;
    // New requests all succeed on the fast one (the first refused attempt ejects the slow one
    // and is retried; each later expiry of the ejection costs one more refused attempt).
    let mut short = Vec::new();
    for round in 0..5 {
        let batch: Vec<_> = (0..4)
            .map(|i| {
                let (_tx, rx) = watch::channel(false);
                tokio::spawn(async move {
                    let _keep = _tx;
                    stream(addr, chat(16, &format!("late{round}-{i}")), rx).await
                })
            })
            .collect();
        for t in batch {
            short.push(t.await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    for s in &short {
        assert!(s.status_ok && s.done && s.events >= 16, "{s:?}");
    }
    eprintln!(
        "after the stop: {} of {} new requests complete",
        short.iter().filter(|s| s.status_ok && s.done).count(),
        short.len()
    );
    let s = stats(addr).await;
    let slow_view = &s["upstreams"][1];
    assert!(slow_view["failures"].as_u64().unwrap() >= 1, "{slow_view}");
    assert!(
        slow_view["retried_away"].as_u64().unwrap() >= 1,
        "{slow_view}"
    );
    let metrics = {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /stats/metrics HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.unwrap();
        String::from_utf8_lossy(&out).to_string()
    };
    assert!(
        metrics.contains(
            "tokenmeter_upstream_requests_total{upstream=\"slow\",outcome=\"upstream_aborted\"} 8"
        ),
        "{metrics}"
    );

    let _ = stop_tx.send(true);
    let mut cut = 0;
    for t in long {
        let seen = t.await.unwrap();
        assert!(seen.status_ok && seen.events > 0);
        cut += !seen.done as usize;
    }
    assert_eq!(
        cut, 16,
        "every long stream ended without [DONE] (cut or stopped)"
    );
    let lines = proxy.finish().await;
    let by = |name: &str| -> Vec<&serde_json::Value> {
        lines.iter().filter(|l| l["upstream"] == name).collect()
    };
    let slow_lines = by("slow");
    let fast_lines = by("fast");
    // Exactly one line per request: 16 long + 20 short, none logged twice or retried.
    assert_eq!(lines.len(), 36, "{lines:#?}");
    assert_eq!(slow_lines.len(), 8);
    assert_eq!(fast_lines.len(), 28);
    for l in &slow_lines {
        assert_eq!(l["outcome"], "upstream_aborted", "{l}");
        assert!(l["completion_tokens"].as_u64().unwrap() > 0);
    }
    eprintln!(
        "cut streams: {} lines on slow, all upstream_aborted; {} lines in all for 36 requests (none retried)",
        slow_lines.len(),
        lines.len()
    );
    let late: Vec<_> = lines
        .iter()
        .filter(|l| l["ts_ns"].as_u64().unwrap() > cut_at)
        .collect();
    assert_eq!(late.len(), 20);
    for l in late {
        assert_eq!(
            (&l["outcome"], &l["upstream"]),
            (&"ok".into(), &"fast".into()),
            "{l}"
        );
    }
    fast.shutdown().await;
    slow.shutdown().await;
}

/// A replica that answers every request with 503 and closes.
async fn failing_replica() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let _ = c.read(&mut buf).await;
                let body = r#"{"error":{"message":"overloaded","type":"server_error"}}"#;
                let resp = format!("HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
                let _ = c.write_all(resp.as_bytes()).await;
            });
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_replica_is_ejected_and_its_requests_retried_once_elsewhere() {
    let good = sim(12.2, 2.1).await;
    let (bad, bad_task) = failing_replica().await;
    let proxy = TestProxy::start("http://127.0.0.1:1", |c| {
        c.routing.models_refresh_s = 0.0;
        c.routing.eject_base_ms = 200;
        c.upstreams = vec![
            UpstreamConfig {
                name: "bad".into(),
                url: format!("http://{bad}"),
                metrics_url: None,
            },
            UpstreamConfig {
                name: "good".into(),
                url: format!("http://{}", good.addr()),
                metrics_url: None,
            },
        ];
    })
    .await;
    for round in 0..6 {
        let (_tx, rx) = watch::channel(false);
        let seen = stream(proxy.addr, chat(4, &format!("u{round}")), rx).await;
        assert!(seen.status_ok && seen.done, "round {round}: {seen:?}");
        // Past the ejection now and then, so the bad replica is tried (and fails) again.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let s = stats(proxy.addr).await;
    let bad_view = &s["upstreams"][0];
    let failures = bad_view["failures"].as_u64().unwrap();
    // The first pick of a fresh proxy is the first replica (equal loads, round-robin from 0).
    assert!(failures >= 1, "{bad_view}");
    assert_eq!(bad_view["retried_away"].as_u64().unwrap(), failures);
    assert_eq!(bad_view["failures_in_row"].as_u64().unwrap(), failures);
    let lines = proxy.finish().await;
    assert_eq!(lines.len(), 6);
    for l in &lines {
        assert_eq!(
            (&l["upstream"], &l["outcome"]),
            (&"good".into(), &"ok".into()),
            "{l}"
        );
    }
    bad_task.abort();
    good.shutdown().await;
}
