//! One request's trip: read and identify it, forward it upstream unchanged (but for hop-by-hop
//! headers and the optional usage request), and hand the response back through a metered body.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Limited};

use crate::clock::Clock;
use crate::config::ServeConfig;
use crate::dialect::{Dialect, StreamUsage};
use crate::error::ProxyError;
use crate::fleet::{Load, Upstreams};
use crate::fold::Fold;
use crate::proxy::admission::{admit, Unnoted};
use crate::proxy::as_stream;
use crate::proxy::body::{MeteredBody, Reading};
use crate::proxy::client_body::ClientBody;
use crate::proxy::client_identity::{fill_identity, Client};
use crate::proxy::identity;
use crate::proxy::pool::UpstreamResponse;
use crate::proxy::request::{inject_include_usage, RequestInfo};
use crate::proxy::state::ProxyState;
use crate::proxy::tracker::{RequestMeta, Tracker};
use crate::proxy::upstream_error::classify_client_error;
use crate::proxy::upstream_head::{ProxyFields, UpstreamRequest};
use crate::proxy::ProxyBody;
use crate::record::{Outcome, UserSource};

/// Handles one request; never fails (every error is an HTTP answer). `ambiguous`: the head
/// sniffer found this request's head, or one before it on the connection, carrying both
/// `Content-Length` and `Transfer-Encoding` (`sniff::Verdict`).
pub async fn handle(
    state: Arc<ProxyState>,
    req: Request<ClientBody>,
    remote: SocketAddr,
    ambiguous: bool,
) -> Response<ProxyBody> {
    let t0 = state.trackers.time().now();
    // Neither the body nor anything after it on this connection can be trusted: such a request
    // is refused (and recorded) before any probe, `/stats` route or body read.
    if !ambiguous && crate::health::is_main_probe(req.uri().path()) {
        if let Some((status, body)) = state.health.probe(req.uri().path()) {
            let mut r = Response::new(ProxyBody::Full(Some(Bytes::from(body))));
            *r.status_mut() = status;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            return r;
        }
    }
    if let (Some(router), false) = (&state.stats, ambiguous) {
        let p = req.uri().path();
        if p == "/stats" || p.starts_with("/stats/") {
            // Boxed for the same reason as `forward` below.
            return Box::pin(crate::proxy::stats_response(router.clone(), req)).await;
        }
    }
    let mut request_id = None;
    // Boxed: the request's own state (tracker, head, body, the fold of a request sent as a stream) lives only until
    // the response head is ready, while the connection's task, which would otherwise hold room
    // for it inline, lives as long as the connection (`benches/stream_memory.rs` counts what
    // that costs per open stream).
    let mut resp = Box::pin(forward(&state, req, remote, t0, ambiguous, &mut request_id)).await;
    if let Some(id) = request_id {
        resp.headers_mut()
            .insert(state.request_id_header.clone(), id);
    }
    resp
}

/// A client's request id is kept when it is 1 to 128 visible ASCII characters (what fits a log
/// line and a header unchanged); anything else is replaced by the proxy's own.
fn valid_request_id(v: &HeaderValue) -> Option<&str> {
    let b = v.as_bytes();
    let ok = (1..=128).contains(&b.len()) && b.iter().all(u8::is_ascii_graphic);
    ok.then(|| v.to_str().ok()).flatten()
}

