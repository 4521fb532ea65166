//! OTLP export against a real OTLP/HTTP receiver started here: a hyper server decoding each
//! `POST /v1/metrics` and `POST /v1/traces` with the official protobuf definitions
//! (opentelemetry-proto). Names, units and the exported token sums must equal the access log's,
//! every span its request's line, trace context continued from `traceparent`; a down collector
//! costs only counts, and so does one whose reply is too long or never ends.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use http_body_util::BodyExt;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use prost::Message;
use tokenmeter::observe::Observer;
use tokenmeter::otlp::{OtlpCounters, OtlpExport};
use tokenmeter::sim::SimConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the receiver decoded: metrics exports and trace exports, in arrival order.
#[derive(Default)]
struct Exports {
    metrics: Vec<ExportMetricsServiceRequest>,
    traces: Vec<ExportTraceServiceRequest>,
}

type Received = Arc<Mutex<Exports>>;

/// An OTLP/HTTP receiver on port 0; every decoded export lands in the returned lists.
async fn receiver() -> (SocketAddr, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got: Received = Arc::default();
    let sink = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let sink = sink.clone();
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let sink = sink.clone();
                        async move {
                            let path = req.uri().path().to_string();
                            let proto = req
                                .headers()
                                .get("content-type")
                                .and_then(|v| v.to_str().ok())
                                == Some("application/x-protobuf");
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let status = match path.as_str() {
                                "/v1/metrics" if proto => {
                                    match ExportMetricsServiceRequest::decode(body) {
                                        Ok(m) => {
                                            sink.lock().unwrap().metrics.push(m);
                                            200
                                        }
                                        Err(_) => 400,
                                    }
                                }
                                "/v1/traces" if proto => {
                                    match ExportTraceServiceRequest::decode(body) {
                                        Ok(t) => {
                                            sink.lock().unwrap().traces.push(t);
                                            200
                                        }
                                        Err(_) => 400,
                                    }
                                }
                                _ => 404,
                            };
                            Ok::<_, std::convert::Infallible>(
                                http::Response::builder()
                                    .status(status)
                                    .header("content-type", "application/x-protobuf")
                                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                                    .unwrap(),
                            )
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, got)
}

async fn sim() -> tokenmeter::sim::SimHandle {
    let cfg = SimConfig {
        log_stats_interval_s: 0.0,
        ..Default::default()
    };
    crate::common::start_sim(cfg).await
}

async fn send(addr: SocketAddr, i: usize) {
    send_with(addr, i, &[]).await;
}

/// Request `i` (every third one not streamed) with extra headers.
async fn send_with(addr: SocketAddr, i: usize, headers: &[(&str, &str)]) {
    let stream = i % 3 != 0;
    let body = format!(
        r#"{{"model":"sim-model","messages":[{{"role":"user","content":"q{i}"}}],"max_tokens":{},"stream":{stream}}}"#,
        5 + i
    );
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&post("/v1/chat/completions", &body, headers))
        .await
        .unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).await.unwrap();
    assert!(out.starts_with(b"HTTP/1.1 200"));
}

