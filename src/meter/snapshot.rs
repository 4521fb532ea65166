//! The `/stats` document.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use crate::access_log::AccessLogCounters;

use super::capacity::CapacityRow;
use super::levels::ProductionRow;
use super::scope::Totals;
use super::window::WindowStats;

/// Version of the `/stats` document (see `schemas/stats.schema.json`).
pub const STATS_SCHEMA: u32 = 1;

/// Filters of a snapshot (`/stats?user=NAME&window=60s`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotQuery {
    /// Only this user in `users` (an unknown, expired or folded user gives an empty `users`).
    pub user: Option<String>,
    /// Only this window (e.g. `"60s"`) everywhere; it must be a configured window.
    pub window: Option<String>,
}

/// Why a snapshot could not be produced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// The requested window is not configured.
    #[error("unknown window {requested:?}; configured windows: {known}")]
    UnknownWindow {
        /// What was asked for.
        requested: String,
        /// The configured names, comma-separated.
        known: String,
    },
    /// The meter task is gone (shutting down).
    #[error("the meter is not running")]
    Stopped,
}

/// Windows by name (`"10s"`, ...), serialized as an object in configured order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Windows(pub Vec<(String, WindowStats)>);

impl Serialize for Windows {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl Windows {
    /// The window called `name`.
    pub fn get(&self, name: &str) -> Option<&WindowStats> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }
}

/// One user's or model's view.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScopeView {
    /// Counts since the scope (re)appeared in the live view.
    pub totals: Totals,
    /// Its windows.
    pub windows: Windows,
    /// In-flight level of this scope now.
    pub in_flight: u32,
    /// Seconds since its last start or finish; 0 while it has requests in flight.
    pub idle_s: f64,
    /// Contexts of its requests that finished within the horizon, and the largest it reached.
    pub contexts: super::kv::ContextView,
}

/// The access-log writer's counters at snapshot time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AccessLogView {
    /// Lines written.
    pub written: u64,
    /// Records dropped (channel full or writer gone).
    pub dropped: u64,
    /// Records lost to write errors.
    pub failed: u64,
}

impl AccessLogView {
    /// Reads the writer's counters.
    pub fn read(c: &AccessLogCounters) -> Self {
        AccessLogView {
            written: c.written.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
        }
    }
}

/// The whole `/stats` document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatsSnapshot {
    /// Document version, [`STATS_SCHEMA`].
    pub schema: u32,
    /// Seconds since the meter started.
    pub uptime_s: f64,
    /// The upstream base URL (filled by the caller).
    pub upstream: String,
    /// Generation requests in flight now.
    pub in_flight: u32,
    /// Counts since the meter started, all users.
    pub totals: Totals,
    /// Aggregate windows.
    pub windows: Windows,
    /// Per-user views, by name; `"other"` holds users beyond the tracking cap.
    pub users: BTreeMap<String, ScopeView>,
    /// Requests counted under `"other"` because the user cap was reached (since start).
    pub users_folded: u64,
    /// Per-model views, by name (`"unknown"` without a model, `"other"` beyond the model cap).
    pub models: BTreeMap<String, ScopeView>,
    /// The capacity curve since start, over final steady seconds: a second becomes final once
    /// no open request started at or before it (so none can still attribute tokens to it), or
    /// when it leaves the horizon. The curve therefore lags by the age of the oldest open request.
    pub capacity: Vec<CapacityRow>,
    /// The capacity curve from production traffic since start: all the clean time at each level
    /// (guards after arrivals excluded), final segments only (the same lag as `capacity`).
    pub capacity_production: Vec<ProductionRow>,
    /// Capacity at the service level (`[slo]`): the headline, attainment and goodput per level
    /// of the production-traffic curve, and the fitted decode-step model.
    pub service_level: super::service_level::ServiceLevelView,
    /// KV-cache figures: contexts, the live table, the live estimate and the headroom
    /// (`docs/kv-cache.md`).
    pub kv: super::kv::KvView,
    /// Agent sessions: active, seen, the top ones by time waited on the model
    /// (docs/sessions.md).
    pub sessions: super::sessions::SessionsView,
    /// Access-log counters (filled by the caller).
    pub access_log: AccessLogView,
    /// The scraper of the upstream's `/metrics` (filled by the caller); `null` when scraping
    /// is off.
    pub server_scrape: Option<crate::scrape::ScrapeStatus>,
    /// Measurement events (starts, tokens, finishes) the meter's full queue refused since start
    /// (filled by the caller): non-zero means the figures above undercount.
    pub meter_events_dropped: u64,
    /// One entry per upstream replica, in configured order (filled by the caller).
    pub upstreams: Vec<UpstreamView>,
}

/// One upstream replica's part of `/stats`: how the balancer sees it, and its own windows,
/// capacity curve and cross-check (with a single upstream, the aggregate's).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UpstreamView {
    /// Routing state and counters.
    #[serde(flatten)]
    pub routing: crate::fleet::RoutingView,
    /// Generation requests in flight at this replica, as its meter counts them (from the
    /// response head on).
    pub in_flight: u32,
    /// Counts since start of requests answered by this replica.
    pub totals: Totals,
    /// Its windows (with `server` from its own `/metrics` when scraped).
    pub windows: Windows,
    /// Its capacity curve.
    pub capacity: Vec<CapacityRow>,
    /// Its `/metrics` scraper; `null` when scraping is off.
    pub server_scrape: Option<crate::scrape::ScrapeStatus>,
}
