//! The proxy over real sockets, in process: what passes through it for each API, its edges,
//! hostile clients and broken upstreams, the upstream pool, TLS, the fleet of replicas, the
//! non-streamed upgrade and its folds, OTLP export.
//!
//! Ignored here, run by name: the slow reliability probes (`reliability_load::`, see
//! `scripts/reliability.sh`) and the cost of `ttft_for_non_streamed` (`nonstream_cost::`).

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;
mod fold_support;

mod agent_calls;
mod agent_sessions;
mod error_shapes;
mod fleet;
mod fold_pairs;
mod fold_rules;
mod front;
mod hardening;
mod nonstream_cost;
mod otlp;
mod proxy_dialects;
mod proxy_edges;
mod proxy_nonstream;
mod proxy_passthrough;
mod proxy_stats;
mod reliability;
mod reliability_load;
mod tls;
mod upstream_pool;
