//! The live meter: timelines, windows, levels and the capacity curve, the meter thread, `/stats`
//! and Prometheus output, coalescing, properties, and the windows against the simulator's own
//! counter.
//!
//! Ignored here, run by name: the 60 s measurement `meter_vs_sim::sixty_seconds_twice_windows_vs_client_aggregate`.

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;
mod meter_support;

mod exposition_names;
mod meter_coalescing;
mod meter_http;
mod meter_kv;
mod meter_kv_sim;
mod meter_levels;
mod meter_live;
mod meter_live_latency;
mod meter_prometheus;
mod meter_props;
mod meter_timeline;
mod meter_vs_sim;
mod meter_windows;
mod saturation_sim;
mod service_level;
mod service_level_agents;
mod sessions_audit;
mod sessions_vs_sim;
mod sim_traffic;
