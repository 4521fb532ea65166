#!/usr/bin/env bash
# The official openai and anthropic SDKs parse every answer `ttft_for_non_streamed` rebuilds:
# tests/sdk/nonstream.py replays the recorded vLLM pairs as the upstream of `tokenmeter serve`
# (setting on for every API) and calls it non-streamed with the SDKs.
#
#   scripts/sdk_nonstream.sh [path/to/tokenmeter]   (default: target/release/tokenmeter)
#
# The SDKs come from tests/sdk/requirements.txt, installed into the virtualenv target/sdk-venv
# (SDK_VENV=DIR elsewhere), rebuilt when the requirements change.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${1:-target/release/tokenmeter}
VENV=${SDK_VENV:-target/sdk-venv}
REQ=tests/sdk/requirements.txt

fail() { echo "sdk_nonstream: $*" >&2; exit 1; }
[ -x "$BIN" ] || fail "no tokenmeter binary at $BIN (cargo build --release first)"
[ -f "$REQ" ] || fail "no $REQ"

stamp="$VENV/.requirements.sha256"
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "sdk_nonstream: creating $VENV from $REQ"
    rm -rf "$VENV"
    python3 -m venv "$VENV" || fail "python3 -m venv failed"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ" \
        || fail "pip install -r $REQ failed"
    echo "$want" > "$stamp"
fi

work=$(mktemp -d)
pids=()
cleanup() {
    local rc=$?
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    [ "$rc" -ne 0 ] && [ -s "$work/serve.log" ] && tail -n 20 "$work/serve.log" >&2
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

TM_PAIRS=tests/fixtures/vllm/agents/pairs TM_UPSTREAM_PORT_FILE="$work/port" \
TM_ACCESS_LOG="$work/access.jsonl" TM_PROXY=unused \
    timeout 180 "$VENV/bin/python" tests/sdk/nonstream.py &
pids+=($!)
checker=${pids[-1]}
for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || fail "the replay upstream did not start"

"$BIN" serve --listen 127.0.0.1:0 --upstream "http://127.0.0.1:$(cat "$work/port")" \
    --access-log "$work/access.jsonl" \
    --set ttft_for_non_streamed.chat=true --set ttft_for_non_streamed.completions=true \
    --set ttft_for_non_streamed.messages=true --set ttft_for_non_streamed.responses=true \
    > "$work/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do
    addr=$(grep -oE 'listening on [0-9.]+:[0-9]+' "$work/serve.log" | head -n1 | grep -oE '[0-9.]+:[0-9]+$' || true)
    [ -n "$addr" ] && break
    sleep 0.05
done
[ -n "$addr" ] || fail "tokenmeter serve did not start"
echo "http://$addr" > "$work/port.proxy"
wait "$checker"
