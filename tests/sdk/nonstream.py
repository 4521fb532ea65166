"""The official openai and anthropic SDKs parse every answer `ttft_for_non_streamed` rebuilds.

Run by scripts/sdk_nonstream.sh. A replay upstream (started here, stdlib only) answers each
recorded pair's request from `tests/fixtures/vllm/agents/pairs/`: the recorded stream when the
request streams, the recorded non-streamed answer otherwise. The SDKs call the proxy (setting on
for every API) non-streamed; each answer must parse, and parse to what the SDK makes of vLLM's
recorded non-streamed answer, ids and times aside. The access log must show a TTFT measured on
the stream (0 < ttft_ms < e2e_ms) for every upgraded request, and the reason for the others.

Environment: TM_PROXY (base URL), TM_ACCESS_LOG (the proxy's log), TM_UPSTREAM_PORT_FILE (where
the replay upstream writes its port for the script), TM_PAIRS (the pairs directory).
"""

import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import openai

PAIRS = os.environ["TM_PAIRS"]
failures = []


def check(cond, what):
    print(("  ok    " if cond else "  FAIL  ") + what)
    if not cond:
        failures.append(what)
    return cond


def load_index():
    """(name, path, request) for every pair listed in INDEX.txt."""
    pairs, name, path = [], None, None
    for line in open(os.path.join(PAIRS, "INDEX.txt"), encoding="utf-8"):
        m = re.match(r"^(p\d+\w*)\s+POST\s+(\S+)", line)
        if m:
            name, path = m.group(1), m.group(2)
        elif line.strip().startswith("request:") and name:
            pairs.append((name, path, json.loads(line.split("request:", 1)[1])))
    return pairs


def recorded(name, kind):
    raw = open(os.path.join(PAIRS, f"{name}.{kind}.http"), "rb").read()
    head, body = raw.split(b"\r\n\r\n", 1)
    return head.decode(), body


INDEX = load_index()


class Replay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        stream = body.pop("stream", False)
        body.pop("stream_options", None)
        match = [n for n, p, r in INDEX if p == self.path and r == body]
        if not match:
            self.send_response(404)
            self.send_header("content-type", "application/json")
            msg = json.dumps({"error": {"message": "no recorded pair for this request"}}).encode()
            self.send_header("content-length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        _, payload = recorded(match[0], "stream" if stream else "nonstream")
        self.send_response(200)
        if stream:
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for event in payload.decode().split("\n\n"):
                if not event.strip():
                    continue
                data = (event + "\n\n").encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                time.sleep(0.002)
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)


def serve_upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


REQUIRED = {
    "/v1/chat/completions": ("model", "messages"),
    "/v1/completions": ("model", "prompt"),
    "/v1/messages": ("model", "max_tokens", "messages"),
    "/v1/responses": ("model", "input"),
}

# Members a recorded answer and a rebuilt one may differ in: each request's own ids and times.
OWN = {"id", "created", "created_at", "call_id"}


def without_ids(v):
    if isinstance(v, dict):
        return {k: without_ids(x) for k, x in v.items() if k not in OWN}
    if isinstance(v, list):
        return [without_ids(x) for x in v]
    return v


def call(path, req, base):
    """The SDK's call for `path`, with the pair's request: required members as arguments, the
    rest (vLLM's extras included) in extra_body so the SDK sends exactly the recorded request."""
    kw = {k: req[k] for k in REQUIRED[path]}
    extra = {k: v for k, v in req.items() if k not in kw}
    if path == "/v1/messages":
        c = anthropic.Anthropic(base_url=base, api_key="sk-ant-dummy", max_retries=0, timeout=30)
        return c.messages.create(**kw, extra_body=extra)
    c = openai.OpenAI(base_url=base + "/v1", api_key="sk-dummy", max_retries=0, timeout=30)
    if path == "/v1/chat/completions":
        return c.chat.completions.create(**kw, extra_body=extra)
    if path == "/v1/completions":
        return c.completions.create(**kw, extra_body=extra)
    return c.responses.create(**kw, extra_body=extra)


def parse_recorded(path, body):
    """What the SDK makes of vLLM's recorded non-streamed answer."""
    data = json.loads(body)
    if path == "/v1/messages":
        from anthropic.types import Message as T
    elif path == "/v1/chat/completions":
        from openai.types.chat import ChatCompletion as T
    elif path == "/v1/completions":
        from openai.types import Completion as T
    else:
        from openai.types.responses import Response as T
    return T.model_validate(data)


def main():
    proxy, log = os.environ["TM_PROXY"], os.environ["TM_ACCESS_LOG"]
    upstream = serve_upstream()
    with open(os.environ["TM_UPSTREAM_PORT_FILE"], "w") as f:
        f.write(str(upstream.server_address[1]))
    # The script starts the proxy once it knows the port, then tells us through this file.
    ready = os.environ["TM_UPSTREAM_PORT_FILE"] + ".proxy"
    for _ in range(400):
        if os.path.exists(ready):
            break
        time.sleep(0.05)
    proxy = open(ready).read().strip()
    print(f"sdk_nonstream: replay upstream on port {upstream.server_address[1]}, proxy at {proxy}")
    for name, path, req in INDEX:
        try:
            got = call(path, req, proxy)
        except Exception as e:  # the SDK refused the answer
            check(False, f"{name}: the SDK parses the answer ({type(e).__name__}: {e})")
            continue
        want = parse_recorded(path, recorded(name, "nonstream")[1])
        check(True, f"{name}: the SDK parses the answer ({type(got).__name__})")
        check(
            without_ids(got.model_dump()) == without_ids(want.model_dump()),
            f"{name}: it parses to what vLLM's recorded non-streamed answer parses to",
        )
    time.sleep(0.5)
    lines = [json.loads(l) for l in open(log, encoding="utf-8")]
    check(len(lines) == len(INDEX), f"one log line per request ({len(lines)})")
    for (name, _, req), line in zip(INDEX, lines):
        check(line["stream"] is False and line["status"] == 200, f"{name}: logged stream false, 200")
        if "tools" in req:
            check(
                line["ttft_source"] is None and line["ttft_fallback"] == "request has tools",
                f"{name}: passed through ({line['ttft_fallback']})",
            )
        else:
            ttft, e2e = line["ttft_ms"], line["e2e_ms"]
            check(
                line["ttft_source"] == "upstream_stream" and ttft is not None and 0 < ttft < e2e,
                f"{name}: TTFT from the stream, 0 < {ttft} < {e2e} ms",
            )
    upstream.shutdown()
    if failures:
        print(f"sdk_nonstream: {len(failures)} check(s) failed")
        sys.exit(1)
    print("sdk_nonstream: all checks passed")


main()
