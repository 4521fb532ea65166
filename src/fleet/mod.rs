//! Several upstream replicas behind one proxy: which replica takes a request (by model, then
//! least in flight, ties round-robin), passive health (ejection with a growing backoff), and the
//! per-replica counters behind `/stats` and the `upstream` metric label.
//!
//! This module holds routing state only (atomics and one read-mostly lock per replica, touched
//! once per request, never per chunk); the proxy owns the per-replica meters.

pub(crate) mod metrics;
pub(crate) mod models;
pub mod settings;

pub use metrics::render_prometheus;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use http::HeaderValue;
use serde::Serialize;

use crate::clock::{UnixNanos, NANOS_PER_SEC};
use crate::record::Outcome;
use settings::{ResolvedUpstream, RoutingConfig};

/// Counters of one replica since start.
#[derive(Debug, Default)]
pub struct UpstreamCounters {
    /// Finished requests routed here, by outcome (in [`Outcome::ALL`] order).
    pub outcomes: [AtomicU64; Outcome::ALL.len()],
    /// Sum of `completion_tokens` of finished requests routed here.
    pub completion_tokens: AtomicU64,
    /// Sum of `prompt_tokens` of finished requests routed here.
    pub prompt_tokens: AtomicU64,
    /// Attempts here that failed (refused connection, connection lost before the response
    /// head, or a 5xx status).
    pub failures: AtomicU64,
    /// Requests moved away from here to another replica after a failed attempt.
    pub retried_away: AtomicU64,
    /// Times this replica was ejected.
    pub ejections: AtomicU64,
}

/// One replica: where it is, its load, health and models.
#[derive(Debug)]
pub struct Upstream {
    /// Its configured name.
    pub name: Arc<str>,
    /// Its configured URL, as written.
    pub url: String,
    /// `http[s]://host:port[/base]`, no trailing slash.
    pub base: String,
    /// Where requests to this replica go, in parts: a client's request target only ever adds a
    /// path and query below it.
    pub target: UpstreamTarget,
    /// Its authority, sent as `Host`.
    pub host: HeaderValue,
    /// Requests routed here and not finished (the balancer's load figure).
    in_flight: AtomicU64,
    /// Failed attempts in a row (reset by a success).
    failures_in_row: AtomicU32,
    /// Unix nanoseconds until which it is ejected (0 = never ejected).
    ejected_until: AtomicU64,
    /// Model ids from its `/v1/models`; `None` until read once.
    models: RwLock<Option<Arc<HashSet<String>>>>,
    /// Counters since start.
    pub counters: UpstreamCounters,
}

/// A replica's scheme, authority and base path, parsed once from its configured URL. A request
/// goes to this origin whatever its target says: the target (the base path, then the client's
/// origin-form path and query) is only the request line's, so no request can change the host,
/// port or scheme connected to.
#[derive(Debug, Clone)]
pub struct UpstreamTarget {
    /// The scheme and authority, path `/`: what the connection goes to.
    origin: http::Uri,
    /// The configured URL's path without its trailing slash (`""` for none).
    base_path: String,
}

impl UpstreamTarget {
    /// The parts of `base` (`http[s]://host:port[/base]`, validated with the config).
    pub fn parse(base: &str) -> anyhow::Result<UpstreamTarget> {
        let uri: http::Uri = base.parse()?;
        let parts = uri.into_parts();
        let (Some(scheme), Some(authority)) = (parts.scheme, parts.authority) else {
            anyhow::bail!("upstream `{base}` has no scheme or host");
        };
        let base_path = parts
            .path_and_query
            .map(|pq| pq.path().trim_end_matches('/').to_string())
            .unwrap_or_default();
        let origin = http::Uri::builder()
            .scheme(scheme)
            .authority(authority)
            .path_and_query("/")
            .build()?;
        Ok(UpstreamTarget { origin, base_path })
    }

    /// The replica's scheme and authority (path `/`): where its connections go.
    pub fn origin(&self) -> &http::Uri {
        &self.origin
    }

