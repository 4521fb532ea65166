//! `/stats` and `/stats/metrics` over a real socket; `/stats` output checked against the schema.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::meter_support::record;
use serde_json::Value;
use tokenmeter::access_log::AccessLogCounters;
use tokenmeter::clock::{Clock, NANOS_PER_SEC};
use tokenmeter::meter::live::spawn_meter_at;
use tokenmeter::meter::{stats_router, MeterConfig, MeterHandle, StatsContext};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn validator() -> jsonschema::Validator {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/schemas/stats.schema.json"
    ))
    .unwrap();
    let schema: Value = serde_json::from_str(&text).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

fn assert_valid(v: &jsonschema::Validator, doc: &Value) {
    let errors: Vec<String> = v
        .iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(errors.is_empty(), "schema violations: {errors:#?}\n{doc:#}");
}

/// Serves the router on 127.0.0.1:0 and returns its address.
async fn serve(
    handle: MeterHandle,
    token: Option<&str>,
    access_log: Arc<AccessLogCounters>,
) -> std::net::SocketAddr {
    let ctx = StatsContext {
        fleet: None,
        otlp: None,
        scrape: None,
        upstream: "http://127.0.0.1:8000".into(),
        bearer_token: tokenmeter::meter::StatsToken::new(token),
        health: Default::default(),
        access_log,
        started: Clock::global().now() - 60 * NANOS_PER_SEC,
        time: Default::default(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, stats_router(handle, ctx)).await });
    addr
}

/// One HTTP/1.1 GET; returns (status, headers text, body).
async fn get(addr: std::net::SocketAddr, path: &str, auth: Option<&str>) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let auth = auth
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![];
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8(buf).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head[9..12].parse().unwrap();
    (status, head.to_string(), body.to_string())
}

/// A meter started 30 whole seconds ago: two users each with one request over [1 s, 4 s)
/// (finished), then one request of alice in flight since 5 s.
fn busy_meter() -> MeterHandle {
    let base = (Clock::global().now() / NANOS_PER_SEC - 30) * NANOS_PER_SEC;
    let t = |s: u64| base + s * NANOS_PER_SEC;
    let h = spawn_meter_at(MeterConfig::default(), t(0));
    for (id, user) in [(1u64, "alice"), (2, "bob")] {
        h.started(id, t(1), Arc::from(user), Some(Arc::from("tiny-llama")));
    }
    for (id, user) in [(1u64, "alice"), (2, "bob")] {
        h.tokens(id, t(2), 5);
        let mut r = record(t(1), 3000.0, Some(500.0), Some(8), Some(4), true);
        r.request_id = format!("tm-00000001-{id:08x}");
        r.user = user.into();
        r.in_flight_at_start = id as u32;
        h.finished(id, t(4), Box::new(r));
    }
    h.started(3, t(5), Arc::from("alice"), None);
    h
}

