//! `GET /stats` (JSON) and `GET /stats/metrics` (Prometheus text), optionally behind a bearer token.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use sha2::{Digest, Sha256};

use crate::access_log::AccessLogCounters;
use crate::clock::{Clock, UnixNanos, NANOS_PER_SEC};
use crate::error::{error_body, kind};

use super::live::MeterHandle;
use super::prometheus::render_access_log;
use super::snapshot::{SnapshotError, SnapshotQuery};

/// What the stats endpoints need besides the meter.
#[derive(Debug, Clone)]
pub struct StatsContext {
    /// The upstream base URL, shown in `/stats`.
    pub upstream: String,
    /// When set, requests must carry `Authorization: Bearer <token>`.
    pub bearer_token: Option<String>,
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

struct AppState {
    handle: MeterHandle,
    ctx: StatsContext,
    token_digest: Option<[u8; 32]>,
}

/// The router serving `/stats` and `/stats/metrics`.
pub fn stats_router(handle: MeterHandle, ctx: StatsContext) -> Router {
    let token_digest = ctx
        .bearer_token
        .as_deref()
        .map(|t| Sha256::digest(t.as_bytes()).into());
    let state = Arc::new(AppState {
        handle,
        ctx,
        token_digest,
    });
    Router::new()
        .route("/stats", get(stats))
        .route("/stats/metrics", get(metrics))
        .with_state(state)
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
    let Some(want) = &state.token_digest else {
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
    let now = Clock::global().now();
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
    let now = Clock::global().now();
    let mut text = state.handle.prometheus(now).await;
    if let Some(fleet) = &state.ctx.fleet {
        crate::fleet::render_prometheus(&mut text, &fleet.upstreams, now);
    }
    if let Some(c) = &state.ctx.otlp {
        crate::otlp::render_prometheus(&mut text, c);
    }
    render_access_log(
        &mut text,
        state.ctx.access_log.dropped.load(Ordering::Relaxed),
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
