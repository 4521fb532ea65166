//! `analyze` over the logs of two proxies written at the same time, each in front of the same
//! two replicas: the records merge as one fleet (same report as one log holding every line in
//! arrival order), and the per-upstream capacity tables count each replica's requests.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::*;
use tokenmeter::analyze::{analyze, AnalyzeOptions};
use tokenmeter::fleet::settings::UpstreamConfig;
use tokenmeter::sim::SimConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn sim(step_base_ms: f64) -> tokenmeter::sim::SimHandle {
    let cfg = SimConfig {
        stop_probability_per_token: 0.0,
        step_base_ms,
        log_stats_interval_s: 0.0,
        ..Default::default()
    };
    crate::common::start_sim(cfg).await
}

async fn one(addr: SocketAddr, user: &str) {
    let body = format!(
        r#"{{"model":"sim-model","messages":[{{"role":"user","content":"hi {user}"}}],"max_tokens":24,"stream":true}}"#
    );
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&post(
        "/v1/chat/completions",
        &body,
        &[("x-tokenmeter-user", user)],
    ))
    .await
    .unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).await.unwrap();
    assert!(String::from_utf8_lossy(&out).contains("[DONE]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_logs_merge_and_split_by_upstream() {
    let (a, b) = (sim(10.0).await, sim(25.0).await);
    let ups = vec![
        UpstreamConfig {
            name: "a".into(),
            url: format!("http://{}", a.addr()),
            metrics_url: None,
        },
        UpstreamConfig {
            name: "b".into(),
            url: format!("http://{}", b.addr()),
            metrics_url: None,
        },
    ];
    let p1 = TestProxy::start("http://127.0.0.1:1", |c| c.upstreams = ups.clone()).await;
    let p2 = TestProxy::start("http://127.0.0.1:1", |c| c.upstreams = ups.clone()).await;
    // Four clients per proxy, all at once, for about three seconds.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for (k, addr) in [p1.addr, p2.addr].into_iter().enumerate() {
        for i in 0..4 {
            tasks.push(tokio::spawn(async move {
                while Instant::now() < deadline {
                    one(addr, &format!("p{k}-u{i}")).await;
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (l1, l2) = (p1.finish().await, p2.finish().await);
    assert!(!l1.is_empty() && !l2.is_empty());
    let dir = TempDir::new("fleet-analyze");
    let write = |name: &str, lines: &[&serde_json::Value]| {
        let p = dir.0.join(name);
        let text: String = lines
            .iter()
            .map(|l| serde_json::to_string(l).unwrap() + "\n")
            .collect();
        std::fs::write(&p, text).unwrap();
        p
    };
    let f1 = write("one.jsonl", &l1.iter().collect::<Vec<_>>());
    let f2 = write("two.jsonl", &l2.iter().collect::<Vec<_>>());
    // Their time ranges overlap: each log's first arrival is before the other's last.
    let ts = |l: &[serde_json::Value]| {
        let v: Vec<u64> = l.iter().map(|x| x["ts_ns"].as_u64().unwrap()).collect();
        (*v.iter().min().unwrap(), *v.iter().max().unwrap())
    };
    let (r1, r2) = (ts(&l1), ts(&l2));
    assert!(r1.0 < r2.1 && r2.0 < r1.1, "{r1:?} {r2:?}");
    let mut all: Vec<&serde_json::Value> = l1.iter().chain(&l2).collect();
    all.sort_by_key(|l| l["ts_ns"].as_u64().unwrap());
    let merged = write("merged.jsonl", &all);

    let opts = AnalyzeOptions::default();
    let two = analyze(&[f1, f2], &opts).unwrap();
    let one_file = analyze(&[merged], &opts).unwrap();
    let n = (l1.len() + l2.len()) as u64;
    assert_eq!(two.summary.requests, n);
    let tokens: u64 = all
        .iter()
        .map(|l| l["completion_tokens"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(two.summary.completion_tokens, tokens);
    let j = |r: &tokenmeter::analyze::report::Report| {
        let mut v = serde_json::to_value(r).unwrap();
        v["inputs"] = serde_json::Value::Null;
        v
    };
    // Equal but for the last bits of float sums taken in another order.
    if let Some(path) = differs(&j(&two), &j(&one_file), String::new()) {
        panic!("two logs and one differ at {path}");
    }
    let names: Vec<&str> = two.upstreams.iter().map(|u| u.upstream.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    for u in &two.upstreams {
        let count = all
            .iter()
            .filter(|l| l["upstream"] == u.upstream.as_str())
            .count() as u64;
        assert!(count > 0);
        assert_eq!(u.requests, count, "{}", u.upstream);
        assert!(u.capacity.iter().all(|c| c.in_flight <= 8));
    }
    let text = tokenmeter::analyze::tables::render(&two);
    assert!(text.contains("Capacity of upstream a"), "{text}");
    a.shutdown().await;
    b.shutdown().await;
}

/// The first path at which `a` and `b` differ (numbers within 1e-9 relative are equal).
fn differs(a: &serde_json::Value, b: &serde_json::Value, at: String) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            ((x - y).abs() > 1e-9 * x.abs().max(y.abs()).max(1.0)).then_some(at)
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return Some(at);
            }
            x.iter()
                .zip(y)
                .enumerate()
                .find_map(|(i, (p, q))| differs(p, q, format!("{at}[{i}]")))
        }
        (Value::Object(x), Value::Object(y)) => {
            if x.len() != y.len() {
                return Some(at);
            }
            x.iter().find_map(|(k, p)| match y.get(k) {
                Some(q) => differs(p, q, format!("{at}.{k}")),
                None => Some(format!("{at}.{k}")),
            })
        }
        _ => (a != b).then_some(at),
    }
}
