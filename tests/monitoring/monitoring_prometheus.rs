//! A real Prometheus server scrapes the proxy (`/metrics` on `admin_listen`) and the simulator
//! every second through a minute of steady streams; then, over its HTTP API:
//! - at several instants of the steady part, `rate(tokenmeter_generation_tokens_total[30s])` is
//!   within 2 % of `rate(vllm:generation_tokens_total[30s])`;
//! - the counter as it was before (`tokenmeter_completion_tokens_total`, counted when a request
//!   ends) fails that same check;
//! - every query of the Grafana dashboard (`grafana/tokenmeter.json`), its variables resolved
//!   the way Grafana would, returns data, and names only metrics Prometheus has.
//!
//! Needs Prometheus (`.ci/run` installs the Debian package):
//! `cargo test --release --test monitoring -- --ignored --nocapture monitoring_prometheus::`.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::monitoring_support::*;
use serde_json::Value;

const TOLERANCE_PCT: f64 = 2.0;

/// Percent-encodes a query-string value.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus API call; the `data` of a successful answer.
pub(crate) async fn api(prom: SocketAddr, path_and_query: &str) -> Value {
    let (status, body) = get(prom, path_and_query).await;
    let v: Value =
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("{path_and_query}: {status} {body}"));
    assert_eq!(v["status"], "success", "{path_and_query}: {body}");
    v["data"].clone()
}

/// The instant vector of `expr` at Unix time `t`.
pub(crate) async fn query(prom: SocketAddr, expr: &str, t: f64) -> Vec<Value> {
    let d = api(
        prom,
        &format!("/api/v1/query?query={}&time={t:.3}", enc(expr)),
    )
    .await;
    d["result"].as_array().cloned().unwrap_or_default()
}

/// The single value of a scalar-like query at `t`.
async fn value(prom: SocketAddr, expr: &str, t: f64) -> f64 {
    let r = query(prom, expr, t).await;
    assert_eq!(r.len(), 1, "{expr} at {t}: {r:?}");
    r[0]["value"][1].as_str().unwrap().parse().unwrap()
}

pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Starts Prometheus scraping `targets` (job name, address) every second.
fn start_prometheus(dir: &Scratch, targets: &[(&str, SocketAddr)]) -> (KillOnDrop, SocketAddr) {
    start_prometheus_with_rules(dir, targets, None)
}

/// As [`start_prometheus`], evaluating the rule file `rules` (copied beside its config) every
/// second.
pub(crate) fn start_prometheus_with_rules(
    dir: &Scratch,
    targets: &[(&str, SocketAddr)],
    rules: Option<&std::path::Path>,
) -> (KillOnDrop, SocketAddr) {
    let mut cfg = String::from(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n",
    );
    if let Some(r) = rules {
        let copy = dir.0.join("rules.yml");
        std::fs::copy(r, &copy).unwrap();
        cfg.push_str(&format!("rule_files:\n  - {}\n", copy.display()));
    }
    cfg.push_str("scrape_configs:\n");
    for (job, addr) in targets {
        cfg.push_str(&format!(
            "  - job_name: {job}\n    metrics_path: /metrics\n    static_configs:\n      - targets: ['{addr}']\n"
        ));
    }
    let file = dir.0.join("prometheus.yml");
    std::fs::write(&file, cfg).unwrap();
    let port = free_port();
    let child = Command::new(program("PROMETHEUS", &["prometheus"], "prometheus"))
        .arg(format!("--config.file={}", file.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.0.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    (KillOnDrop(child), SocketAddr::from(([127, 0, 0, 1], port)))
}

/// Values of `label` on the series `selector` selects (Grafana's `label_values`).
async fn label_values(prom: SocketAddr, selector: &str, label: &str) -> BTreeSet<String> {
    let d = api(prom, &format!("/api/v1/series?match[]={}", enc(selector))).await;
    d.as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s[label].as_str().map(String::from))
        .collect()
}

/// Replaces `$name` and `${name}` by `value` in `text`.
fn substitute(text: &str, name: &str, value: &str) -> String {
    text.replace(&format!("${{{name}}}"), value)
        .replace(&format!("${name}"), value)
}

/// Metric names in a PromQL expression: identifiers outside label matchers and strings that
/// are neither functions, aggregation keywords nor label names in `by (...)`.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const WORDS: &[&str] = &[
        "sum",
        "by",
        "without",
        "rate",
        "irate",
        "increase",
        "histogram_quantile",
        "topk",
        "bottomk",
        "avg",
        "min",
        "max",
        "count",
        "le",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "offset",
        "bool",
    ];
    let mut out = BTreeSet::new();
    let (mut in_braces, mut in_string, mut in_by) = (false, false, false);
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if in_string {
            in_string = c != '"';
        } else if c == '"' {
            in_string = true;
        } else if c == '{' {
            in_braces = true;
        } else if c == '}' {
            in_braces = false;
        } else if c == ')' {
            in_by = false;
        } else if c == '[' {
            // A range: skip to its end.
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i + 1 < chars.len()
                && (chars[i + 1].is_ascii_alphanumeric()
                    || chars[i + 1] == '_'
                    || chars[i + 1] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..=i].iter().collect();
            if word == "by" || word == "without" {
                in_by = true;
            } else if !in_braces && !in_by && !WORDS.contains(&word.as_str()) {
                out.insert(word);
            }
        }
        i += 1;
    }
    out
}