fn attr<'a>(
    attrs: &'a [opentelemetry_proto::tonic::common::v1::KeyValue],
    key: &str,
) -> Option<&'a str> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.as_str()),
            _ => None,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn genai_metrics_reach_a_real_receiver_with_the_access_logs_sums() {
    let (otlp, got) = receiver().await;
    let up = sim().await;
    let proxy = TestProxy::start(&format!("http://{}", up.addr()), |c| {
        c.otlp_endpoint = Some(format!("http://{otlp}"));
        c.otlp_export_interval_ms = 200;
    })
    .await;
    for i in 0..12 {
        send(proxy.addr, i).await;
    }
    // Periodic exports arrive while serving: waited for, not slept on.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while got.lock().unwrap().metrics.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no periodic export arrived while serving"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lines = proxy.finish().await;
    let exports = got.lock().unwrap().metrics.clone();
    assert!(
        got.lock().unwrap().traces.is_empty(),
        "no spans without otlp_traces"
    );
    // Cumulative temporality: the last export (at shutdown) carries every request.
    let last = exports.last().unwrap();
    let metrics: Vec<_> = last
        .resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .collect();
    let find = |name: &str| {
        metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    for (name, unit) in [
        ("gen_ai.client.token.usage", "{token}"),
        ("gen_ai.client.operation.duration", "s"),
        ("gen_ai.server.time_to_first_token", "s"),
        ("gen_ai.server.time_per_output_token", "s"),
    ] {
        assert_eq!(find(name).unit, unit, "{name}");
    }
    let Some(Data::Histogram(usage)) = &find("gen_ai.client.token.usage").data else {
        panic!("token usage is a histogram")
    };
    let sum_of = |kind: &str| -> f64 {
        usage
            .data_points
            .iter()
            .filter(|p| attr(&p.attributes, "gen_ai.token.type") == Some(kind))
            .map(|p| {
                assert_eq!(
                    attr(&p.attributes, "gen_ai.request.model"),
                    Some("sim-model")
                );
                assert_eq!(attr(&p.attributes, "gen_ai.operation.name"), Some("chat"));
                p.sum.unwrap()
            })
            .sum()
    };
    let log_sum = |field: &str| -> f64 {
        lines
            .iter()
            .map(|l| l[field].as_u64().unwrap_or(0) as f64)
            .sum()
    };
    assert_eq!(lines.len(), 12);
    assert!(log_sum("completion_tokens") > 0.0);
    assert_eq!(sum_of("output"), log_sum("completion_tokens"));
    assert_eq!(sum_of("input"), log_sum("prompt_tokens"));
    let Some(Data::Histogram(d)) = &find("gen_ai.client.operation.duration").data else {
        panic!()
    };
    let count: u64 = d.data_points.iter().map(|p| p.count).sum();
    let e2e: f64 = lines
        .iter()
        .map(|l| l["e2e_ms"].as_f64().unwrap())
        .sum::<f64>()
        / 1e3;
    let sum: f64 = d.data_points.iter().map(|p| p.sum.unwrap()).sum();
    assert_eq!(count, 12);
    assert!((sum - e2e).abs() < 1e-9, "duration sum {sum} vs log {e2e}");
    let Some(Data::Histogram(t)) = &find("gen_ai.server.time_to_first_token").data else {
        panic!()
    };
    let streamed = lines.iter().filter(|l| l["ttft_ms"].is_number()).count() as u64;
    assert_eq!(t.data_points.iter().map(|p| p.count).sum::<u64>(), streamed);
    up.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_collector_costs_only_counted_failures() {
    // A port with nothing behind it.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let up = sim().await;
    let proxy = TestProxy::start(&format!("http://{}", up.addr()), |c| {
        c.otlp_endpoint = Some(format!("http://{dead}"));
        c.otlp_export_interval_ms = 100;
        c.otlp_traces = true;
    })
    .await;
    for i in 0..6 {
        send(proxy.addr, i).await;
    }
    // Until every span has gone into a failed export (or the guard is up).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let text = loop {
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        c.write_all(b"GET /stats/metrics HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.unwrap();
        let text = String::from_utf8_lossy(&out).into_owned();
        let settled = text
            .lines()
            .any(|l| l == "tokenmeter_otlp_spans_dropped_total 6")
            && !text
                .lines()
                .any(|l| l == "tokenmeter_otlp_export_failures_total 0");
        if settled || tokio::time::Instant::now() >= deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let value = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing: {text}"))
            .parse()
            .unwrap()
    };
    assert!(
        value("tokenmeter_otlp_export_failures_total") >= 1,
        "{text}"
    );
    assert_eq!(value("tokenmeter_otlp_exports_total"), 0);
    assert_eq!(value("tokenmeter_otlp_dropped_total"), 0);
    // Every span went into a failed export: counted as dropped, none exported.
    assert!(
        value("tokenmeter_otlp_span_export_failures_total") >= 1,
        "{text}"
    );
    assert_eq!(value("tokenmeter_otlp_span_exports_total"), 0);
    assert_eq!(value("tokenmeter_otlp_spans_exported_total"), 0);
    assert_eq!(value("tokenmeter_otlp_spans_dropped_total"), 6, "{text}");
    assert_eq!(proxy.finish().await.len(), 6);
    up.shutdown().await;
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A proxy in front of `up` exporting traces (and metrics, every 200 ms) to the receiver at `otlp`.
async fn traced_proxy(up: &tokenmeter::sim::SimHandle, otlp: SocketAddr) -> TestProxy {
    TestProxy::start(&format!("http://{}", up.addr()), |c| {
        c.otlp_endpoint = Some(format!("http://{otlp}"));
        c.otlp_export_interval_ms = 200;
        c.otlp_traces = true;
    })
    .await
}

/// Every span of the received trace exports, each checked to be of tokenmeter's scope.
fn spans_of(
    exports: &[opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest],
) -> Vec<&opentelemetry_proto::tonic::trace::v1::Span> {
    exports
        .iter()
        .flat_map(|e| &e.resource_spans)
        .flat_map(|r| &r.scope_spans)
        .inspect(|s| assert_eq!(s.scope.as_ref().unwrap().name, "tokenmeter"))
        .flat_map(|s| &s.spans)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_span_per_request_with_genai_attributes_ttft_event_and_the_callers_trace() {
    use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
    let (otlp, got) = receiver().await;
    let up = sim().await;
    let proxy = traced_proxy(&up, otlp).await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let sampled = format!("00-{trace_id}-{parent}-01");
    let unsampled = format!("00-{trace_id}-{parent}-00");
    // 0..4 continue the caller's trace, 4 is not sampled by the caller, 5 has a malformed
    // header (a new trace), 6..9 send none.
    for i in 0..9 {
        let tp = match i {
            0..4 => Some(sampled.as_str()),
            4 => Some(unsampled.as_str()),
            5 => Some("00-zz-not-a-trace-01"),
            _ => None,
        };
        let h: Vec<(&str, &str)> = tp.map(|v| ("traceparent", v)).into_iter().collect();
        send_with(proxy.addr, i, &h).await;
    }
    let lines = proxy.finish().await;
    assert_eq!(lines.len(), 9);
    let exports = std::mem::take(&mut got.lock().unwrap().traces);
    let spans = spans_of(&exports);
    assert_eq!(
        spans.len(),
        8,
        "one span per request, none for the unsampled one"
    );
    let mut ids = std::collections::HashSet::new();
    // The requests were sent one after another: line i is request i.
    for (i, line) in lines.iter().enumerate() {
        let rid = line["request_id"].as_str().unwrap();
        let span = spans
            .iter()
            .find(|s| attr(&s.attributes, "tokenmeter.request_id") == Some(rid));
        let Some(span) = span else {
            assert_eq!(
                i, 4,
                "only the request the caller did not sample has no span"
            );
            continue;
        };
        assert_ne!(i, 4, "the caller did not sample request 4");
        assert!(ids.insert(span.span_id.clone()), "span ids differ");
        assert_eq!(span.name, "chat sim-model");
        assert_eq!(span.kind, SpanKind::Client as i32);
        assert_eq!(
            attr(&span.attributes, "gen_ai.operation.name"),
            Some("chat")
        );
        assert_eq!(
            attr(&span.attributes, "gen_ai.request.model"),
            Some("sim-model")
        );
        // Its session: the conversation's fingerprint (the requests name no session).
        assert!(
            line["session"].as_str().unwrap().starts_with("f-"),
            "{line}"
        );
        assert_eq!(
            attr(&span.attributes, "gen_ai.conversation.id"),
            line["session"].as_str()
        );
        let int = |key: &str| {
            span.attributes
                .iter()
                .find(|kv| kv.key == key)
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Value::IntValue(n) => Some(*n),
                    _ => None,
                })
        };
        assert_eq!(
            int("gen_ai.usage.input_tokens"),
            line["prompt_tokens"].as_i64()
        );
        assert_eq!(
            int("gen_ai.usage.output_tokens"),
            line["completion_tokens"].as_i64()
        );
        let reasons: Vec<&str> = span
            .attributes
            .iter()
            .find(|kv| kv.key == "gen_ai.response.finish_reasons")
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                Value::ArrayValue(a) => Some(
                    a.values
                        .iter()
                        .filter_map(|v| match v.value.as_ref()? {
                            Value::StringValue(s) => Some(s.as_str()),
                            _ => None,
                        })
                        .collect(),
                ),
                _ => None,
            })
            .unwrap_or_default();
        let logged: Vec<&str> = line["finish_reason"].as_str().into_iter().collect();
        assert!(
            !logged.is_empty(),
            "the simulator reports a finish reason: {line}"
        );
        assert_eq!(reasons, logged);
        // The span covers the request as the access log times it.
        let ts = line["ts_ns"].as_u64().unwrap();
        let e2e_ns = line["e2e_ms"].as_f64().unwrap() * 1e6;
        assert_eq!(span.start_time_unix_nano, ts);
        assert!(
            ((span.end_time_unix_nano - ts) as f64 - e2e_ns).abs() <= 1.0,
            "{span:?} vs {line}"
        );
        // The TTFT as an event, at arrival + ttft_ms, streamed requests only.
        match line["ttft_ms"].as_f64() {
            Some(ttft) => {
                assert_eq!(span.events.len(), 1);
                let ev = &span.events[0];
                assert_eq!(ev.name, "gen_ai.first_token");
                assert_eq!(ev.time_unix_nano, ts + (ttft * 1e6).round() as u64);
                let Some(Value::DoubleValue(s)) = ev.attributes[0].value.as_ref().unwrap().value
                else {
                    panic!("{ev:?}")
                };
                assert_eq!(ev.attributes[0].key, "gen_ai.server.time_to_first_token");
                assert!((s - ttft / 1e3).abs() < 1e-12);
            }
            None => assert!(span.events.is_empty(), "{span:?}"),
        }
        // The caller's trace is continued: same trace id, its span as the parent.
        if i < 4 {
            assert_eq!(hex(&span.trace_id), trace_id);
            assert_eq!(hex(&span.parent_span_id), parent);
        } else {
            assert_ne!(hex(&span.trace_id), trace_id);
            assert_eq!(span.trace_id.len(), 16);
            assert!(span.parent_span_id.is_empty(), "a new trace has no parent");
        }
    }
    let continued = spans
        .iter()
        .filter(|s| hex(&s.trace_id) == trace_id)
        .count();
    assert_eq!(continued, 4, "requests 0..4 continue the caller's trace");
    up.shutdown().await;
}

