//! The scraper of vLLM's `/metrics`: the text format, its configuration, windows, the log, the
//! report, and the cross-checks against the simulator through the proxy.
//!
//! Ignored here, run by name: the two 75 s measured runs (`scrape_measure::`).

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;
mod scrape_support;

mod scrape_config;
mod scrape_crosscheck;
mod scrape_log;
mod scrape_measure;
mod scrape_prom_text;
mod scrape_report;
mod scrape_request_metrics;
mod scrape_window;
