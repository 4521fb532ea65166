//! The proxy's own health: liveness (the process serves) and readiness (it should get traffic).
//!
//! Readiness is false while draining after SIGTERM, and while every upstream is unreachable: its
//! last connection attempt failed less than `readiness_upstream_failure_s` ago with no success
//! since. With several upstreams one reachable replica keeps the proxy ready (the balancer routes
//! around the others). Waiting out the period lets traffic probe the upstreams again, as a load
//! balancer's half-open check does.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::Serialize;

use crate::clock::{Clock, UnixNanos, NANOS_PER_SEC};

/// How often, at most, a failing upstream's connection failures are logged (the first at once,
/// then one line per period with the count since the last line).
pub const FAILURE_LOG_PERIOD_NS: u64 = 10 * NANOS_PER_SEC;

/// Shared health state: written by the forwarder and the shutdown path, read by the probes.
#[derive(Debug)]
pub struct Health {
    draining: AtomicBool,
    /// Per upstream (in configured order): when it last failed to connect (Unix ns); 0 = not
    /// since its last success.
    upstream_failed_at: Box<[AtomicU64]>,
    /// Per upstream: its name and the process log's view of its failures.
    failure_log: Box<[FailureLog]>,
    failure_window_ns: u64,
}

/// What the process log says of one upstream's connection failures: rate-limited lines while it
/// fails, one line when it answers again.
#[derive(Debug, Default)]
struct FailureLog {
    name: String,
    /// When the first failure since the last success happened (Unix ns); 0 = none.
    down_since: AtomicU64,
    /// Failures since the last success.
    failures: AtomicU64,
    /// Failures not yet in a log line.
    unlogged: AtomicU64,
    /// When the last failure line was written (Unix ns).
    logged_at: AtomicU64,
}

impl Default for Health {
    /// Health state with the default failure period (10 s).
    fn default() -> Self {
        Health::new(10)
    }
}

/// A readiness answer: the JSON body of `/readyz`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Readiness {
    /// `"ready"` or `"not_ready"`.
    pub status: &'static str,
    /// Why not: `"draining"`, `"upstream_unreachable"`; empty when ready.
    pub reasons: Vec<&'static str>,
    /// Seconds since the last failed connection to an upstream, while every upstream counts as
    /// unreachable.
    pub upstream_failed_s_ago: Option<f64>,
}

impl Readiness {
    /// Whether the proxy is ready.
    pub fn ready(&self) -> bool {
        self.reasons.is_empty()
    }
}

impl Health {
    /// Health state of one upstream whose failures count for `failure_window_s` seconds
    /// (0 = never).
    pub fn new(failure_window_s: u64) -> Health {
        Health::with_upstreams(failure_window_s, 1)
    }

    /// Health state of `upstreams` upstreams (at least one) whose failures count for
    /// `failure_window_s` seconds (0 = never).
    pub fn with_upstreams(failure_window_s: u64, upstreams: usize) -> Health {
        let names = (0..upstreams.max(1)).map(|i| format!("#{i}")).collect();
        Health::named(failure_window_s, names)
    }

    /// Health state of the upstreams `names` (at least one; the process log names them).
    pub fn named(failure_window_s: u64, mut names: Vec<String>) -> Health {
        if names.is_empty() {
            names.push("upstream".into());
        }
        Health {
            draining: AtomicBool::new(false),
            upstream_failed_at: names.iter().map(|_| AtomicU64::new(0)).collect(),
            failure_log: names
                .into_iter()
                .map(|name| FailureLog {
                    name,
                    ..FailureLog::default()
                })
                .collect(),
            failure_window_ns: failure_window_s.saturating_mul(NANOS_PER_SEC),
        }
    }

