//! How OTLP exports leave: a small blocking HTTP/1.1 client run on the exporters' own threads
//! (outside any tokio runtime), the counters it keeps, and the executor that drives the SDK's
//! export futures there. A leaf of `otlp`: it imports nothing from it.

use std::future::Future;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;

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

/// The exporters' HTTP client: one blocking HTTP/1.1 POST per export, on the caller's thread.
#[derive(Debug)]
pub struct BlockingHttp {
    /// Connect, read and write timeout of one export request.
    pub timeout: Duration,
    /// Where the outcome of each request is counted.
    pub counters: Arc<OtlpCounters>,
    /// The signal it carries.
    pub signal: Signal,
}

impl BlockingHttp {
    fn post(&self, req: &http::Request<Bytes>) -> std::io::Result<http::Response<Bytes>> {
        let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, m.to_string());
        let uri = req.uri();
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        let port = authority.port_u16().unwrap_or(80);
        let addr = (authority.host(), port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| bad("host did not resolve"))?;
        let mut s = TcpStream::connect_timeout(&addr, self.timeout)?;
        s.set_read_timeout(Some(self.timeout))?;
        s.set_write_timeout(Some(self.timeout))?;
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let mut head = format!(
            "POST {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-length: {}\r\nconnection: close\r\n",
            req.body().len()
        );
        for (k, v) in req.headers() {
            if let Ok(v) = v.to_str() {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes())?;
        s.write_all(req.body())?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        let status: u16 = std::str::from_utf8(&raw[..raw.len().min(64)])
            .ok()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| bad("no status line"))?;
        let body = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(Bytes::new(), |i| Bytes::copy_from_slice(&raw[i + 4..]));
        let mut resp = http::Response::new(body);
        *resp.status_mut() =
            http::StatusCode::from_u16(status).map_err(|_| bad("bad status code"))?;
        Ok(resp)
    }
}

impl opentelemetry_http::HttpClient for BlockingHttp {
    fn send_bytes<'a, 'b>(
        &'a self,
        request: http::Request<Bytes>,
    ) -> Pin<
        Box<
            dyn Future<Output = Result<http::Response<Bytes>, opentelemetry_http::HttpError>>
                + Send
                + 'b,
        >,
    >
    where
        'a: 'b,
        Self: 'b,
    {
        let result = self.post(&request);
        let ok = matches!(&result, Ok(r) if r.status().is_success());
        let c = &self.counters;
        let counter = match (self.signal, ok) {
            (Signal::Metrics, true) => &c.exports_ok,
            (Signal::Metrics, false) => &c.export_failures,
            (Signal::Traces, true) => &c.span_exports_ok,
            (Signal::Traces, false) => &c.span_export_failures,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Box::pin(async move { result.map_err(|e| Box::new(e) as opentelemetry_http::HttpError) })
    }
}

/// Runs `f` to completion on this thread. The export futures only wait on [`BlockingHttp`],
/// which has finished its work before it returns, so the first poll normally completes them;
/// a future that is still pending is polled again every millisecond.
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
