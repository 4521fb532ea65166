#!/usr/bin/env bash
# The official-SDK acceptance test: the openai and anthropic Python SDKs (pinned in
# tests/sdk/requirements.txt, installed from PyPI into a virtualenv) call `tokenmeter serve` in
# front of `tokenmeter sim`, and tests/sdk/acceptance.py checks what the proxy logged and counted
# against what the SDKs report and what the simulator generated.
#
#   scripts/sdk_acceptance.sh [path/to/tokenmeter]   (default: target/release/tokenmeter)
#
# The virtualenv is kept in target/sdk-venv and rebuilt when the requirements change
# (SDK_VENV=DIR to put it elsewhere). Both processes listen on port 0 and are stopped on exit,
# whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${1:-target/release/tokenmeter}
VENV=${SDK_VENV:-target/sdk-venv}
REQ=tests/sdk/requirements.txt
MODEL=tiny-llama
STARTUP_TIMEOUT_S=20
RUN_TIMEOUT_S=180

fail() { echo "sdk_acceptance: $*" >&2; exit 1; }

[ -x "$BIN" ] || fail "no tokenmeter binary at $BIN (cargo build --release first)"
command -v python3 >/dev/null || fail "python3 is needed"

# The virtualenv, (re)built when missing or when the requirements changed.
stamp="$VENV/.requirements.sha256"
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "sdk_acceptance: creating $VENV from $REQ"
    rm -rf "$VENV"
    python3 -m venv "$VENV" || fail "python3 -m venv failed (is the venv module installed?)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ" \
        || fail "pip install -r $REQ failed (PyPI unreachable?)"
    echo "$want" > "$stamp"
fi

work=$(mktemp -d)
pids=()
cleanup() {
    local rc=$?
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    for p in "${pids[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    if [ "$rc" -ne 0 ] && [ -z "${SDK_KEEP:-}" ]; then
        for f in sim.log serve.log; do
            [ -s "$work/$f" ] && { echo "--- $f (last 20 lines)" >&2; tail -n 20 "$work/$f" >&2; }
        done
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits for "listening on ADDR" in log $1 of process $2 and prints ADDR.
wait_addr() {
    local log=$1 pid=$2 what=$3 i addr
    for ((i = 0; i < STARTUP_TIMEOUT_S * 10; i++)); do
        addr=$(grep -oE '(^|[^a-z])listening on [0-9.]+:[0-9]+' "$log" 2>/dev/null | head -n1 | grep -oE '[0-9.]+:[0-9]+$' || true)
        if [ -n "$addr" ]; then
            echo "$addr"
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; fail "$what exited before listening"; }
        sleep 0.1
    done
    cat "$log" >&2
    fail "$what did not report its address within ${STARTUP_TIMEOUT_S}s"
}

# No stop rule: every request generates exactly its limit, so every count is exact.
cat > "$work/sim.toml" <<TOML
served_model_name = "$MODEL"
max_model_len = 4096
stop_probability_per_token = 0.0
log_stats_interval_s = 0.0
step_base_ms = 2.0
step_per_seq_ms = 0.1
TOML

TOKENMETER_LOG=info "$BIN" sim --listen 127.0.0.1:0 --config "$work/sim.toml" > "$work/sim.log" 2>&1 &
pids+=($!)
sim_addr=$(wait_addr "$work/sim.log" "${pids[-1]}" "tokenmeter sim")

TOKENMETER_LOG=info "$BIN" serve --listen 127.0.0.1:0 --upstream "http://$sim_addr" \
    --access-log "$work/access.jsonl" > "$work/serve.log" 2>&1 &
pids+=($!)
proxy_addr=$(wait_addr "$work/serve.log" "${pids[-1]}" "tokenmeter serve")
# A second proxy whose upstream refuses connections: its own 502s, as the SDKs read them.
closed_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TOKENMETER_LOG=info "$BIN" serve --listen 127.0.0.1:0 --upstream "http://127.0.0.1:$closed_port" \
    > "$work/serve-down.log" 2>&1 &
pids+=($!)
down_addr=$(wait_addr "$work/serve-down.log" "${pids[-1]}" "tokenmeter serve (upstream down)")
echo "sdk_acceptance: sim at $sim_addr, proxy at $proxy_addr; SDKs: $(grep -E '^(openai|anthropic)==' "$REQ" | tr '\n' ' ')"

TM_PROXY="http://$proxy_addr" TM_PROXY_DOWN="http://$down_addr" TM_SIM="http://$sim_addr" TM_ACCESS_LOG="$work/access.jsonl" TM_MODEL="$MODEL" \
    timeout "$RUN_TIMEOUT_S" "$VENV/bin/python" tests/sdk/acceptance.py \
    || fail "the SDK checks failed (see above)"