#[tokio::test]
async fn stats_json_validates_with_and_without_filters() {
    let v = validator();
    let log = Arc::new(AccessLogCounters::default());
    log.written.store(7, Ordering::Relaxed);
    let h = busy_meter();
    let addr = serve(h, None, log).await;
    for path in [
        "/stats",
        "/stats?user=alice",
        "/stats?window=60s",
        "/stats?user=nobody&window=10s",
    ] {
        let (status, head, body) = get(addr, path, None).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert!(head
            .to_ascii_lowercase()
            .contains("content-type: application/json"));
        let doc: Value = serde_json::from_str(&body).unwrap();
        assert_valid(&v, &doc);
        assert_eq!(doc["access_log"]["written"], 7);
        assert_eq!(doc["upstream"], "http://127.0.0.1:8000");
        assert_eq!(doc["in_flight"], 1);
        assert_eq!(doc["meter_events_dropped"], 0);
        assert!(doc["uptime_s"].as_f64().unwrap() >= 60.0);
    }
    let doc: Value = serde_json::from_str(&get(addr, "/stats?user=alice", None).await.2).unwrap();
    assert_eq!(
        doc["users"].as_object().unwrap().keys().collect::<Vec<_>>(),
        ["alice"]
    );
    assert_eq!(doc["users"]["alice"]["totals"]["completion_tokens"], 8);
    assert_eq!(doc["users"]["alice"]["in_flight"], 1);
    assert_eq!(doc["totals"]["requests"], 2);
    assert_eq!(doc["models"]["tiny-llama"]["totals"]["prompt_tokens"], 8);
    assert!(doc["models"]["unknown"].is_object());
    let w60: Value = serde_json::from_str(&get(addr, "/stats?window=60s", None).await.2).unwrap();
    assert_eq!(
        w60["windows"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["60s"]
    );
    // The meter started 30 s ago by the wall clock; a second may tick over before this query.
    let secs = w60["windows"]["60s"]["seconds"].as_f64().unwrap();
    assert!(secs == 30.0 || secs == 31.0, "{secs}");
    let gen = w60["windows"]["60s"]["gen_tok_s"].as_f64().unwrap();
    assert!((gen * secs - 16.0).abs() < 1e-9, "{gen}");
    assert_eq!(w60["users"]["bob"]["windows"].as_object().unwrap().len(), 1);
    // Both requests ran over [1 s, 4 s): seconds 1..=3 steady at 2. The seconds since 5 s (N=1)
    // are not final while the request that started at 5 s may still attribute tokens to them.
    let rows = doc["capacity"].as_array().unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| r["in_flight"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [2]
    );
    assert_eq!(rows[0]["gen_tok_s"]["mean"], 16.0 / 3.0);
    assert_eq!(rows[0]["seconds"], 3);
    // The schema is strict: an extra field, a wrong type or a missing field is rejected.
    let mut bad = doc.clone();
    bad["windows"]["10s"]["surprise"] = Value::from(1);
    assert!(!v.is_valid(&bad));
    let mut bad = doc.clone();
    bad["capacity"][0]["gen_tok_s"]["mean"] = Value::Null;
    assert!(!v.is_valid(&bad));
    let mut bad = doc.clone();
    bad["totals"].as_object_mut().unwrap().remove("errors");
    assert!(!v.is_valid(&bad));
}

#[tokio::test]
async fn bad_queries_get_openai_shaped_400s() {
    let addr = serve(busy_meter(), None, Arc::default()).await;
    for (path, param) in [
        ("/stats?window=7s", "window"),
        ("/stats?foo=1", "foo"),
        ("/stats?user=a&user=b", "user"),
    ] {
        let (status, _, body) = get(addr, path, None).await;
        assert_eq!(status, 400, "{path}");
        let doc: Value = serde_json::from_str(&body).unwrap();
        let e = &doc["error"];
        // The proxy's one error vocabulary (vLLM's): error.rs owns it.
        assert_eq!(e["type"], "BadRequestError");
        assert_eq!(e["param"], param);
        assert!(e["message"].as_str().unwrap().len() > 5);
        assert_eq!(e["code"], 400);
    }
}

#[tokio::test]
async fn bearer_token_is_required_when_configured() {
    let addr = serve(busy_meter(), Some("s3cret"), Arc::default()).await;
    for path in ["/stats", "/stats/metrics"] {
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("Bearer "),
            Some("s3cret"),
            Some("Bearer s3cret2"),
        ] {
            let (status, _, body) = get(addr, path, auth).await;
            assert_eq!(status, 401, "{path} {auth:?}");
            let doc: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(doc["error"]["type"], "AuthenticationError");
            assert_eq!(doc["error"]["code"], 401);
        }
        let (status, _, _) = get(addr, path, Some("Bearer s3cret")).await;
        assert_eq!(status, 200, "{path}");
    }
    // The probes hold no secret: a liveness check must not need the token.
    for path in ["/healthz", "/stats/healthz", "/readyz", "/stats/readyz"] {
        let (status, _, body) = get(addr, path, None).await;
        assert_eq!(status, 200, "{path}: {body}");
        let doc: Value = serde_json::from_str(&body).unwrap();
        assert!(
            doc["status"] == "alive" || doc["status"] == "ready",
            "{body}"
        );
    }
}

#[tokio::test]
async fn metrics_endpoint_serves_prometheus_text() {
    let log = Arc::new(AccessLogCounters::default());
    log.dropped.store(3, Ordering::Relaxed);
    log.written.store(5, Ordering::Relaxed);
    log.failed.store(1, Ordering::Relaxed);
    let addr = serve(busy_meter(), None, log).await;
    let (status, head, body) = get(addr, "/stats/metrics", None).await;
    assert_eq!(status, 200);
    assert!(head
        .to_ascii_lowercase()
        .contains("content-type: text/plain; version=0.0.4"));
    assert!(body.contains("tokenmeter_access_log_dropped_total 3\n"));
    assert!(body.contains("tokenmeter_access_log_written_total 5\n"));
    assert!(body.contains("tokenmeter_access_log_failed_total 1\n"));
    assert!(body.contains("tokenmeter_requests_in_flight 1\n"));
    assert!(body.contains(
        "tokenmeter_requests_total{model=\"tiny-llama\",api=\"chat\",outcome=\"ok\",status=\"2xx\"} 2\n"
    ));
    assert!(body.contains(&format!(
        "tokenmeter_build_info{{version=\"{}\"}} 1\n",
        env!("CARGO_PKG_VERSION")
    )));
    // Scraping is off in this context: no scrape counters rather than zeros.
    assert!(!body.contains("tokenmeter_upstream_scrape"));
    #[cfg(target_os = "linux")]
    for name in [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
    ] {
        let v: f64 = body
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} missing"))
            .parse()
            .unwrap();
        // A young test process may not have used a whole 10 ms tick of CPU yet.
        let floor = if name.starts_with("process_cpu") {
            0.0
        } else {
            1.0
        };
        assert!(v >= floor, "{name}{v}");
    }
}

