//! Building the `/stats` snapshot from the [`Meter`]: O(scopes x buckets), never O(requests).

use std::collections::BTreeMap;

use crate::clock::{UnixNanos, NANOS_PER_SEC};

use super::engine::Meter;
use super::levels::production_rows;
use super::scope::Scope;
use super::service_level::{service_level_view, ServiceCapacity};
use super::snapshot::{
    AccessLogView, ScopeView, SnapshotError, SnapshotQuery, StatsSnapshot, Windows, STATS_SCHEMA,
};
use super::timeline::second_of;
use super::window::window_stats;

impl Meter {
    /// The `/stats` document at `now`. `upstream` is empty and `access_log` zero: the caller fills them.
    pub fn snapshot(
        &mut self,
        now: UnixNanos,
        query: &SnapshotQuery,
    ) -> Result<StatsSnapshot, SnapshotError> {
        let windows: Vec<(String, u64)> = self
            .config
            .windows_s
            .iter()
            .map(|w| (format!("{w}s"), *w))
            .filter(|(name, _)| query.window.as_ref().is_none_or(|q| q == name))
            .collect();
        if let (Some(q), true) = (&query.window, windows.is_empty()) {
            return Err(SnapshotError::UnknownWindow {
                requested: q.clone(),
                known: self.config.window_names().join(", "),
            });
        }
        self.tick(now);
        let now_sec = second_of(now);
        let floor = self.floor(now_sec);
        // The meter's first (partial) second counts as covered: nothing was in flight before it.
        let earliest = second_of(self.origin).max(floor);
        let tolerance = self.config.steady_tolerance_pct as f64 / 100.0;
        let view = |s: &mut Scope| {
            s.advance(now, floor);
            let ws = windows
                .iter()
                .map(|(name, len)| {
                    let mut w =
                        window_stats(&s.ring, &s.level_time, now_sec, *len, earliest, tolerance);
                    let from = now_sec.saturating_sub(w.seconds) * NANOS_PER_SEC;
                    w.context_tokens = s.contexts.view(from, now_sec * NANOS_PER_SEC);
                    (name.clone(), w)
                })
                .collect();
            let idle_s = if s.in_flight.level() > 0 {
                0.0
            } else {
                now.saturating_sub(s.last_event_ns) as f64 / NANOS_PER_SEC as f64
            };
            ScopeView {
                contexts: s.contexts.view(0, UnixNanos::MAX),
                totals: s.totals,
                windows: Windows(ws),
                in_flight: s.in_flight.level(),
                idle_s,
            }
        };
        let mut agg = view(&mut self.aggregate);
        for (_, w) in agg.windows.0.iter_mut() {
            if let Some(track) = &self.server {
                let from = now_sec.saturating_sub(w.seconds) * NANOS_PER_SEC;
                let to = now_sec * NANOS_PER_SEC;
                w.server = Some(track.window(from, to, &self.aggregate.ring));
            }
            w.saturation = Some(self.saturation_window(now_sec, w.seconds));
        }
        let users: BTreeMap<String, ScopeView> = self
            .users
            .iter_mut()
            .filter(|(k, _)| query.user.as_deref().is_none_or(|u| u == &***k))
            .map(|(k, s)| (k.to_string(), view(s)))
            .collect();
        let models = self
            .models
            .iter_mut()
            .map(|(k, s)| (k.to_string(), view(s)))
            .collect();
        self.levels.advance(now);
        let service_level =
            service_level_view(&self.config.slo, &self.verdicts, self.levels.sums());
        let kv = self.kv_view(service_level.capacity.in_flight);
        Ok(StatsSnapshot {
            schema: STATS_SCHEMA,
            uptime_s: now.saturating_sub(self.origin) as f64 / NANOS_PER_SEC as f64,
            upstream: String::new(),
            in_flight: agg.in_flight,
            totals: agg.totals,
            windows: agg.windows,
            users,
            users_folded: self.users_folded,
            models,
            capacity: self.capacity.rows(),
            capacity_production: {
                self.levels.advance(now);
                let cap = &self.capacity;
                production_rows(self.levels.sums(), self.config.capacity_min_s as f64, |n| {
                    cap.request_figures(n)
                })
            },
            service_level,
            kv,
            sessions: self
                .sessions
                .view(now, super::sessions::TOP_SESSIONS, query.user.as_deref()),
            access_log: AccessLogView::default(),
            server_scrape: None,
            upstreams: Vec::new(),
            meter_events_dropped: 0,
        })
    }
}

impl Meter {
    /// Prometheus exposition of the meter's counters, histograms and gauges at `now` (without
    /// the access-log counter, build and process metrics, which
    /// [`super::self_metrics::render_self`] appends).
    pub fn prometheus(&mut self, now: UnixNanos) -> String {
        self.tick(now);
        let mut out = String::with_capacity(4096);
        self.prom.render(&mut out);
        super::gauges::render(&mut out, self, now);
        out
    }

    /// The capacity at the service level at `now`: the headline `/stats` gives as
    /// `service_level.capacity`, for the gauges.
    pub(super) fn service_capacity(&mut self, now: UnixNanos) -> ServiceCapacity {
        self.levels.advance(now);
        service_level_view(&self.config.slo, &self.verdicts, self.levels.sums()).capacity
    }
}