/// Forwards one request; `request_id` receives the id to return to the client in
/// `request_id_header` (the client's own when valid, else the proxy's). An `ambiguous` request
/// (its head carried both `Content-Length` and `Transfer-Encoding`) is refused with a 400 and
/// the connection closed, unread (RFC 9112 §6.3: a server may reject such a message).
async fn forward(
    state: &Arc<ProxyState>,
    req: Request<ClientBody>,
    remote: SocketAddr,
    t0: Instant,
    ambiguous: bool,
    request_id: &mut Option<HeaderValue>,
) -> Response<ProxyBody> {
    let cfg = &state.config;
    // One snapshot per request: a reload in the middle does not change its rules.
    let users = state.users.get();
    let (parts, body) = req.into_parts();
    let client_id = parts
        .headers
        .get(&state.request_id_header)
        .and_then(valid_request_id)
        .map(str::to_string);
    // Borrowed from the URI, which is not changed (only the headers are, below).
    let split = identity::split_user_prefix(parts.uri.path());
    let (path_user, fwd_path) = (split.user, split.path);
    let api = crate::dialect::detect(fwd_path);
    let metered = cfg.metering && api.is_some();
    // Identity, user agent and trace are filled in later (`Tracker::identify`).
    let meta = RequestMeta {
        user: Arc::from(""),
        user_source: UserSource::Ip,
        model: None,
        method: parts.method.as_str().to_owned(),
        path: parts.uri.path().to_string(),
        client_request_id: client_id,
        user_agent: None,
        client_ip: None,
        api,
        stream: None,
        n: None,
        bytes_in: 0,
        trace: None,
        session: None,
    };
    let client_rid = meta.client_request_id.as_deref().map(HeaderValue::from_str);
    let mut tracker = Tracker::start(state.trackers.clone(), t0, meta, metered);
    // Who sent it is read from the head, which the upstream write leaves as it is: once the
    // request is on its way, or before an answer that refuses it.
    let client = Client {
        headers: &parts.headers,
        path_user,
        remote,
        log_client_ip: cfg.access_log_client_ip,
    };
    let identify = |tracker: &mut Tracker| {
        tracker.identify(|meta, body_user| fill_identity(meta, body_user, &users, &client));
    };
    let refuse = |mut tracker: Tracker, err: ProxyError, why: &str| {
        identify(&mut tracker);
        reject(tracker, err, why)
    };
    *request_id = match client_rid {
        Some(v) => v.ok(),
        None => HeaderValue::from_str(tracker.request_id().as_str()).ok(),
    };

    if ambiguous {
        return refuse(
            tracker,
            ProxyError::bad_request(
                "Content-Length together with Transfer-Encoding is not accepted.",
            ),
            "Content-Length together with Transfer-Encoding",
        );
    }
    if !origin_form(&parts.uri) {
        return refuse(
            tracker,
            ProxyError::bad_request(
                "The request target must be a path starting with `/` (origin form).",
            ),
            "request target not in origin form",
        );
    }

    if users.require_known_key {
        let known =
            identity::bearer_key(&parts.headers).and_then(|k| identity::known_key_name(&users, k));
        if known.is_none() {
            return refuse(
                tracker,
                ProxyError::unauthorized(),
                "missing or unknown API key",
            );
        }
    }

    let body = match read_body(body, &parts.headers, cfg).await {
        Ok(b) => b,
        Err((e, why)) => return refuse(tracker, e, why),
    };
    tracker.meta_mut().bytes_in = body.len() as u64;
    let ups = &state.upstreams;
    let several = ups.list().len() > 1;

    let mut upstream_body = body.clone();
    let mut strip_usage = false;
    let mut as_stream: Option<(Box<dyn Fold>, &'static dyn Dialect)> = None;
    // What the body says, recorded once the request is on its way (`admit`).
    let mut unnoted = Unnoted::Nothing;
    if let Some(api) = api {
        let asks = api.dialect().stream_usage() == StreamUsage::IncludeUsageOption;
        let injects =
            metered && asks && cfg.inject_stream_usage && !cfg.upstream_force_include_usage;
        let upgrades = metered && cfg.ttft_for_non_streamed.enabled(api);
        // With several replicas the model picks one; with one, what is sent is the client's body
        // unless usage is injected or the request is upgraded to a stream. Reading an agent's
        // body (tens of KB) costs a real share of the added TTFT (docs/performance.md), so it
        // waits, like the identity, for the first poll of the upstream attempt. The plain case
        // of the injection (a stream that asks nothing of `stream_options`) is told by a scan of
        // the body's top level, and serde reads the body after the write too.
        let scanned = injects && !several && crate::proxy::request_scan::plain_stream(&body);
        let info =
            (!scanned && (injects || upgrades || several)).then(|| RequestInfo::parse(&body));
        let plain = RequestInfo {
            is_json_object: true,
            stream: Some(true),
            ..RequestInfo::default()
        };
        let read = info.as_ref().unwrap_or(&plain);
        if injects && (scanned || read.wants_injection()) {
            if let Some(b) = inject_include_usage(&body, read) {
                upstream_body = b;
                strip_usage = true;
            }
        }
        match info {
            Some(info) => {
                // Streamed requests are never touched (nor their bodies read again).
                if upgrades && info.stream != Some(true) {
                    match api.dialect().as_stream(&body) {
                        Ok(Some(up)) => {
                            upstream_body = up.body;
                            as_stream = Some((up.fold, api.dialect()));
                        }
                        Ok(None) => {}
                        Err(why) => tracker.set_ttft_fallback(why.0),
                    }
                }
                unnoted = Unnoted::Parsed(info);
            }
            None => unnoted = Unnoted::Unread,
        }
    }
    let model: Option<Arc<str>> = match &unnoted {
        Unnoted::Parsed(info) => info.model.as_deref().map(Arc::from),
        _ => None,
    };

    let query = parts.uri.query();
    // `Host` is set per attempt: each replica gets its own authority.
    let fields = ProxyFields::new(
        request_id
            .clone()
            .map(|id| (state.request_id_header.clone(), id)),
        users.upstream_api_key.as_ref().map(|k| k.0.as_str()),
        &parts.headers,
        &users.header,
    );
    // Where the last attempt went: its origin, target, `Host` and replica (a fallback resend
    // goes there).
    let mut last_target: Option<(Uri, String, HeaderValue, usize)>;
    let mut load = ups.pick(model.as_deref(), None, Clock::global().now());
    let mut retried = false;
    let headers_timeout = std::time::Duration::from_millis(cfg.timeouts.upstream_headers_ms);
    // Admission with this request's body and head; `identifying`: not done before.
    let admit_here = |tracker: &mut Tracker, unnoted: &mut Unnoted, identifying: bool| {
        admit(
            tracker,
            unnoted,
            &body,
            &parts.headers,
            metered,
            |t: &mut Tracker| {
                if identifying {
                    identify(t);
                }
            },
        );
    };
    let resp = loop {
        let Some(l) = load.take() else {
            // Only reachable on a retry with no healthy replica left; the first pick always
            // finds one (there is at least one upstream).
            return respond_error(
                tracker,
                ProxyError::bad_gateway("no upstream available"),
                Outcome::ProxyError,
                "no upstream available",
            );
        };
        let index = l.index;
        // A path that makes no URI is the client's; the replica's parts are always valid.
        let Some(target) = l.upstream.target.target(fwd_path, query) else {
            admit_here(&mut tracker, &mut unnoted, true);
            return reject(
                tracker,
                ProxyError::bad_request("The request path is not valid."),
                "invalid path",
            );
        };
        let origin = l.upstream.target.origin().clone();
        let up = fields.request(
            origin.clone(),
            &target,
            &l.upstream.host,
            &parts.method,
            &parts.headers,
            upstream_body.clone(),
        );
        last_target = Some((origin, target, l.upstream.host.clone(), index));
        tracker.route(l);
        let attempt = tokio::time::timeout(headers_timeout, state.pool.request(up));
        let mut attempt = std::pin::pin!(attempt);
        // One poll writes the request on a kept connection; the bookkeeping that shapes nothing
        // sent (identification, telling the observers) runs while the upstream works on it, off
        // the path to the first token. Admitting is idempotent: a retry's attempt skips it.
        let first = std::future::poll_fn(|cx| Poll::Ready(attempt.as_mut().poll(cx))).await;
        // A retry's attempt was identified with the first.
        admit_here(&mut tracker, &mut unnoted, !retried);
        let answered = match first {
            Poll::Ready(r) => r,
            Poll::Pending => attempt.await,
        };
        match answered {
            Ok(Ok(r)) if r.status.is_server_error() => {
                state.health.upstream_answered(index);
                load = failed_attempt(ups, index, model.as_deref(), &mut retried);
                if load.is_some() {
                    continue;
                }
                break r;
            }
            Ok(Ok(r)) => {
                state.health.upstream_answered(index);
                ups.succeeded(index);
                break r;
            }
            Ok(Err(e)) => {
                let (err, outcome, why) = classify_client_error(&e);
                if e.is_connect() {
                    state
                        .health
                        .upstream_failed(index, Clock::global().now(), why);
                }
                load = failed_attempt(ups, index, model.as_deref(), &mut retried);
                if load.is_some() {
                    continue;
                }
                let now = tracker.now();
                tracker.commit_upstream(now);
                return respond_error(tracker, err, outcome, why);
            }
            Err(_) => {
                // A slow head is not a failing replica (a long non-streamed generation sends
                // its head at the end): no ejection, no retry.
                let now = tracker.now();
                tracker.commit_upstream(now);
                return respond_error(
                    tracker,
                    ProxyError::gateway_timeout("no response headers"),
                    Outcome::Timeout,
                    "upstream response headers timeout",
                );
            }
        }
    };
    let now = tracker.now();
    tracker.commit_upstream(now);
    let mut resp = resp;
    if let (Some((mut fold, dialect)), Some((origin, target, host, index))) =
        (as_stream, last_target)
    {
        // vLLM's errors before the stream starts (400, 404 JSON) pass through as they are.
        if resp.status == StatusCode::OK && resp.fields.content_type_starts("text/event-stream") {
            let limits = as_stream::Limits {
                idle: std::time::Duration::from_millis(cfg.timeouts.body_idle_ms),
                max_event_bytes: cfg.max_sse_event_bytes,
                max_held_bytes: cfg.max_response_scan_bytes,
            };
            let UpstreamResponse {
                status,
                fields: sent,
                body: stream,
            } = resp;
            match as_stream::collect(stream, dialect, fold.as_mut(), &mut tracker, &limits).await {
                as_stream::Collected::Answer(answer) => {
                    let (mut rparts, ()) = Response::new(()).into_parts();
                    rparts.status = status;
                    rparts.headers = sent.header_map(http::HeaderMap::new(), None, true);
                    return as_stream::respond(rparts, answer, tracker);
                }
                as_stream::Collected::Failed(err, outcome, why) => {
                    return respond_error(tracker, err, outcome, why)
                }
                as_stream::Collected::Fallback(why) => {
                    // The stream was dropped (vLLM aborts it); ask again as the client asked.
                    tracker.restart_for_fallback(why);
                    let again = fields.request(
                        origin,
                        &target,
                        &host,
                        &parts.method,
                        &parts.headers,
                        body.clone(),
                    );
                    resp = match send(state, again, index).await {
                        Ok(r) => r,
                        Err((err, outcome, why)) => {
                            return respond_error(tracker, err, outcome, why)
                        }
                    };
                }
            }
        }
    }

    let UpstreamResponse {
        status,
        fields: sent,
        body: rbody,
    } = resp;
    tracker.set_status(status.as_u16());
    let reading = match api.filter(|_| metered) {
        None => Reading::Opaque,
        Some(api) => Reading::for_response(api.dialect(), &sent, strip_usage, cfg),
    };
    let idle = std::time::Duration::from_millis(cfg.timeouts.body_idle_ms);
    let metered = MeteredBody::new(rbody, tracker, reading, idle, Some(sent));
    let mut r = Response::new(ProxyBody::Metered(Box::new(metered)));
    *r.status_mut() = status;
    r
}

/// Records a failed attempt on replica `index` (refused, lost before the head, or 5xx: nothing
/// reached the client) and, for a first attempt, picks another replica to retry on.
fn failed_attempt(
    ups: &Upstreams,
    index: usize,
    model: Option<&str>,
    retried: &mut bool,
) -> Option<Load> {
    let now = Clock::global().now();
    ups.failed(index, now);
    if *retried || ups.list().len() < 2 {
        return None;
    }
    let next = ups.pick(model, Some(index), now)?;
    ups.list()[index]
        .counters
        .retried_away
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    *retried = true;
    Some(next)
}

/// Sends `up` to replica `index` and waits for the response headers, within
/// `upstream_headers_ms`.
async fn send(
    state: &ProxyState,
    up: UpstreamRequest,
    index: usize,
) -> Result<UpstreamResponse, (ProxyError, Outcome, &'static str)> {
    let headers_timeout =
        std::time::Duration::from_millis(state.config.timeouts.upstream_headers_ms);
    match tokio::time::timeout(headers_timeout, state.pool.request(up)).await {
        Ok(Ok(r)) => {
            state.health.upstream_answered(index);
            Ok(r)
        }
        Ok(Err(e)) => {
            let classified = classify_client_error(&e);
            if e.is_connect() {
                state
                    .health
                    .upstream_failed(index, Clock::global().now(), classified.2);
            }
            Err(classified)
        }
        Err(_) => Err((
            ProxyError::gateway_timeout("no response headers"),
            Outcome::Timeout,
            "upstream response headers timeout",
        )),
    }
}

/// Whether a request target names a path on this server: origin form (`/path?query`, RFC 9112
/// §3.2.1), or absolute form (§3.2.2, which a server must accept) whose authority is ignored: the
/// replica's own is used. Asterisk form (`*`, §3.2.4) and authority form (§3.2.3) name no path
/// to forward and are refused.
fn origin_form(uri: &Uri) -> bool {
    uri.path().starts_with('/')
}

/// Reads the whole request body within the size and time limits.
async fn read_body(
    body: ClientBody,
    headers: &http::HeaderMap,
    cfg: &ServeConfig,
) -> Result<Bytes, (ProxyError, &'static str)> {
    let limit = cfg.max_request_body_bytes;
    // Read whole by the front: nothing to wait for, and no collecting.
    if let ClientBody::Read(whole) = body {
        let whole = whole.unwrap_or_default();
        if whole.len() as u64 > limit {
            return Err((ProxyError::too_large(limit), "request body over the limit"));
        }
        return Ok(whole);
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err((ProxyError::too_large(limit), "request body over the limit"));
    }
    let timeout = std::time::Duration::from_millis(cfg.timeouts.request_body_ms);
    let limited = Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX));
    match tokio::time::timeout(timeout, limited.collect()).await {
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err((ProxyError::too_large(limit), "request body over the limit"))
        }
        Ok(Err(_)) => Err((
            ProxyError::bad_request("The request body could not be read."),
            "request body unreadable",
        )),
        Err(_) => Err((ProxyError::body_timeout(), "request body timeout")),
    }
}

/// Refuses the request for the client's fault (`client_error`: not an error of the box).
fn reject(tracker: Tracker, err: ProxyError, why: &str) -> Response<ProxyBody> {
    respond_error(tracker, err, Outcome::ClientError, why)
}

fn respond_error(
    mut tracker: Tracker,
    err: ProxyError,
    outcome: Outcome,
    why: &str,
) -> Response<ProxyBody> {
    tracker.set_status(err.status.as_u16());
    // In the shape of the path's API: a Messages client reads Anthropic's envelope.
    let body = err.body_in(crate::dialect::error_shape(&tracker.meta_mut().path));
    tracker.on_sent(body.len());
    let now = tracker.now();
    tracker.finish(outcome, Some(why), now);
    let mut r = Response::new(ProxyBody::Full(Some(body)));
    *r.status_mut() = err.status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if matches!(
        err.status,
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT | StatusCode::BAD_REQUEST
    ) {
        // The unread body may still be arriving: do not try to reuse this connection.
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}