    /// The request target of a request for `path` and `query` on this replica; `None` when
    /// `path` is not origin form or the target would hold a space, a control or DEL, which end
    /// or break a request line (RFC 9112 §3). The parts come from URIs parsed before, which hold
    /// none: the check guards the joining.
    pub fn target(&self, path: &str, query: Option<&str>) -> Option<String> {
        if !path.starts_with('/') {
            return None;
        }
        let q = query.map_or(0, |q| q.len() + 1);
        let mut target = String::with_capacity(self.base_path.len() + path.len() + q);
        target.push_str(&self.base_path);
        target.push_str(path);
        if let Some(q) = query {
            target.push('?');
            target.push_str(q);
        }
        target
            .bytes()
            .all(|b| b > b' ' && b != 0x7f)
            .then_some(target)
    }
}

impl Upstream {
    /// Requests routed here and not finished.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Whether it is ejected at `now`.
    pub fn ejected_at(&self, now: UnixNanos) -> bool {
        self.ejected_until.load(Ordering::Relaxed) > now
    }

    /// The models it last listed, sorted; `None` before its `/v1/models` was read.
    pub fn models(&self) -> Option<Vec<String>> {
        let g = self.models.read().ok()?;
        let mut v: Vec<String> = g.as_ref()?.iter().cloned().collect();
        v.sort();
        Some(v)
    }

    /// Replaces its model list.
    pub fn set_models(&self, ids: HashSet<String>) {
        if let Ok(mut g) = self.models.write() {
            *g = Some(Arc::new(ids));
        }
    }

    /// Whether it lists `model` (`None` when its list is not known).
    fn serves(&self, model: &str) -> Option<bool> {
        let g = self.models.read().ok()?;
        g.as_ref().map(|m| m.contains(model))
    }

    /// Counts a finished request routed here.
    pub fn count_finished(&self, outcome: Outcome, prompt: Option<u64>, completion: Option<u64>) {
        if let Some(i) = Outcome::ALL.iter().position(|o| *o == outcome) {
            self.counters.outcomes[i].fetch_add(1, Ordering::Relaxed);
        }
        let c = &self.counters;
        c.prompt_tokens
            .fetch_add(prompt.unwrap_or(0), Ordering::Relaxed);
        c.completion_tokens
            .fetch_add(completion.unwrap_or(0), Ordering::Relaxed);
    }
}

/// A request's hold on a replica's in-flight count; released when dropped.
#[derive(Debug)]
pub struct Load {
    /// The replica's index in [`Upstreams::list`].
    pub index: usize,
    /// The replica.
    pub upstream: Arc<Upstream>,
}

