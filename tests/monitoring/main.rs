//! The monitoring stack against real programs: the dashboard in headless Chromium and a real
//! Prometheus scraping the proxy and the simulator, every Grafana panel query answered. The
//! two that need those programs are ignored; `.ci/run` runs them with
//! `--test monitoring -- --ignored --test-threads 1`.

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

mod monitoring_support;

mod dashboard_browser;
mod monitoring_alerts;
mod monitoring_prometheus;
