//! The proxy's own health: liveness (the process serves) and readiness (it should get traffic).
//!
//! Readiness is false while draining after SIGTERM, and while the last attempt to reach the
//! upstream failed less than `readiness_upstream_failure_s` ago with no success since. Waiting
//! out the period lets traffic probe the upstream again, as a load balancer's half-open check does.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::Serialize;

use crate::clock::{Clock, UnixNanos, NANOS_PER_SEC};

/// Shared health state: written by the forwarder and the shutdown path, read by the probes.
#[derive(Debug)]
pub struct Health {
    draining: AtomicBool,
    /// When the upstream last failed to connect (Unix ns); 0 = not since the last success.
    upstream_failed_at: AtomicU64,
    failure_window_ns: u64,
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
    /// Seconds since the last failed connection to the upstream, while that counts.
    pub upstream_failed_s_ago: Option<f64>,
}

impl Readiness {
    /// Whether the proxy is ready.
    pub fn ready(&self) -> bool {
        self.reasons.is_empty()
    }
}

impl Health {
    /// Health state where upstream failures count for `failure_window_s` seconds (0 = never).
    pub fn new(failure_window_s: u64) -> Health {
        Health {
            draining: AtomicBool::new(false),
            upstream_failed_at: AtomicU64::new(0),
            failure_window_ns: failure_window_s.saturating_mul(NANOS_PER_SEC),
        }
    }

    /// Shutdown has begun: no longer ready.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// A connection to the upstream could not be made (refused, unreachable, timed out, TLS).
    pub fn upstream_failed(&self, now: UnixNanos) {
        self.upstream_failed_at.store(now.max(1), Ordering::Relaxed);
    }

    /// The upstream answered: clears a failure (one load per request when there is none).
    #[inline]
    pub fn upstream_answered(&self) {
        if self.upstream_failed_at.load(Ordering::Relaxed) != 0 {
            self.upstream_failed_at.store(0, Ordering::Relaxed);
        }
    }

    /// Readiness at `now`.
    pub fn readiness(&self, now: UnixNanos) -> Readiness {
        let mut reasons = Vec::new();
        if self.draining.load(Ordering::Relaxed) {
            reasons.push("draining");
        }
        let failed_at = self.upstream_failed_at.load(Ordering::Relaxed);
        let ago = now.saturating_sub(failed_at);
        let mut upstream_failed_s_ago = None;
        if failed_at != 0 && ago < self.failure_window_ns {
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
        h.upstream_failed(100 * s);
        let r = h.readiness(105 * s);
        assert_eq!(r.reasons, vec!["upstream_unreachable"]);
        assert_eq!(r.upstream_failed_s_ago, Some(5.0));
        assert!(h.readiness(110 * s).ready(), "the period is over");
        h.upstream_answered();
        assert!(h.readiness(101 * s).ready(), "a success clears it");
        h.start_draining();
        assert_eq!(h.readiness(101 * s).reasons, vec!["draining"]);
        let never = Health::new(0);
        never.upstream_failed(100 * s);
        assert!(never.readiness(100 * s).ready());
    }
}
