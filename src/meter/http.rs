//! `GET /stats` (JSON), `GET /stats/metrics` (Prometheus text) and `GET /stats/ui` (the live
//! dashboard page), optionally behind a bearer token; on `admin_listen` also `/` (the page) and
//! `/metrics`; and the proxy's own health probes, never behind it (a liveness probe holds no secret).

use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use sha2::{Digest, Sha256};

use crate::access_log::AccessLogCounters;
use crate::clock::{TimeSource, UnixNanos, NANOS_PER_SEC};
use crate::error::{error_body, kind};
use crate::health::Health;

use super::live::MeterHandle;
use super::process::ProcessStats;
use super::self_metrics::{render_self, SelfMetrics};
use super::snapshot::{AccessLogView, SnapshotError, SnapshotQuery};

/// What the stats endpoints need besides the meter.
#[derive(Debug, Clone)]
pub struct StatsContext {
    /// The upstream base URL, shown in `/stats`.
    pub upstream: String,
    /// When set, requests must carry `Authorization: Bearer <token>`.
    pub bearer_token: StatsToken,
    /// Liveness and readiness, for `/healthz` and `/readyz`.
    pub health: Arc<Health>,
    /// The access-log writer's counters.
    pub access_log: Arc<AccessLogCounters>,
    /// Process start, for `uptime_s`.
    pub started: UnixNanos,
    /// The upstream `/metrics` scraper's settings and counters, when scraping is on.
    pub scrape: Option<(
        crate::scrape::ScrapeConfig,
        Arc<crate::scrape::ScrapeCounters>,
    )>,
    /// The upstream replicas, for the per-upstream entries and metrics; `None` leaves
    /// `upstreams` empty.
    pub fleet: Option<FleetStats>,
    /// The OTLP exporter's counters, when export is on.
    pub otlp: Option<Arc<crate::otlp::OtlpCounters>>,
    /// The clock the queries' "now" is read on: the proxy's measuring clock, so a test on a
    /// manual clock sees windows on the same timeline as its requests.
    pub time: TimeSource,
}

/// What the per-upstream part of `/stats` reads.
#[derive(Debug, Clone)]
pub struct FleetStats {
    /// The replicas and their routing state.
    pub upstreams: Arc<crate::fleet::Upstreams>,
    /// One meter per replica, in order; empty with a single replica (the aggregate is its).
    pub meters: Vec<MeterHandle>,
    /// Each replica's scraper settings and counters, when scraped.
    pub scrape: Vec<
        Option<(
            crate::scrape::ScrapeConfig,
            Arc<crate::scrape::ScrapeCounters>,
        )>,
    >,
}

/// The per-upstream entries of `/stats` at `now`, next to the aggregate `snap`.
async fn upstream_views(
    fleet: &FleetStats,
    snap: &super::snapshot::StatsSnapshot,
    now: UnixNanos,
    window: Option<String>,
) -> Result<Vec<super::snapshot::UpstreamView>, SnapshotError> {
    let mut out = Vec::new();
    for (i, routing) in fleet.upstreams.routing_views(now).into_iter().enumerate() {
        let (in_flight, totals, windows, capacity) = match fleet.meters.get(i) {
            Some(m) => {
                let q = SnapshotQuery {
                    user: None,
                    window: window.clone(),
                };
                let s = m
                    .snapshot(now, q, &routing.url, &Default::default())
                    .await?;
                (s.in_flight, s.totals, s.windows, s.capacity)
            }
            None => (
                snap.in_flight,
                snap.totals,
                snap.windows.clone(),
                snap.capacity.clone(),
            ),
        };
        let server_scrape = fleet
            .scrape
            .get(i)
            .and_then(|s| s.as_ref())
            .map(|(cfg, c)| crate::scrape::ScrapeStatus::read(cfg, c));
        out.push(super::snapshot::UpstreamView {
            routing,
            in_flight,
            totals,
            windows,
            capacity,
            server_scrape,
        });
    }
    Ok(out)
}

/// The stats bearer token, kept as its SHA-256 digest; replaceable while serving (SIGHUP).
#[derive(Debug, Clone, Default)]
pub struct StatsToken(Arc<RwLock<Option<[u8; 32]>>>);

impl StatsToken {
    /// A token, or none (the endpoints are then open).
    pub fn new(token: Option<&str>) -> StatsToken {
        let t = StatsToken::default();
        t.set(token);
        t
    }

