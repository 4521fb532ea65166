#!/usr/bin/env bash
# Runs the SSE scanner fuzz target for a bounded time (default 120 s).
# cargo-fuzz needs libFuzzer's nightly-only flags; on a stable toolchain RUSTC_BOOTSTRAP=1 allows them.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-120}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
mkdir -p corpus/sse_scan
# Seed with the recorded vLLM streams (bodies only).
for f in ../tests/fixtures/vllm/0*_chat_stream*.http ../tests/fixtures/vllm/09_*.http; do
  python3 - "$f" "corpus/sse_scan/$(basename "$f").seed" <<'PY'
import sys
raw = open(sys.argv[1], 'rb').read()
open(sys.argv[2], 'wb').write(b'\x07' + raw[raw.index(b'\r\n\r\n') + 4:])
PY
done
RUSTC_BOOTSTRAP=1 cargo fuzz run sse_scan corpus/sse_scan -- -max_total_time="$seconds" -max_len=4096
