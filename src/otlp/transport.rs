//! How OTLP exports leave: hyper-util's pooled client (the one the binary uses for all its
//! HTTP off the proxy's hot path), run on a small tokio runtime of the exporters' own, and the
//! counters its requests move. A leaf of `otlp`: it imports nothing from it.
//!
//! The SDK drives export futures outside any tokio runtime (the periodic reader's thread runs
//! them with `futures_executor::block_on`, the span export thread with
//! [`ExportRuntime::block_on`]), so each request is spawned onto [`ExportRuntime`], whose worker
//! also keeps pooled connections serviced between exports; the exporting thread sleeps until
//! the request's task finishes.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::HttpError;

/// Most bytes of a collector's reply that are read. A reply is an `Export*ServiceResponse`
/// (a partial-success count and message); anything longer is not a collector's answer, and
/// is cut off as a failed export rather than buffered.
pub const MAX_REPLY_BYTES: usize = 1 << 20;

/// The bound on one export request (connect, send, the whole reply) at export interval
/// `interval`: the interval, within 100 ms and 10 s.
pub fn request_timeout(interval: Duration) -> Duration {
    interval.clamp(Duration::from_millis(100), Duration::from_secs(10))
}

/// Export counters, shown in `/stats/metrics`.
#[derive(Debug, Default)]
pub struct OtlpCounters {
    /// Records dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Metrics export requests the collector accepted (2xx).
    pub exports_ok: AtomicU64,
    /// Metrics export requests that failed (connection, timeout, non-2xx).
    pub export_failures: AtomicU64,
    /// Records the recording thread has taken into the instruments (not exposed; the bench
    /// waits on it).
    pub recorded: AtomicU64,
    /// Spans exported (in requests the collector accepted).
    pub spans_exported: AtomicU64,
    /// Spans lost: the span queue was full, or their export request failed.
    pub spans_dropped: AtomicU64,
    /// Trace export requests the collector accepted (2xx).
    pub span_exports_ok: AtomicU64,
    /// Trace export requests that failed (connection, timeout, non-2xx).
    pub span_export_failures: AtomicU64,
}

/// Which signal a client carries (which counters its requests move).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// `/v1/metrics`.
    Metrics,
    /// `/v1/traces`.
    Traces,
}

/// The tokio runtime the exporters' HTTP requests run on: one worker thread, shared by the
/// metrics and the trace exporter.
#[derive(Debug)]
pub struct ExportRuntime {
    handle: tokio::runtime::Handle,
    /// Always `Some` until dropped; taken in `drop` to shut it down without waiting.
    runtime: Option<tokio::runtime::Runtime>,
}

impl ExportRuntime {
    /// Starts the runtime's worker thread.
    pub fn start() -> std::io::Result<Arc<ExportRuntime>> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            // Name resolution runs on blocking threads; a resolver that hangs must not gather
            // one thread per export while every export times out.
            .max_blocking_threads(2)
            .thread_name("tokenmeter-otlp-http")
            .enable_all()
            .build()?;
        Ok(Arc::new(ExportRuntime {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
        }))
    }

    /// Runs `f` to completion on the calling thread, which sleeps while `f` waits. Not for
    /// use inside an async context (tokio panics there).
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.handle.block_on(f)
    }
}

impl Drop for ExportRuntime {
    fn drop(&mut self) {
        // The last export has finished by the time the exporters let go of the runtime; a
        // name lookup still stuck on a blocking thread must not hold up shutdown.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// The exporters' HTTP client: hyper-util's pooled client, every address a name resolves to
/// tried in turn, each export request (connect, send, the whole reply) bounded by `timeout`,
/// and the reply read up to [`MAX_REPLY_BYTES`].
#[derive(Debug, Clone)]
pub struct OtlpHttp {
    client: Client<HttpConnector, Full<Bytes>>,
    runtime: Arc<ExportRuntime>,
    timeout: Duration,
    counters: Arc<OtlpCounters>,
    signal: Signal,
}

impl OtlpHttp {
    /// A client whose requests run on `runtime`, each one bounded by `timeout`, counted in
    /// `counters` as `signal`'s.
    pub fn new(
        runtime: &Arc<ExportRuntime>,
        timeout: Duration,
        counters: Arc<OtlpCounters>,
        signal: Signal,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        OtlpHttp {
            client: Client::builder(TokioExecutor::new()).build(connector),
            runtime: runtime.clone(),
            timeout,
            counters,
            signal,
        }
    }

    fn count(&self, ok: bool) {
        count(&self.counters, self.signal, ok);
    }
}

fn count(c: &OtlpCounters, signal: Signal, ok: bool) {
    let counter = match (signal, ok) {
        (Signal::Metrics, true) => &c.exports_ok,
        (Signal::Metrics, false) => &c.export_failures,
        (Signal::Traces, true) => &c.span_exports_ok,
        (Signal::Traces, false) => &c.span_export_failures,
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// One POST and its reply, bounded in time and size. A non-2xx reply is returned as it is
/// (the exporter reports its status).
async fn post(
    client: Client<HttpConnector, Full<Bytes>>,
    request: http::Request<Bytes>,
    timeout: Duration,
) -> Result<http::Response<Bytes>, HttpError> {
    let exchange = async move {
        let resp = client.request(request.map(Full::new)).await?;
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, MAX_REPLY_BYTES).collect().await?;
        Ok::<_, HttpError>(http::Response::from_parts(parts, body.to_bytes()))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("no complete reply within {timeout:?}"))?
}

impl opentelemetry_http::HttpClient for OtlpHttp {
    fn send_bytes<'a, 'b>(
        &'a self,
        request: http::Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<http::Response<Bytes>, HttpError>> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        let (client, timeout, counters, signal) = (
            self.client.clone(),
            self.timeout,
            self.counters.clone(),
            self.signal,
        );
        // Counted in the task, so the outcome is counted even if the caller stops waiting.
        let task = self.runtime.handle.spawn(async move {
            let result = post(client, request, timeout).await;
            count(
                &counters,
                signal,
                matches!(&result, Ok(r) if r.status().is_success()),
            );
            result
        });
        Box::pin(async move {
            match task.await {
                Ok(result) => result,
                Err(e) => {
                    // Cancelled (the runtime shut down) or panicked: the task counted nothing.
                    self.count(false);
                    Err(Box::new(e) as HttpError)
                }
            }
        })
    }
}
