//! The scrape task: its own tokio task and HTTP client, one GET of vLLM's `/metrics` per
//! interval, bounded by a timeout shorter than the interval. It never touches the data path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde::Serialize;

use crate::clock::{format_rfc3339_micros, Clock};

use super::prom_text::{extract, parse};
use super::sample::ServerSample;

/// Largest `/metrics` body read (a real vLLM exposition is about 60 KB).
pub const MAX_METRICS_BYTES: usize = 8 * 1024 * 1024;
/// Shortest time between two warnings about failing scrapes.
pub const WARN_EVERY: Duration = Duration::from_secs(60);

/// Where and how often to scrape.
#[derive(Debug, Clone)]
pub struct ScrapeConfig {
    /// The `/metrics` URL (http).
    pub url: http::Uri,
    /// Time between scrape starts.
    pub interval: Duration,
    /// Longest a scrape may take (shorter than `interval`), then it counts as an error.
    pub timeout: Duration,
}

impl ScrapeConfig {
    /// A config scraping `url` every `interval_s` seconds with a timeout of half the interval,
    /// at most 5 s.
    pub fn new(url: http::Uri, interval_s: f64) -> Self {
        let interval = Duration::from_secs_f64(interval_s.max(0.05));
        ScrapeConfig {
            url,
            interval,
            timeout: (interval / 2).min(Duration::from_secs(5)),
        }
    }
}

/// Scrape counters shared with `/stats`.
#[derive(Debug, Default)]
pub struct ScrapeCounters {
    /// Successful scrapes.
    pub ok: AtomicU64,
    /// Failed scrapes (connection error, timeout, non-200 status, no `vllm:` series).
    pub errors: AtomicU64,
    /// Unix nanoseconds of the last successful sample, 0 before the first.
    pub last_ok_ns: AtomicU64,
    /// The last failure's cause (written by the scrape task only, every interval at most).
    pub last_error: Mutex<Option<String>>,
}

/// The `server_scrape` object of `/stats`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScrapeStatus {
    /// The scraped URL.
    pub url: String,
    /// Seconds between scrapes.
    pub interval_s: f64,
    /// Scrape timeout, ms.
    pub timeout_ms: u64,
    /// Successful scrapes since start.
    pub ok: u64,
    /// Failed scrapes since start.
    pub errors: u64,
    /// Time of the last successful sample (RFC 3339), `null` before the first.
    pub last_ok: Option<String>,
    /// Cause of the last failure, `null` if none failed.
    pub last_error: Option<String>,
}

impl ScrapeStatus {
    /// Reads the counters of a scraper configured with `cfg`.
    pub fn read(cfg: &ScrapeConfig, c: &ScrapeCounters) -> Self {
        let last = c.last_ok_ns.load(Ordering::Relaxed);
        ScrapeStatus {
            url: cfg.url.to_string(),
            interval_s: cfg.interval.as_secs_f64(),
            timeout_ms: cfg.timeout.as_millis() as u64,
            ok: c.ok.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            last_ok: (last > 0).then(|| format_rfc3339_micros(last)),
            last_error: c.last_error.lock().ok().and_then(|e| e.clone()),
        }
    }
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// One scrape: GET, status 200, body read within the size cap, parsed.
pub async fn scrape_once(
    client: &HttpClient,
    url: &http::Uri,
) -> Result<super::VllmValues, String> {
    let resp = client.get(url.clone()).await.map_err(|e| e.to_string())?;
    if resp.status() != http::StatusCode::OK {
        return Err(format!("status {}", resp.status().as_u16()));
    }
    let body = Limited::new(resp.into_body(), MAX_METRICS_BYTES)
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let text = parse(&String::from_utf8_lossy(&body));
    let values = extract(&text);
    if values == super::VllmValues::default() {
        return Err("no vllm: series in the response".into());
    }
    Ok(values)
}

/// Somewhere a scraped sample goes (the meter, the access log): the caller wires them, so this
/// module knows neither.
pub type SampleSink = Box<dyn Fn(&ServerSample) + Send + Sync>;

/// Starts the scrape task: each sample is stamped with `in_flight()` (the proxy's generation
/// requests in flight at scrape time) and handed to every sink in turn. Abort the returned
/// handle to stop it.
pub fn spawn_scraper(
    cfg: ScrapeConfig,
    in_flight: impl Fn() -> u64 + Send + 'static,
    sinks: Vec<SampleSink>,
    counters: Arc<ScrapeCounters>,
) -> tokio::task::JoinHandle<()> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(cfg.timeout));
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(cfg.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_warn: Option<Instant> = None;
        loop {
            tick.tick().await;
            let proxy_in_flight = Some(in_flight());
            let sent = Clock::global().now();
            let started = Instant::now();
            let result = tokio::time::timeout(cfg.timeout, scrape_once(&client, &cfg.url))
                .await
                .unwrap_or_else(|_| Err(format!("timed out after {:?}", cfg.timeout)));
            let done = Clock::global().now();
            match result {
                Ok(values) => {
                    let sample = ServerSample {
                        ts_ns: sent + (done.saturating_sub(sent)) / 2,
                        values,
                        proxy_in_flight,
                        scrape_ms: started.elapsed().as_secs_f64() * 1e3,
                    };
                    counters.ok.fetch_add(1, Ordering::Relaxed);
                    counters.last_ok_ns.store(sample.ts_ns, Ordering::Relaxed);
                    for sink in &sinks {
                        sink(&sample);
                    }
                }
                Err(e) => {
                    let n = counters.errors.fetch_add(1, Ordering::Relaxed) + 1;
                    if last_warn.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                        last_warn = Some(Instant::now());
                        tracing::warn!(url = %cfg.url, error = %e, errors_so_far = n, "scraping vLLM /metrics failed; the cross-check has no new sample");
                    }
                    if let Ok(mut slot) = counters.last_error.lock() {
                        *slot = Some(e);
                    }
                }
            }
        }
    })
}