#[tokio::test]
async fn the_dashboard_page_is_self_contained() {
    let addr = serve(busy_meter(), Some("s3cret"), Arc::default()).await;
    // The page holds no data, so it needs no token; its script sends the token to /stats.
    let (status, head, body) = get(addr, "/stats/ui", None).await;
    assert_eq!(status, 200);
    assert!(head
        .to_ascii_lowercase()
        .contains("content-type: text/html"));
    assert!(head
        .to_ascii_lowercase()
        .contains("content-security-policy: default-src 'none'"));
    assert!(body.starts_with("<!doctype html>"), "{}", &body[..40]);
    assert!(body.contains("<script>") && body.contains("</html>"));
    // Nothing loaded from anywhere: no URL with a scheme, no external script, style or image.
    for needle in ["http://", "https://", "src=\"", "<link", "@import", "url("] {
        let allowed = needle == "http://" && body.contains("http://www.w3.org/2000/svg");
        if !allowed {
            assert!(!body.contains(needle), "the page references {needle}");
        }
    }
}

#[test]
fn a_fresh_meter_snapshot_with_nulls_validates() {
    let v = validator();
    let base = 1_795_975_200 * NANOS_PER_SEC;
    let mut m = tokenmeter::meter::Meter::new(MeterConfig::default(), base);
    let doc = serde_json::to_value(m.snapshot(base + 1, &Default::default()).unwrap()).unwrap();
    assert_valid(&v, &doc);
    assert_eq!(doc["windows"]["10s"]["gen_tok_s"], Value::Null);
    assert_eq!(doc["windows"]["10s"]["in_flight"], Value::Null);
    assert_eq!(doc["capacity"], serde_json::json!([]));
}

#[tokio::test]
async fn timeline_lists_each_complete_second() {
    let addr = serve(busy_meter(), None, Arc::default()).await;
    let (status, _, body) = get(addr, "/stats/timeline?seconds=30", None).await;
    assert_eq!(status, 200, "{body}");
    let t: Value = serde_json::from_str(&body).unwrap();
    let col = |k: &str| t[k].as_array().unwrap().clone();
    let gen: Vec<f64> = col("gen_tok_s")
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(gen.len(), 30);
    for k in [
        "in_flight_mean",
        "in_flight_min",
        "in_flight_max",
        "steady",
        "saturation",
    ] {
        assert_eq!(col(k).len(), 30, "{k}");
    }
    // Two requests of 8 tokens: 5 each streamed in second 2, 3 each settled over their decode
    // time [1.5 s, 4 s).
    assert!((gen.iter().sum::<f64>() - 16.0).abs() < 1e-9, "{gen:?}");
    let steady = col("steady");
    let max = col("in_flight_max");
    // The meter's second 1 (the first at level 2; index 1 unless a second rolled over since).
    let one = max.iter().position(|v| v == 2).unwrap();
    assert!(one <= 1, "{max:?}");
    assert!((gen[one + 1] - 12.4).abs() < 1e-9, "{gen:?}");
    assert_eq!(steady[one + 1], true);
    assert_eq!(steady[one + 3], false, "level 0 from 4 s to 5 s");
    assert_eq!(
        (max[one + 9].as_u64(), steady[one + 9].as_bool()),
        (Some(1), Some(true))
    );
    // Up to the current (partial) second; a second may have rolled over since.
    let end = t["from_s"].as_u64().unwrap() + 30;
    assert!((Clock::global().now() / NANOS_PER_SEC).abs_diff(end) <= 1);
    for bad in ["seconds=0", "seconds=x", "secs=5", "seconds=999999"] {
        let (status, _, body) = get(addr, &format!("/stats/timeline?{bad}"), None).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
}
