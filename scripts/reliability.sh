#!/usr/bin/env bash
# Runs the slow reliability probes (the #[ignore]d tests of tests/proxy/reliability_load.rs and the
# simulator's 2,000-stream scale test) in release mode, one at a time, printing their figures.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release --test proxy -- --ignored --nocapture --test-threads 1 reliability_load::
cargo test --release --test sim -- --ignored --nocapture sim_scale::