    /// Shutdown has begun: no longer ready.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// A connection to upstream `index` could not be made (refused, unreachable, timed out,
    /// TLS).
    /// The first failure after a success is logged at once with its `reason`; later ones at
    /// most once per [`FAILURE_LOG_PERIOD_NS`], with how many there were since the last line.
    pub fn upstream_failed(&self, index: usize, now: UnixNanos, reason: &str) {
        if let Some(at) = self.upstream_failed_at.get(index) {
            at.store(now.max(1), Ordering::Relaxed);
        }
        let Some(log) = self.failure_log.get(index) else {
            return;
        };
        let now = now.max(1);
        let first = log
            .down_since
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
        log.failures.fetch_add(1, Ordering::Relaxed);
        let unlogged = log.unlogged.fetch_add(1, Ordering::Relaxed) + 1;
        let last = log.logged_at.load(Ordering::Relaxed);
        let due = first || now.saturating_sub(last) >= FAILURE_LOG_PERIOD_NS;
        // One thread wins the line; the others' failures are counted in the next one.
        if due
            && log
                .logged_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            log.unlogged.fetch_sub(unlogged, Ordering::Relaxed);
            let down_s = now.saturating_sub(log.down_since.load(Ordering::Relaxed)) as f64
                / NANOS_PER_SEC as f64;
            tracing::warn!(
                upstream = %log.name,
                reason,
                failures = unlogged,
                down_s,
                "cannot connect to the upstream; answering 502 (logged at most every 10 s while it lasts)"
            );
        }
    }

    /// Upstream `index` answered: clears its failure (one load per request when there is none).
    #[inline]
    /// The first answer after connection failures is logged, with how many there were and how
    /// long the upstream was down.
    pub fn upstream_answered(&self, index: usize) {
        if let Some(at) = self.upstream_failed_at.get(index) {
            if at.load(Ordering::Relaxed) != 0 {
                at.store(0, Ordering::Relaxed);
            }
        }
        let Some(log) = self.failure_log.get(index) else {
            return;
        };
        // One load per request while the upstream is fine.
        if log.down_since.load(Ordering::Relaxed) == 0 {
            return;
        }
        let since = log.down_since.swap(0, Ordering::Relaxed);
        if since == 0 {
            return;
        }
        let failures = log.failures.swap(0, Ordering::Relaxed);
        log.unlogged.store(0, Ordering::Relaxed);
        log.logged_at.store(0, Ordering::Relaxed);
        let down_s = Clock::global().now().saturating_sub(since) as f64 / NANOS_PER_SEC as f64;
        tracing::info!(
            upstream = %log.name,
            failures,
            down_s,
            "the upstream answers again"
        );
    }

    /// Readiness at `now`.
    pub fn readiness(&self, now: UnixNanos) -> Readiness {
        let mut reasons = Vec::new();
        if self.draining.load(Ordering::Relaxed) {
            reasons.push("draining");
        }
        // The most recent failure's age when every upstream failed within the period.
        let mut latest_ago: Option<u64> = Some(u64::MAX);
        for at in self.upstream_failed_at.iter() {
            let failed_at = at.load(Ordering::Relaxed);
            let ago = now.saturating_sub(failed_at);
            latest_ago = if failed_at != 0 && ago < self.failure_window_ns {
                latest_ago.map(|l| l.min(ago))
            } else {
                None
            };
            if latest_ago.is_none() {
                break;
            }
        }
        let mut upstream_failed_s_ago = None;
        if let Some(ago) = latest_ago {
            reasons.push("upstream_unreachable");
            upstream_failed_s_ago = Some(ago as f64 / NANOS_PER_SEC as f64);
        }
        Readiness {
            status: if reasons.is_empty() {
                "ready"
            } else {
                "not_ready"
            },
            reasons,
            upstream_failed_s_ago,
        }
    }

    /// Readiness now.
    pub fn readiness_now(&self) -> Readiness {
        self.readiness(Clock::global().now())
    }

    /// The answer to a probe path (`/healthz`, `/readyz`, or either under `/stats/`): status and
    /// JSON body; `None` for other paths.
    pub fn probe(&self, path: &str) -> Option<(http::StatusCode, Vec<u8>)> {
        match path.strip_prefix("/stats").unwrap_or(path) {
            "/healthz" => Some((http::StatusCode::OK, br#"{"status":"alive"}"#.to_vec())),
            "/readyz" => {
                let r = self.readiness_now();
                let status = if r.ready() {
                    http::StatusCode::OK
                } else {
                    http::StatusCode::SERVICE_UNAVAILABLE
                };
                Some((status, serde_json::to_vec(&r).unwrap_or_default()))
            }
            _ => None,
        }
    }
}

/// Whether `path` is a probe the main listener answers itself, with or without `admin_listen`
/// (so that a container's probes can use the port the traffic uses).
pub fn is_main_probe(path: &str) -> bool {
    matches!(path, "/stats/healthz" | "/stats/readyz")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_follows_draining_and_recent_upstream_failures() {
        let s = NANOS_PER_SEC;
        let h = Health::new(10);
        assert!(h.readiness(100 * s).ready());
        h.upstream_failed(0, 100 * s, "connection refused");
        let r = h.readiness(105 * s);
        assert_eq!(r.reasons, vec!["upstream_unreachable"]);
        assert_eq!(r.upstream_failed_s_ago, Some(5.0));
        assert!(h.readiness(110 * s).ready(), "the period is over");
        h.upstream_answered(0);
        assert!(h.readiness(101 * s).ready(), "a success clears it");
        h.start_draining();
        assert_eq!(h.readiness(101 * s).reasons, vec!["draining"]);
        let never = Health::new(0);
        never.upstream_failed(0, 100 * s, "connection refused");
        assert!(never.readiness(100 * s).ready());
    }

    #[test]
    fn with_several_upstreams_one_reachable_keeps_it_ready() {
        let s = NANOS_PER_SEC;
        let h = Health::with_upstreams(10, 2);
        h.upstream_failed(0, 100 * s, "connection refused");
        assert!(h.readiness(101 * s).ready(), "upstream 1 never failed");
        h.upstream_failed(1, 103 * s, "connection refused");
        let r = h.readiness(104 * s);
        assert_eq!(r.reasons, vec!["upstream_unreachable"]);
        assert_eq!(
            r.upstream_failed_s_ago,
            Some(1.0),
            "the latest failure's age"
        );
        assert!(h.readiness(110 * s).ready(), "upstream 0's period is over");
        h.upstream_answered(1);
        assert!(h.readiness(104 * s).ready(), "a success of one clears it");
    }
}