    /// Replaces the token; requests already checked are not affected.
    pub fn set(&self, token: Option<&str>) {
        let digest = token.map(|t| Sha256::digest(t.as_bytes()).into());
        match self.0.write() {
            Ok(mut g) => *g = digest,
            Err(poisoned) => *poisoned.into_inner() = digest,
        }
    }

    fn digest(&self) -> Option<[u8; 32]> {
        match self.0.read() {
            Ok(g) => *g,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }
}

struct AppState {
    handle: MeterHandle,
    ctx: StatsContext,
}

impl AppState {
    fn new(handle: MeterHandle, ctx: StatsContext) -> Self {
        AppState { handle, ctx }
    }
}

/// The router serving `/stats`, `/stats/metrics` and `/stats/ui` (on the main listener, where
/// every other path belongs to vLLM).
pub fn stats_router(handle: MeterHandle, ctx: StatsContext) -> Router {
    stats_routes().with_state(Arc::new(AppState::new(handle, ctx)))
}

/// The stats routes plus `/` (the dashboard) and `/metrics`, for `admin_listen`, where no path
/// belongs to vLLM.
pub fn admin_router(handle: MeterHandle, ctx: StatsContext) -> Router {
    stats_routes()
        .route("/", get(super::ui::page))
        .route("/metrics", get(metrics))
        .with_state(Arc::new(AppState::new(handle, ctx)))
}

fn stats_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/stats", get(stats))
        .route("/stats/metrics", get(metrics))
        .route("/stats/ui", get(super::ui::page))
        .route("/stats/timeline", get(timeline))
        .route("/healthz", get(probe))
        .route("/stats/healthz", get(probe))
        .route("/readyz", get(probe))
        .route("/stats/readyz", get(probe))
        // The stats API's own errors in its one shape, as its handlers answer theirs (axum's
        // defaults are empty bodies).
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

/// 404 for a path the stats API does not have.
async fn not_found(uri: Uri) -> Response {
    let msg = format!(
        "no such stats endpoint: {}; see /stats, /stats/metrics, /stats/timeline, /stats/ui",
        uri.path()
    );
    error(StatusCode::NOT_FOUND, &msg, kind::NOT_FOUND, None)
}

/// 405 for a method other than GET (every stats endpoint is read-only).
async fn method_not_allowed(method: axum::http::Method, uri: Uri) -> Response {
    let msg = format!("{method} is not allowed on {}; use GET", uri.path());
    let mut r = error(
        StatusCode::METHOD_NOT_ALLOWED,
        &msg,
        kind::METHOD_NOT_ALLOWED,
        None,
    );
    r.headers_mut().insert(
        header::ALLOW,
        axum::http::HeaderValue::from_static("GET, HEAD"),
    );
    r
}

/// Liveness (200 whenever the process answers, whatever the upstream does) and readiness (200,
/// or 503 with the reasons).
async fn probe(State(state): State<Arc<AppState>>, uri: Uri) -> Response {
    match state.ctx.health.probe(uri.path()) {
        Some((status, body)) => {
            (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        None => not_found(uri).await,
    }
}

/// An error answer in the proxy's one vocabulary ([`crate::error`]).
fn error(status: StatusCode, message: &str, kind: &str, param: Option<&str>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        error_body(status, kind, message, param),
    )
        .into_response()
}

/// Checks the bearer token, comparing SHA-256 digests in constant time (the length of the
/// presented token does not shorten the comparison either).
fn authorized(state: &AppState, headers: &HeaderMap) -> bool {
    let Some(want) = &state.ctx.bearer_token.digest() else {
        return true;
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let got: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
    let diff = got
        .iter()
        .zip(want.iter())
        .fold(0u8, |d, (a, b)| d | (a ^ b));
    diff == 0 && !presented.is_empty()
}

fn unauthorized() -> Response {
    error(
        StatusCode::UNAUTHORIZED,
        "missing or invalid bearer token for the stats endpoints",
        kind::AUTHENTICATION,
        None,
    )
}

/// Parses `?user=&window=`; the error is (message, offending parameter).
fn parse_query(uri: &Uri) -> Result<SnapshotQuery, (String, Option<String>)> {
    let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri)
        .map_err(|e| (format!("malformed query string: {e}"), None))?;
    let mut q = SnapshotQuery::default();
    for (k, v) in pairs {
        let slot = match k.as_str() {
            "user" => &mut q.user,
            "window" => &mut q.window,
            _ => {
                let msg = format!("unknown query parameter {k:?}; expected user, window");
                return Err((msg, Some(k)));
            }
        };
        if slot.replace(v).is_some() {
            return Err((format!("query parameter {k:?} given twice"), Some(k)));
        }
    }
    Ok(q)
}

async fn stats(State(state): State<Arc<AppState>>, headers: HeaderMap, uri: Uri) -> Response {
    if !authorized(&state, &headers) {
        return unauthorized();
    }
    let query = match parse_query(&uri) {
        Ok(q) => q,
        Err((msg, param)) => {
            let k = kind::BAD_REQUEST;
            return error(StatusCode::BAD_REQUEST, &msg, k, param.as_deref());
        }
    };
    let now = state.ctx.time.unix_now();
    let ctx = &state.ctx;
    let window = query.window.clone();
    let mut result = state
        .handle
        .snapshot(now, query, &ctx.upstream, &ctx.access_log)
        .await;
    if let (Ok(snap), Some(fleet)) = (&mut result, &ctx.fleet) {
        match upstream_views(fleet, snap, now, window).await {
            Ok(v) => snap.upstreams = v,
            Err(e) => result = Err(e),
        }
    }
    match result {
        Ok(mut snap) => {
            snap.uptime_s = now.saturating_sub(ctx.started) as f64 / NANOS_PER_SEC as f64;
            snap.server_scrape = ctx
                .scrape
                .as_ref()
                .map(|(cfg, c)| crate::scrape::ScrapeStatus::read(cfg, c));
            Json(snap).into_response()
        }
        Err(e @ SnapshotError::UnknownWindow { .. }) => error(
            StatusCode::BAD_REQUEST,
            &e.to_string(),
            kind::BAD_REQUEST,
            Some("window"),
        ),
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            &e.to_string(),
            kind::SERVICE_UNAVAILABLE,
            None,
        ),
    }
}

async fn metrics(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return unauthorized();
    }
    let now = state.ctx.time.unix_now();
    let mut text = state.handle.prometheus(now).await;
    let ctx = &state.ctx;
    if let Some(fleet) = &ctx.fleet {
        crate::fleet::render_prometheus(&mut text, &fleet.upstreams, now);
    }
    if let Some(c) = &ctx.otlp {
        crate::otlp::render_prometheus(&mut text, c);
    }
    let started_s = ctx.started as f64 / NANOS_PER_SEC as f64;
    render_self(
        &mut text,
        &SelfMetrics {
            access_log: AccessLogView::read(&ctx.access_log),
            scrapes: ctx.scrape.as_ref().map(|(_, c)| {
                (
                    c.ok.load(Ordering::Relaxed),
                    c.errors.load(Ordering::Relaxed),
                )
            }),
            process: ProcessStats::read(started_s),
        },
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `GET /stats/timeline?seconds=N` (default 300): the aggregate's last complete seconds.
async fn timeline(State(state): State<Arc<AppState>>, headers: HeaderMap, uri: Uri) -> Response {
    if !authorized(&state, &headers) {
        return unauthorized();
    }
    let bad = |msg: String, param: Option<&str>| {
        error(StatusCode::BAD_REQUEST, &msg, kind::BAD_REQUEST, param)
    };
    let pairs = match Query::<Vec<(String, String)>>::try_from_uri(&uri) {
        Ok(Query(p)) => p,
        Err(e) => return bad(format!("malformed query string: {e}"), None),
    };
    let mut seconds = 300;
    for (k, v) in pairs {
        match (k.as_str(), v.parse::<u64>()) {
            ("seconds", Ok(n)) if (1..=super::config::MAX_HORIZON_S).contains(&n) => seconds = n,
            ("seconds", _) => {
                let msg = format!(
                    "seconds must be 1..={}, got {v:?}",
                    super::config::MAX_HORIZON_S
                );
                return bad(msg, Some("seconds"));
            }
            _ => {
                return bad(
                    format!("unknown query parameter {k:?}; expected seconds"),
                    Some(&k),
                )
            }
        }
    }
    match state
        .handle
        .timeline(state.ctx.time.unix_now(), seconds)
        .await
    {
        Ok(t) => Json(t).into_response(),
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            &e.to_string(),
            kind::SERVICE_UNAVAILABLE,
            None,
        ),
    }
}
