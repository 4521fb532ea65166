//! The vLLM simulator: its engine, pace, rates and metrics, its configuration, and the wire
//! format for each API.
//!
//! Ignored here, run by name: the 2,000-stream scale run (`sim_scale::`, see
//! `scripts/reliability.sh`).

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

mod sim_support;

mod sim_agents_wire;
mod sim_config;
mod sim_engine;
mod sim_engine_core;
mod sim_fixed_pace;
mod sim_kv;
mod sim_kv_http;
mod sim_metrics;
mod sim_rates;
mod sim_scale;
mod sim_truth_log;
mod sim_wire;
