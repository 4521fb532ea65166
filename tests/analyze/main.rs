//! `tokenmeter analyze` over access logs: input, output, reports, end to end from the proxy's
//! log, the logs of a fleet, and the ClickHouse SQL against it; and the production-traffic
//! capacity curve over real sockets.
//!
//! Ignored here, run by name: `analyze_timing::` (1,000,000 lines), `clickhouse::` (needs
//! chdb: `scripts/clickhouse.sh`), `cap_diag::` (a diagnostic) and `capacity_acceptance::`
//! (minutes: `scripts/capacity_acceptance.sh`).

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

mod analyze_support;
#[path = "../common/mod.rs"]
mod common;

mod analyze_crosscheck;
mod analyze_e2e;
mod analyze_input;
mod analyze_kv;
mod analyze_output;
mod analyze_report;
mod analyze_timing;
mod cap_diag;
mod capacity_acceptance;
mod clickhouse;
mod fleet_analyze;
mod offline_equals_live;
