#!/usr/bin/env bash
# Runs the fuzz targets for a bounded time each (default 120 s): `sse_scan` (the SSE scanner on
# arbitrary splits) and `summarize` (the event summary's fast path against serde's reading).
# Usage: scripts/fuzz.sh [seconds] [target ...]
# cargo-fuzz needs libFuzzer's nightly-only flags; on a stable toolchain RUSTC_BOOTSTRAP=1 allows them.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-120}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(sse_scan summarize)
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
mkdir -p corpus/sse_scan corpus/summarize
# Seeds from the recorded vLLM streams: whole bodies for the scanner, single events and pairs of
# consecutive events for summarize.
for f in ../tests/fixtures/vllm/0*_chat_stream*.http ../tests/fixtures/vllm/09_*.http \
         ../tests/fixtures/vllm/01_*.http ../tests/fixtures/vllm/10_*.http; do
  python3 - "$f" "$(basename "$f")" <<'PY'
import sys
raw = open(sys.argv[1], 'rb').read()
body = raw[raw.index(b'\r\n\r\n') + 4:]
open('corpus/sse_scan/' + sys.argv[2] + '.seed', 'wb').write(b'\x07' + body)
events = [l[6:] for l in body.split(b'\n') if l.startswith(b'data: {')] or [body.strip()]
for i, e in enumerate(events):
    open('corpus/summarize/%s.%d.seed' % (sys.argv[2], i), 'wb').write(e)
# Consecutive events, one per line: the memo learns from the first and reads the second.
for i in range(len(events) - 1):
    open('corpus/summarize/%s.%d.pair.seed' % (sys.argv[2], i), 'wb').write(events[i] + b'\n' + events[i + 1])
PY
done
for t in "${targets[@]}"; do
  RUSTC_BOOTSTRAP=1 cargo fuzz run "$t" "corpus/$t" -- -max_total_time="$seconds" -max_len=4096
done
