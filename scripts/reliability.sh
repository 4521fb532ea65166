#!/usr/bin/env bash
# Runs the slow reliability probes (the #[ignore]d tests of tests/proxy/reliability_load.rs, the
# simulator's 2,000-stream scale test and the idle serving threads' wakeup count) in release mode,
# one at a time, printing their figures.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release --test proxy -- --ignored --nocapture --test-threads 1 reliability_load::
cargo test --release --test sim -- --ignored --nocapture sim_scale::
# Idle serving threads are not woken (counted over real seconds, so not in the default run).
cargo test --release --test binary -- --ignored --nocapture serving_threads::