impl Drop for Load {
    fn drop(&mut self) {
        self.upstream.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The replicas and the balancer's state.
#[derive(Debug)]
pub struct Upstreams {
    list: Vec<Arc<Upstream>>,
    /// Where the next tie-breaking scan starts.
    next: AtomicUsize,
    eject_base_ns: u64,
    eject_max_ns: u64,
}

impl Upstreams {
    /// The replicas of a validated config.
    pub fn new(resolved: &[ResolvedUpstream], routing: &RoutingConfig) -> anyhow::Result<Self> {
        let list = resolved
            .iter()
            .map(|u| {
                Ok(Arc::new(Upstream {
                    name: Arc::from(u.name.as_str()),
                    url: u.url.clone(),
                    base: u.base.clone(),
                    target: UpstreamTarget::parse(&u.base)?,
                    host: HeaderValue::from_str(&u.authority)?,
                    in_flight: AtomicU64::new(0),
                    failures_in_row: AtomicU32::new(0),
                    ejected_until: AtomicU64::new(0),
                    models: RwLock::new(None),
                    counters: UpstreamCounters::default(),
                }))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        anyhow::ensure!(!list.is_empty(), "no upstream configured");
        Ok(Upstreams {
            list,
            next: AtomicUsize::new(0),
            eject_base_ns: routing.eject_base_ms.saturating_mul(1_000_000),
            eject_max_ns: routing.eject_max_ms.saturating_mul(1_000_000),
        })
    }

    /// The replicas, in configured order.
    pub fn list(&self) -> &[Arc<Upstream>] {
        &self.list
    }

    /// Chooses a replica for `model` at `now`, never `exclude`, and takes a hold on its load.
    ///
    /// Candidates are the replicas listing `model` and those whose list is not read yet; when
    /// no replica lists it (or the request names none), all replicas. Ejected ones are skipped; when every candidate is ejected, a first attempt
    /// (`exclude` = `None`) still goes to one of them (the client gets that replica's real
    /// answer) while a retry finds none. Among candidates the one with the fewest requests in
    /// flight wins; equal counts are broken round-robin.
    pub fn pick(
        &self,
        model: Option<&str>,
        exclude: Option<usize>,
        now: UnixNanos,
    ) -> Option<Load> {
        let n = self.list.len();
        let allowed = |i: usize| Some(i) != exclude;
        let serves = |i: usize| model.and_then(|m| self.list[i].serves(m));
        let any_serving = (0..n).any(|i| allowed(i) && serves(i) == Some(true));
        let candidate = |i: usize| allowed(i) && (!any_serving || serves(i) != Some(false));
        let any_healthy = (0..n).any(|i| candidate(i) && !self.list[i].ejected_at(now));
        if !any_healthy && exclude.is_some() {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut best: Option<(usize, u64)> = None;
        for k in 0..n {
            let i = (start + k) % n;
            if !candidate(i) || (any_healthy && self.list[i].ejected_at(now)) {
                continue;
            }
            let load = self.list[i].in_flight();
            if best.is_none_or(|(_, b)| load < b) {
                best = Some((i, load));
            }
        }
        let (index, _) = best?;
        let upstream = self.list[index].clone();
        upstream.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(Load { index, upstream })
    }

    /// An attempt on replica `i` got a response head below 500: it is healthy again.
    pub fn succeeded(&self, i: usize) {
        let u = &self.list[i];
        if u.failures_in_row.load(Ordering::Relaxed) != 0 {
            u.failures_in_row.store(0, Ordering::Relaxed);
            u.ejected_until.store(0, Ordering::Relaxed);
        }
    }

    /// An attempt on replica `i` failed at `now`: it is ejected for `eject_base_ms` doubled per
    /// earlier failure in a row, at most `eject_max_ms`.
    pub fn failed(&self, i: usize, now: UnixNanos) {
        let u = &self.list[i];
        u.counters.failures.fetch_add(1, Ordering::Relaxed);
        let before = u.failures_in_row.fetch_add(1, Ordering::Relaxed);
        let backoff = self
            .eject_base_ns
            .saturating_mul(1u64 << before.min(32))
            .min(self.eject_max_ns);
        if !u.ejected_at(now) {
            u.counters.ejections.fetch_add(1, Ordering::Relaxed);
        }
        u.ejected_until.store(now + backoff, Ordering::Relaxed);
    }

    /// The routing view of every replica at `now`, for `/stats`.
    pub fn routing_views(&self, now: UnixNanos) -> Vec<RoutingView> {
        self.list
            .iter()
            .map(|u| {
                let until = u.ejected_until.load(Ordering::Relaxed);
                let c = &u.counters;
                RoutingView {
                    name: u.name.to_string(),
                    url: u.url.clone(),
                    in_flight_now: u.in_flight(),
                    ejected: until > now,
                    ejected_for_s: (until > now)
                        .then(|| (until - now) as f64 / NANOS_PER_SEC as f64),
                    failures_in_row: u.failures_in_row.load(Ordering::Relaxed),
                    failures: c.failures.load(Ordering::Relaxed),
                    retried_away: c.retried_away.load(Ordering::Relaxed),
                    ejections: c.ejections.load(Ordering::Relaxed),
                    models: u.models(),
                }
            })
            .collect()
    }
}

/// How the balancer sees one replica (part of its `/stats` entry).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoutingView {
    /// Its name.
    pub name: String,
    /// Its configured URL.
    pub url: String,
    /// Requests routed to it and not finished, now.
    pub in_flight_now: u64,
    /// Whether it is ejected now.
    pub ejected: bool,
    /// Seconds of ejection left; `null` when not ejected.
    pub ejected_for_s: Option<f64>,
    /// Failed attempts in a row.
    pub failures_in_row: u32,
    /// Failed attempts since start.
    pub failures: u64,
    /// Requests moved to another replica after failing here.
    pub retried_away: u64,
    /// Ejections since start.
    pub ejections: u64,
    /// Models it listed at the last `/v1/models` read; `null` before the first.
    pub models: Option<Vec<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ups(n: usize) -> Upstreams {
        let resolved: Vec<ResolvedUpstream> = (0..n)
            .map(|i| ResolvedUpstream {
                name: format!("u{i}"),
                url: format!("http://127.0.0.1:{}", 9000 + i),
                base: format!("http://127.0.0.1:{}", 9000 + i),
                authority: format!("127.0.0.1:{}", 9000 + i),
                metrics: None,
            })
            .collect();
        Upstreams::new(&resolved, &RoutingConfig::default()).unwrap()
    }

    #[test]
    fn least_in_flight_with_round_robin_ties() {
        let u = ups(3);
        let a = u.pick(None, None, 1).unwrap();
        let b = u.pick(None, None, 1).unwrap();
        let c = u.pick(None, None, 1).unwrap();
        let mut seen = [a.index, b.index, c.index];
        seen.sort();
        assert_eq!(seen, [0, 1, 2], "ties spread over all three");
        drop(b);
        let d = u.pick(None, None, 1).unwrap();
        assert_eq!(
            d.upstream.name, u.list[seen[1]].name,
            "the least loaded wins"
        );
        drop((a, c, d));
        assert!(u.list.iter().all(|x| x.in_flight() == 0));
    }

    #[test]
    fn models_pick_the_replicas_that_serve_them_and_unknown_models_go_to_all() {
        let u = ups(2);
        u.list[0].set_models(["a".to_string()].into());
        u.list[1].set_models(["b".to_string()].into());
        for _ in 0..4 {
            assert_eq!(u.pick(Some("b"), None, 1).unwrap().index, 1);
            assert_eq!(u.pick(Some("a"), None, 1).unwrap().index, 0);
        }
        let picked: HashSet<usize> = (0..4)
            .map(|_| u.pick(Some("zzz"), None, 1).unwrap().index)
            .collect();
        assert_eq!(picked.len(), 2);
        // A replica whose list was not read yet stays a candidate.
        let u = ups(2);
        u.list[0].set_models(["a".to_string()].into());
        let picked: HashSet<usize> = (0..4)
            .map(|_| u.pick(Some("a"), None, 1).unwrap().index)
            .collect();
        assert_eq!(picked.len(), 2);
    }

    #[test]
    fn ejection_grows_and_resets_on_success() {
        let u = ups(2);
        let s = NANOS_PER_SEC;
        u.failed(0, 10 * s);
        assert!(u.list[0].ejected_at(10 * s + s - 1) && !u.list[0].ejected_at(11 * s));
        u.failed(0, 11 * s);
        assert!(u.list[0].ejected_at(12 * s + s / 2), "second failure: 2 s");
        for _ in 0..10 {
            assert_eq!(u.pick(None, None, 12 * s).unwrap().index, 1);
        }
        // A retry never goes back to the excluded replica, nor to an ejected one.
        assert!(u.pick(None, Some(1), 12 * s).is_none());
        // A first attempt with every replica ejected still goes somewhere.
        u.failed(1, 12 * s);
        assert!(u.pick(None, None, 12 * s).is_some());
        u.succeeded(0);
        assert!(!u.list[0].ejected_at(12 * s));
        u.failed(0, 20 * s);
        assert!(
            !u.list[0].ejected_at(21 * s),
            "reset: back to the base backoff"
        );
        for _ in 0..40 {
            u.failed(1, 30 * s);
        }
        assert!(!u.list[1].ejected_at(61 * s), "capped at eject_max_ms");
    }
}