/// Each API's span names its own OpenTelemetry GenAI operation (`gen_ai.operation.name`):
/// chat completions, Responses and Messages are `chat`, legacy completions `text_completion`;
/// the operation comes from the API the request was read as, not from its path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_is_exported_with_its_genai_operation() {
    let (otlp, got) = receiver().await;
    let up = sim().await;
    let proxy = traced_proxy(&up, otlp).await;
    let requests = [
        (
            "/v1/chat/completions",
            r#"{"model":"sim-model","messages":[{"role":"user","content":"q"}],"max_tokens":5,"stream":true}"#,
            "chat",
            "chat",
        ),
        (
            "/v1/completions",
            r#"{"model":"sim-model","prompt":"q","max_tokens":5,"stream":true}"#,
            "completions",
            "text_completion",
        ),
        (
            "/v1/responses",
            r#"{"model":"sim-model","input":"q","max_output_tokens":5,"stream":true}"#,
            "responses",
            "chat",
        ),
        (
            "/v1/messages",
            r#"{"model":"sim-model","messages":[{"role":"user","content":"q"}],"max_tokens":5,"stream":true}"#,
            "messages",
            "chat",
        ),
    ];
    for (path, body, _, _) in requests {
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        c.write_all(&post(path, body, &[])).await.unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.unwrap();
        assert!(
            out.starts_with(b"HTTP/1.1 200"),
            "{path}: {}",
            String::from_utf8_lossy(&out)
        );
    }
    let lines = proxy.finish().await;
    assert_eq!(lines.len(), requests.len());
    let exports = std::mem::take(&mut got.lock().unwrap().traces);
    let spans = spans_of(&exports);
    assert_eq!(spans.len(), requests.len());
    for (line, (path, _, api, operation)) in lines.iter().zip(requests) {
        assert_eq!(line["api"], api, "{path}");
        let rid = line["request_id"].as_str().unwrap();
        let span = spans
            .iter()
            .find(|s| attr(&s.attributes, "tokenmeter.request_id") == Some(rid))
            .unwrap_or_else(|| panic!("no span for {path}"));
        assert_eq!(
            attr(&span.attributes, "gen_ai.operation.name"),
            Some(operation),
            "{path}"
        );
        assert_eq!(span.name, format!("{operation} sim-model"), "{path}");
    }
    up.shutdown().await;
}