#[test]
fn metric_names_are_found_in_expressions() {
    let e = r#"histogram_quantile(0.9, sum by (le) (rate(tokenmeter_ttft_bucket{job=~"a",model=~".*"}[30s]))) / 2^30 + sum(vllm:x{le="1"})"#;
    assert_eq!(
        metric_names(e).into_iter().collect::<Vec<_>>(),
        ["tokenmeter_ttft_bucket", "vllm:x"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Prometheus; run by .ci/run"]
async fn prometheus_rates_agree_with_vllm_and_every_dashboard_query_has_data() {
    let rig = Rig::start().await;
    let dir = Scratch::new("prometheus");
    let (_prom, prom) =
        start_prometheus(&dir, &[("tokenmeter", rig.admin), ("vllm", rig.sim.addr())]);
    let ready = Instant::now() + Duration::from_secs(30);
    while !matches!(try_get(prom, "/-/ready").await, Ok((200, _))) {
        assert!(Instant::now() < ready, "Prometheus did not get ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // 16 long streams (1,200 to 3,450 tokens, a minute to three at 16 in flight), started half
    // a second apart, restarted as they end: the level holds at 16. A request's tokens take a
    // minute or more to stream, so a counter that moves only at the end moves in big steps.
    let started = Instant::now();
    let run = Duration::from_secs(80);
    let plan: Vec<(Duration, u32)> = (0..16u32)
        .map(|i| (Duration::from_millis(500 * i as u64), 1200 + 150 * i))
        .collect();
    let streams = rig.hold_streams(&plan, started + run + Duration::from_secs(30));
    // A few requests the simulator refuses (400, malformed JSON) and a few it answers for the
    // Errors panel, so that every panel has something to show.
    for _ in 0..3 {
        let bad = "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 7\r\nconnection: close\r\n\r\n{\"model";
        let mut c = tokio::net::TcpStream::connect(rig.main).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        c.write_all(bad.as_bytes()).await.unwrap();
        let mut sink = Vec::new();
        let _ = c.read_to_end(&mut sink).await;
    }
    rig.one_shot_users(20).await;
    tokio::time::sleep(run.saturating_sub(started.elapsed())).await;
    let end = unix_now() - 1.0;

    // Instants from 40 s in (every stream started by 8 s, so the 30 s range is steady from
    // 38 s) to the end.
    let first = end - (run.as_secs_f64() - 40.0);
    let instants: Vec<f64> = (0..6)
        .map(|k| first + (end - first) * k as f64 / 5.0)
        .collect();
    let live = "sum(rate(tokenmeter_generation_tokens_total[30s]))";
    let old = "sum(rate(tokenmeter_completion_tokens_total[30s]))";
    let server = "sum(rate(vllm:generation_tokens_total[30s]))";
    let mut worst_live: f64 = 0.0;
    let mut worst_old: f64 = 0.0;
    println!("instant (s before end) | vLLM tok/s | live counter | diff % | finish-time counter | diff %");
    for t in &instants {
        let s = value(prom, server, *t).await;
        let l = value(prom, live, *t).await;
        let o = value(prom, old, *t).await;
        let dl = 100.0 * (l - s) / s;
        let dold = 100.0 * (o - s) / s;
        println!(
            "{:>6.1} | {s:>8.1} | {l:>8.1} | {dl:>+6.2} | {o:>8.1} | {dold:>+7.1}",
            end - t
        );
        assert!(s > 100.0, "the server generated {s} tok/s: no steady load");
        worst_live = worst_live.max(dl.abs());
        worst_old = worst_old.max(dold.abs());
    }
    assert!(
        worst_live <= TOLERANCE_PCT,
        "the live counter's rate is {worst_live:.2} % off vLLM's at worst"
    );
    assert!(
        worst_old > TOLERANCE_PCT,
        "the finish-time counter passed too ({worst_old:.2} %): the check cannot tell them apart"
    );
    println!("worst: live {worst_live:.2} %, finish-time {worst_old:.1} %");

    // The Grafana dashboard: variables resolved like Grafana (query variables from
    // label_values, "All" as the variable's allValue), then every panel query at `end`.
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/grafana/tokenmeter.json"
    ))
    .unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    assert!(
        dash["schemaVersion"].as_u64().unwrap() >= 36,
        "Grafana 10 schema"
    );
    let names: BTreeSet<String> = api(prom, "/api/v1/label/__name__/values")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let mut vars: Vec<(String, String)> = vec![
        ("__rate_interval".into(), "30s".into()),
        ("__interval".into(), "5s".into()),
        ("__range".into(), "1m".into()),
    ];
    let mut has_datasource_var = false;
    for v in dash["templating"]["list"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap().to_string();
        match v["type"].as_str().unwrap() {
            "datasource" => {
                assert_eq!(v["query"], "prometheus");
                has_datasource_var = true;
            }
            "query" => {
                let mut q = v["query"]["query"].as_str().unwrap().to_string();
                for (k, val) in &vars {
                    q = substitute(&q, k, val);
                }
                let inner = q
                    .strip_prefix("label_values(")
                    .and_then(|r| r.strip_suffix(')'))
                    .unwrap_or_else(|| panic!("variable {name}: {q}"));
                let (selector, label) = inner.rsplit_once(',').unwrap();
                let values = label_values(prom, selector.trim(), label.trim()).await;
                assert!(!values.is_empty(), "variable {name} ({q}) has no values");
                let value = if v["includeAll"] == true {
                    v["allValue"].as_str().unwrap().to_string()
                } else {
                    values.into_iter().next().unwrap()
                };
                vars.push((name, value));
            }
            other => panic!("variable {name} of type {other}"),
        }
    }
    assert!(has_datasource_var, "a Prometheus datasource variable");
    let mut checked = 0;
    for p in dash["panels"].as_array().unwrap() {
        let title = p["title"].as_str().unwrap();
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        for t in p["targets"].as_array().unwrap() {
            let mut expr = t["expr"].as_str().unwrap().to_string();
            for (k, val) in &vars {
                expr = substitute(&expr, k, val);
            }
            assert!(
                !expr.contains('$'),
                "{title}: unresolved variable in {expr}"
            );
            for m in metric_names(&expr) {
                assert!(names.contains(&m), "{title}: no metric {m} in Prometheus");
            }
            let r = query(prom, &expr, end).await;
            assert!(!r.is_empty(), "{title}: {expr} returned no data");
            checked += 1;
        }
    }
    println!("{checked} dashboard queries returned data");
    for s in streams {
        s.abort();
    }
}
