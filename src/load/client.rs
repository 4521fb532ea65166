//! One HTTP client for the run and one timed chat-completion request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::api::{self, Api};
use super::event::error_text;
use super::result::{finish, Partial, RequestResult};
use super::session::{Heard, Session};
use crate::dialect::KeyHeader;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Largest non-streamed response body read (error bodies, non-streaming completions, JSON GETs).
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Turns a user-given URL into the server base: `http://host:port[/prefix]`, without a trailing
/// `/` or `/v1`, so `http://h:8000`, `http://h:8000/`, `http://h:8000/v1` and `http://h:8000/v1/`
/// all name the same server; request paths (`/v1/chat/completions`, `/stats`) are appended to it.
pub fn normalize_base_url(url: &str) -> anyhow::Result<String> {
    let url = url.trim();
    if !url.starts_with("http://") {
        anyhow::bail!("--url must start with http:// (TLS is not supported): {url:?}");
    }
    let mut base = url.trim_end_matches('/');
    if let Some(stripped) = base.strip_suffix("/v1") {
        base = stripped.trim_end_matches('/');
    }
    if base.len() <= "http://".len() {
        anyhow::bail!("--url has no host: {url:?}");
    }
    let uri: http::Uri = base
        .parse()
        .map_err(|e| anyhow::anyhow!("bad --url {url:?}: {e}"))?;
    if uri.host().is_none_or(str::is_empty) {
        anyhow::bail!("--url has no host: {url:?}");
    }
    Ok(base.to_owned())
}

/// What one generation request asks for (in the API of `api`).
#[derive(Debug, Clone)]
pub struct ChatSpec {
    /// The API spoken (route, body, event reading).
    pub api: Api,
    /// `model` of the body.
    pub model: String,
    /// The single user message.
    pub prompt: String,
    /// `max_tokens` of the body.
    pub max_tokens: u32,
    /// `stream` (with `stream_options.include_usage`).
    pub stream: bool,
    /// Adds vLLM's `"ignore_eos": true`.
    pub ignore_eos: bool,
}

/// Keep-alive HTTP/1.1 client bound to one server base.
#[derive(Clone)]
pub struct HttpClient {
    inner: Client<HttpConnector, Full<Bytes>>,
    base: String,
    api_key: Option<String>,
    user: Option<String>,
    timeout: Duration,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The API key is deliberately left out.
        f.debug_struct("HttpClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    /// A client for `base` (already normalized); `timeout` bounds each request end to end.
    pub fn new(
        base: String,
        api_key: Option<String>,
        user: Option<String>,
        timeout: Duration,
    ) -> Self {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        let inner = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(conn);
        Self {
            inner,
            base,
            api_key,
            user,
            timeout,
        }
    }

    /// The same client (and connection pool) sending `user` instead.
    pub fn with_user(&self, user: Option<String>) -> Self {
        Self {
            user,
            ..self.clone()
        }
    }

    /// The server base this client talks to.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn request(&self, method: http::Method, path: &str) -> http::request::Builder {
        self.request_as(method, path, Api::Chat)
    }

    /// A request carrying the key the way clients of `api` send it.
    fn request_as(&self, method: http::Method, path: &str, api: Api) -> http::request::Builder {
        let mut b = http::Request::builder()
            .method(method)
            .uri(format!("{}{}", self.base, path));
        let key = api::key_header(api);
        if let KeyHeader::XApiKey { version } = key {
            b = b.header("anthropic-version", version);
        }
        match (&self.api_key, key) {
            (Some(k), KeyHeader::XApiKey { .. }) => b = b.header("x-api-key", k.as_str()),
            (Some(k), KeyHeader::Bearer) => {
                b = b.header(http::header::AUTHORIZATION, format!("Bearer {k}"));
            }
            (None, _) => {}
        }
        if let Some(user) = &self.user {
            b = b.header("x-tokenmeter-user", user.as_str());
        }
        b
    }

    /// GET `path`; the status and the body parsed as JSON (None when it is not JSON).
    pub async fn get_json(&self, path: &str) -> anyhow::Result<(u16, Option<serde_json::Value>)> {
        let req = self
            .request(http::Method::GET, path)
            .body(Full::new(Bytes::new()))?;
        let fut = async {
            let resp = self.inner.request(req).await?;
            let status = resp.status().as_u16();
            let body = read_limited(resp.into_body()).await?;
            anyhow::Ok((status, serde_json::from_slice(&body).ok()))
        };
        tokio::time::timeout(self.timeout.min(Duration::from_secs(30)), fut)
            .await
            .map_err(|_| anyhow::anyhow!("GET {path}: timed out"))?
    }

    /// The first model id of `GET /v1/models`.
    pub async fn first_model(&self) -> anyhow::Result<String> {
        let (status, body) = self.get_json("/v1/models").await?;
        if status != 200 {
            anyhow::bail!("GET /v1/models answered {status}; pass --model");
        }
        body.as_ref()
            .and_then(|b| {
                b.get("data")?
                    .get(0)?
                    .get("id")?
                    .as_str()
                    .map(str::to_owned)
            })
            .ok_or_else(|| anyhow::anyhow!("GET /v1/models listed no model id; pass --model"))
    }