/// A collector that accepts and never answers (export timeout 10 s at the default interval)
/// cannot hold up shutdown past the bounded wait every join at shutdown gets (2 s), and the
/// access log is still closed complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_does_not_hold_up_shutdown() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    // Holds every connection open and reads nothing back.
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let up = sim().await;
    let proxy = TestProxy::start(&format!("http://{}", up.addr()), |c| {
        c.otlp_endpoint = Some(format!("http://{silent_addr}"));
        c.otlp_export_interval_ms = 10_000;
        c.otlp_traces = true;
    })
    .await;
    for i in 0..3 {
        send(proxy.addr, i).await;
    }
    let t = std::time::Instant::now();
    let lines = proxy.finish().await;
    let took = t.elapsed();
    assert_eq!(lines.len(), 3);
    assert!(took < Duration::from_secs(4), "shutdown took {took:?}");
    holder.abort();
    up.shutdown().await;
}

/// How [`misbehaving_collector`] answers each export request, once it has read it.
#[derive(Clone, Copy)]
enum Reply {
    /// 200 with a `content-length` of this many bytes, sent as fast as the client takes them.
    Huge(usize),
    /// 200, chunked, one byte every 10 ms for as long as the client reads.
    Trickle,
}

/// A collector on port 0 answering every export request with `reply`. Returns its address,
/// the connections it accepted, and for each connection, once it ended, the reply body bytes
/// it got out.
async fn misbehaving_collector(
    reply: Reply,
) -> (
    SocketAddr,
    Arc<AtomicUsize>,
    tokio::sync::mpsc::UnboundedReceiver<usize>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let tx = tx.clone();
            tokio::spawn(async move {
                // The request: its head, then content-length bytes of body.
                let mut buf = Vec::new();
                let mut tmp = [0u8; 16 * 1024];
                loop {
                    let k = s.read(&mut tmp).await.unwrap_or(0);
                    if k == 0 {
                        let _ = tx.send(0);
                        return;
                    }
                    buf.extend_from_slice(&tmp[..k]);
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
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
                let mut sent = 0;
                match reply {
                    Reply::Huge(len) => {
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: {len}\r\n\r\n"
                        );
                        let block = vec![0u8; 64 * 1024];
                        if s.write_all(head.as_bytes()).await.is_ok() {
                            while sent < len {
                                let n = block.len().min(len - sent);
                                if s.write_all(&block[..n]).await.is_err() {
                                    break;
                                }
                                sent += n;
                            }
                        }
                    }
                    Reply::Trickle => {
                        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ntransfer-encoding: chunked\r\n\r\n";
                        if s.write_all(head.as_bytes()).await.is_ok() {
                            while s.write_all(b"1\r\n0\r\n").await.is_ok() {
                                sent += 1;
                                // The collector's pace, not a wait for anything.
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                    }
                }
                let _ = tx.send(sent);
            });
        }
    });
    (addr, accepted, rx)
}

