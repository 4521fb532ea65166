#!/usr/bin/env bash
# Runs the fuzz targets for a bounded time each (default 120 s): `sse_scan` (the SSE scanner on
# arbitrary splits), `summarize` (the event summary's fast path against serde's reading) and
# `h1_response` (the upstream response reader on arbitrary bytes, cuts and pauses) and
# `request_scan` (the request body's top-level scan against serde's reading).
# Usage: scripts/fuzz.sh [seconds] [target ...]
# An input that takes over 10 s is reported as a hang (-timeout; libFuzzer waits 20 minutes).
# cargo-fuzz needs libFuzzer's nightly-only flags; on a stable toolchain RUSTC_BOOTSTRAP=1 allows them.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-120}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(sse_scan summarize h1_response request_scan)
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
mkdir -p corpus/sse_scan corpus/summarize corpus/h1_response corpus/request_scan
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
# Seeds for h1_response: whole recorded responses (the raw captures as they came, chunks and all;
# the others with their bodies re-chunked if their head says chunked), and a few framings the
# captures lack. Each input is a flags byte (bit 0 HEAD, bit 1 a pause before every read), a byte
# whose low 3 bits count the cut sizes that follow, the cut sizes, then the stream.
python3 - ../tests/fixtures/vllm/*.http ../tests/fixtures/vllm/*.raw <<'PY'
import os, sys
def seed(name, stream, flags=0, cuts=b''):
    open('corpus/h1_response/' + name + '.seed', 'wb').write(bytes([flags, len(cuts)]) + cuts + stream)
for f in sys.argv[1:]:
    raw = open(f, 'rb').read()
    name = os.path.basename(f)
    head, body = raw.split(b'\r\n\r\n', 1)
    if f.endswith('.http') and b'transfer-encoding: chunked' in head.lower():
        events = [e + b'\n\n' for e in body.split(b'\n\n') if e]
        body = b''.join(b'%x\r\n%s\r\n' % (len(e), e) for e in events) + b'0\r\n\r\n'
    stream = head + b'\r\n\r\n' + body
    seed(name, stream)
    seed(name + '.cut', stream, 2, b'\x06\x00\x1f')
for name, flags, stream in [
    ('interim', 0, b'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n'
                   b'HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok'),
    ('head', 1, b'HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n'),
    ('no_content', 0, b'HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n'),
    ('not_modified', 0, b'HTTP/1.1 304 Not Modified\r\n\r\n'),
    ('close', 0, b'HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nto the end'),
    ('http10', 0, b'HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 3\r\n\r\nabc'),
    ('chunk_ext_trailers', 0, b'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n'
                              b'1 ;q="x"\r\n \r\n005\r\nworld\r\n0\r\nx-t: 1\r\n\r\n'),
    ('switching', 0, b'HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\nframes'),
]:
    seed(name, stream, flags)
PY
# Seeds for request_scan: chat request bodies, plain and not.
i=0
for body in '{"model":"m","messages":[{"role":"user","content":"hi \"x\" \u00e9"}],"stream":true}' \
            '{"stream":true,"stream_options":{"include_usage":false},"n":1.5e3}' \
            '{"model":"m","stream":false,"input":[[],{},null,true,-0]}'; do
  printf '%s' "$body" > "corpus/request_scan/$i.seed"
  i=$((i + 1))
done
for t in "${targets[@]}"; do
  RUSTC_BOOTSTRAP=1 cargo fuzz run "$t" "corpus/$t" -- -max_total_time="$seconds" -max_len=4096 -timeout=10
done
