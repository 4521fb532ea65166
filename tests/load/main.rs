//! `tokenmeter load`: the burst sweep and the sustained method against a fake server with known
//! timing, every API, recorded fixtures, the simulator, and the command line.

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

mod load_support;

mod load_api;
mod load_burst;
mod load_cli;
mod load_fixtures;
mod load_sessions;
mod load_sim;
mod load_sustained;