    /// Sends one generation request in `spec.api` and times it; never fails, failures are in the
    /// result. `live_events` is bumped for every streamed output event (progress display).
    pub async fn chat(
        &self,
        slot: usize,
        spec: &ChatSpec,
        live_events: &AtomicU64,
    ) -> RequestResult {
        let mut p = Partial::default();
        let body = api::body(
            spec.api,
            &spec.model,
            &spec.prompt,
            spec.max_tokens,
            spec.stream,
            spec.ignore_eos,
            self.user.as_deref(),
        );
        let req = self
            .request_as(http::Method::POST, api::path(spec.api), spec.api)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)));
        let start = Instant::now();
        let outcome = match req {
            Ok(req) => {
                let fut = self.exchange(req, spec, start, &mut p, live_events, None);
                match tokio::time::timeout(self.timeout, fut).await {
                    Ok(r) => r,
                    Err(_) => Err(format!("timed out after {:?}", self.timeout)),
                }
            }
            Err(e) => Err(format!("building request: {e}")),
        };
        let e2e = start.elapsed();
        finish(slot, p, outcome, e2e)
    }

    /// Sends the next call of `session` (its path, headers and whole conversation; `spec` gives
    /// the model, limit and streaming) and times it like [`HttpClient::chat`]; also returns what
    /// the answer said that the session needs (its text, the cached tokens it reported).
    pub async fn converse(
        &self,
        slot: usize,
        spec: &ChatSpec,
        session: &Session,
        live_events: &AtomicU64,
    ) -> (RequestResult, Heard) {
        let mut p = Partial::default();
        let mut heard = Heard::default();
        let body = session.body(&spec.model, spec.max_tokens, spec.stream, spec.ignore_eos);
        let mut b = self
            .request_as(http::Method::POST, &session.path(), spec.api)
            .header(http::header::CONTENT_TYPE, "application/json");
        for (k, v) in session.headers() {
            b = b.header(k, v);
        }
        let start = Instant::now();
        let outcome = match b.body(Full::new(Bytes::from(body))) {
            Ok(req) => {
                let fut = self.exchange(req, spec, start, &mut p, live_events, Some(&mut heard));
                match tokio::time::timeout(self.timeout, fut).await {
                    Ok(r) => r,
                    Err(_) => Err(format!("timed out after {:?}", self.timeout)),
                }
            }
            Err(e) => Err(format!("building request: {e}")),
        };
        let e2e = start.elapsed();
        (finish(slot, p, outcome, e2e), heard)
    }

    async fn exchange(
        &self,
        req: http::Request<Full<Bytes>>,
        spec: &ChatSpec,
        start: Instant,
        p: &mut Partial,
        live_events: &AtomicU64,
        mut heard: Option<&mut Heard>,
    ) -> Result<(), String> {
        let resp = self.inner.request(req).await.map_err(|e| error_chain(&e))?;
        let status = resp.status();
        p.status = Some(status.as_u16());
        // A server that ignores `stream` answers one JSON document; read it as such.
        let json_reply = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        let mut body = resp.into_body();
        if !status.is_success() || !spec.stream || json_reply {
            let bytes = read_limited(body).await.map_err(|e| format!("{e:#}"))?;
            let json: Option<serde_json::Value> = serde_json::from_slice(&bytes).ok();
            if !status.is_success() {
                return Err(match json {
                    Some(v) => error_text(&v),
                    None => String::from_utf8_lossy(&bytes).into_owned(),
                });
            }
            p.usage = api::body_usage(spec.api, &bytes);
            if let Some(h) = heard {
                *h = Heard::body(spec.api, &bytes);
            }
            return Ok(());
        }
        p.sse = true;
        let mut scanner = crate::sse::SseScanner::new(MAX_EVENT_BYTES);
        let mut on_event = |data: &[u8]| {
            let ev = api::read_event(spec.api, data);
            if ev.ttft && p.ttft.is_none() {
                p.ttft = Some(start.elapsed());
            }
            if ev.output > 0 {
                p.content_events += u64::from(ev.output);
                live_events.fetch_add(u64::from(ev.output), Ordering::Relaxed);
            }
            ev.merge_into(&mut p.usage);
            if let Some(msg) = ev.error {
                p.error.get_or_insert(msg);
            }
            if let Some(h) = heard.as_deref_mut() {
                h.event(spec.api, data);
            }
        };
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("reading stream: {}", error_chain(&e)))?;
            if let Some(data) = frame.data_ref() {
                scanner.feed(data, |ev| {
                    if !ev.oversize {
                        on_event(ev.data);
                    }
                });
            }
        }
        Ok(())
    }
}

/// Largest single event read; larger ones are skipped (a stream's events are a few hundred bytes).
const MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

/// An error and its sources, `outer: inner: …` (hyper's own message alone is too terse).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    // Bounded: a cyclic source chain cannot hang the report.
    for _ in 0..8 {
        let Some(s) = source else { break };
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

async fn read_limited(body: hyper::body::Incoming) -> anyhow::Result<Bytes> {
    let limited = http_body_util::Limited::new(body, MAX_BODY_BYTES);
    let collected = limited
        .collect()
        .await
        .map_err(|e| anyhow::anyhow!("reading body: {e}"))?;
    Ok(collected.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_forms_normalize_alike() {
        for u in [
            "http://h:8000",
            "http://h:8000/",
            "http://h:8000/v1",
            "http://h:8000/v1/",
        ] {
            assert_eq!(normalize_base_url(u).unwrap(), "http://h:8000");
        }
        assert_eq!(
            normalize_base_url("http://h/api/v1").unwrap(),
            "http://h/api"
        );
        assert!(normalize_base_url("https://h").is_err());
        assert!(normalize_base_url("h:8000").is_err());
        assert!(normalize_base_url("http://").is_err());
    }
}
