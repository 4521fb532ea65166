//! The shipped binary run as a process: health, readiness and drain, process logs, exit codes,
//! signals, `--check-config`, its serving threads, and the packaging files (Dockerfile,
//! compose.yaml, the systemd unit) it is started with.

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod operate;
mod packaging;
mod serve_binary;
mod serving_threads;
mod settings_table;