/// Metrics and spans of five requests exported to a collector answering with `reply`, at a
/// 1 s interval (so a 1 s bound on each export request); then the exporter is shut down,
/// which exports both once more and waits for it. Returns the counters, and the reply body
/// bytes each connection got out before it ended.
async fn export_to(reply: Reply) -> (Arc<OtlpCounters>, Vec<usize>) {
    let (addr, accepted, mut ended) = misbehaving_collector(reply).await;
    let export =
        OtlpExport::start(&format!("http://{addr}"), Duration::from_secs(1), true).unwrap();
    let counters = export.counters().clone();
    for i in 0..5 {
        let r = tokenmeter::analyze::synth::record(
            tokenmeter::analyze::synth::T0 + i * 1_000_000,
            100.0,
            Some(10.0),
            4,
            true,
            "u",
        );
        export.finished(i, 0, &Arc::new(r), true);
    }
    // Shutdown blocks this thread until the last exports are done: it runs on a thread of its
    // own, so one that never returns fails the test instead of hanging it.
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        export.shutdown();
        let _ = done_tx.send(());
    });
    tokio::time::timeout(Duration::from_secs(20), done_rx)
        .await
        .expect("the exporter shut down: every export request ended within its bound")
        .unwrap();
    // Every connection is over once the exporter is gone.
    let mut sent = Vec::new();
    for _ in 0..accepted.load(Ordering::SeqCst) {
        let n = tokio::time::timeout(Duration::from_secs(20), ended.recv())
            .await
            .expect("the client hung up")
            .unwrap();
        sent.push(n);
    }
    (counters, sent)
}

