#!/usr/bin/env bash
# Checks the ClickHouse SQL in clickhouse/ against `analyze` with chdb (embedded ClickHouse from
# PyPI), in a venv of its own under target/ (made once, reused).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/chdb-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import chdb' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'chdb>=3,<5'
fi
TOKENMETER_CHDB_PYTHON="$PWD/$venv/bin/python" \
    cargo test --release --test analyze -- --ignored --nocapture clickhouse::
