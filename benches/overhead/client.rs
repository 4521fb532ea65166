//! The load client: keep-alive hyper connections, streamed completions, stamps read off every event.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One keep-alive connection pool.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client with its own pool (one per arm, so every arm's connections stay warm).
pub fn client() -> HttpClient {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .pool_idle_timeout(Duration::from_secs(300))
        .build(c)
}

/// CLOCK_MONOTONIC in nanoseconds: the simulator's `tm_sent_ns` uses the same clock.
pub fn mono_ns() -> u64 {
    tokenmeter::clock::monotonic_ns()
}

/// What every request of a run looks like (`--shape`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `POST /v1/completions` with `include_usage` already set: every arm carries exactly the
    /// same bytes (no injection edit).
    Completions,
    /// `POST /v1/chat/completions` with `Authorization: Bearer` and no `stream_options`: tokenmeter
    /// injects `include_usage` upstream and strips the usage event again, as in production.
    ChatBearer,
}

impl Shape {
    /// Parses `completions` or `chat-bearer`.
    pub fn parse(s: &str) -> anyhow::Result<Shape> {
        match s {
            "completions" => Ok(Shape::Completions),
            "chat-bearer" => Ok(Shape::ChatBearer),
            _ => anyhow::bail!("--shape is completions or chat-bearer, not {s:?}"),
        }
    }

    /// The name used in the JSON and tables.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Completions => "completions",
            Shape::ChatBearer => "chat-bearer",
        }
    }
}

static SHAPE: std::sync::OnceLock<Shape> = std::sync::OnceLock::new();

/// Sets the request shape for the whole run (once, before any request).
pub fn set_shape(s: Shape) {
    let _ = SHAPE.set(s);
}

fn shape() -> Shape {
    *SHAPE.get().unwrap_or(&Shape::Completions)
}

fn request(addr: SocketAddr, max_tokens: u64) -> hyper::Request<Full<Bytes>> {
    match shape() {
        Shape::Completions => {
            let body = format!(
                "{{\"model\":\"sim-model\",\"prompt\":\"hello\",\"max_tokens\":{max_tokens},\"stream\":true,\"stream_options\":{{\"include_usage\":true}}}}"
            );
            hyper::Request::post(format!("http://{addr}/v1/completions"))
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
                .expect("static request parts are valid")
        }
        Shape::ChatBearer => {
            let body = format!(
                "{{\"model\":\"sim-model\",\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}],\"max_tokens\":{max_tokens},\"stream\":true}}"
            );
            hyper::Request::post(format!("http://{addr}/v1/chat/completions"))
                .header("content-type", "application/json")
                .header("authorization", "Bearer sk-overhead-bench-0123456789")
                .body(Full::new(Bytes::from(body)))
                .expect("static request parts are valid")
        }
    }
}

/// What one streamed request saw.
#[derive(Default)]
pub struct StreamResult {
    /// Status 200 and the stream ended with `data: [DONE]`.
    pub ok: bool,
    /// Request sent → first stamped event received, ns.
    pub ttft_ns: Option<u64>,
    /// Per stamped event: receive time − `tm_sent_ns`, ns (both CLOCK_MONOTONIC).
    pub delays_ns: Vec<i64>,
}

const KEY: &[u8] = b"\"tm_sent_ns\":";

fn stamps(data: &[u8], now: u64, out: &mut Vec<i64>) -> usize {
    let mut n = 0;
    let mut i = 0;
    while let Some(p) = data[i..].windows(KEY.len()).position(|w| w == KEY) {
        let start = i + p + KEY.len();
        let digits = data[start..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let v = std::str::from_utf8(&data[start..start + digits])
            .ok()
            .and_then(|s| s.parse::<u64>().ok());
        if let Some(sent) = v {
            out.push(now as i64 - sent as i64);
            n += 1;
        }
        i = start + digits;
    }
    n
}

/// Sends one streamed completion of `max_tokens` events and reads it to the end (bounded by `limit`).
pub async fn stream(
    c: &HttpClient,
    addr: SocketAddr,
    max_tokens: u64,
    limit: Duration,
) -> StreamResult {
    let mut r = StreamResult {
        delays_ns: Vec::with_capacity(max_tokens as usize + 2),
        ..Default::default()
    };
    let t0 = mono_ns();
    let run = async {
        let resp = c.request(request(addr, max_tokens)).await.ok()?;
        if resp.status() != 200 {
            return None;
        }
        let mut body = resp.into_body();
        let mut tail: Vec<u8> = Vec::new();
        while let Some(f) = body.frame().await {
            let f = f.ok()?;
            let Some(d) = f.data_ref() else { continue };
            let now = mono_ns();
            if stamps(d, now, &mut r.delays_ns) > 0 && r.ttft_ns.is_none() {
                r.ttft_ns = Some(now - t0);
            }
            tail.extend_from_slice(d);
            if tail.len() > 64 {
                tail.drain(..tail.len() - 64);
            }
        }
        Some(tail.ends_with(b"data: [DONE]\n\n"))
    };
    r.ok = matches!(tokio::time::timeout(limit, run).await, Ok(Some(true)));
    r
}

/// Opens a long stream, counts it in `opened` at its first event, waits for `release`, then proves the
/// stream still flows by reading one more event. True when all of that happened within `limit`.
pub async fn hold(
    c: HttpClient,
    addr: SocketAddr,
    max_tokens: u64,
    opened: Arc<AtomicUsize>,
    mut release: tokio::sync::watch::Receiver<bool>,
    limit: Duration,
) -> bool {
    let run = async {
        let resp = c.request(request(addr, max_tokens)).await.ok()?;
        if resp.status() != 200 {
            return None;
        }
        let mut body = resp.into_body();
        loop {
            if body.frame().await?.ok()?.is_data() {
                break;
            }
        }
        opened.fetch_add(1, Ordering::SeqCst);
        release.wait_for(|r| *r).await.ok()?;
        loop {
            if body.frame().await?.ok()?.is_data() {
                return Some(());
            }
        }
    };
    matches!(tokio::time::timeout(limit, run).await, Ok(Some(())))
}

/// Checks stamp parsing on a known body; run at every harness start (benches have no test harness).
pub fn self_check() {
    {
        let mut v = Vec::new();
        let d =
            b"data: {\"a\":1,\"tm_sent_ns\":100}\n\ndata: {\"tm_sent_ns\":250}\n\ndata: [DONE]\n\n";
        assert_eq!(stamps(d, 1000, &mut v), 2);
        assert_eq!(v, vec![900, 750]);
    }
}