/// A reply longer than the client's bound is cut off, not buffered whole, and costs a counted
/// failure like any failed export (the spans in it count as dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_past_the_bound_is_cut_off_and_counted_failed() {
    const LEN: usize = 32 << 20;
    let (c, sent) = export_to(Reply::Huge(LEN)).await;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    assert_eq!(get(&c.exports_ok), 0);
    assert!(get(&c.export_failures) >= 1);
    assert_eq!(get(&c.span_exports_ok), 0);
    assert!(get(&c.span_export_failures) >= 1);
    assert_eq!(get(&c.spans_exported), 0);
    assert_eq!(get(&c.spans_dropped), 5);
    assert_eq!(get(&c.recorded), 5);
    assert!(sent.len() >= 2, "a metrics and a trace export: {sent:?}");
    for n in &sent {
        assert!(*n < LEN, "the client stopped reading: {sent:?}");
    }
}

/// A reply that never ends, a byte at a time (each read gets something, so no per-read
/// timeout fires), costs a counted failure once the request's bound is up, and does not hold
/// up shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_never_ends_is_a_counted_failure_within_the_bound() {
    let (c, sent) = export_to(Reply::Trickle).await;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    assert_eq!(get(&c.exports_ok), 0);
    assert!(get(&c.export_failures) >= 1);
    assert_eq!(get(&c.span_exports_ok), 0);
    assert!(get(&c.span_export_failures) >= 1);
    assert_eq!(get(&c.spans_exported), 0);
    assert_eq!(get(&c.spans_dropped), 5);
    assert!(sent.len() >= 2, "a metrics and a trace export: {sent:?}");
}
