"""The overhead benchmark's Python clients: an interleaved A/B run over several arms.

Each arm is an address that leads (directly or through a proxy) to `mock_upstream.py`. Two
clients take part, each with one keep-alive connection per arm, at concurrency 1:

- `raw`: plain asyncio, the request written in one write, every read stamped on arrival;
- `sdk`: the official `openai` SDK (`AsyncOpenAI`, its own HTTP client and SSE parser).

Every request is a streamed chat completion with `Authorization: Bearer` and no `stream_options`
(a metering proxy asks for usage upstream and strips it again). Every round sends one request per
(client, arm), in a fresh random order. Per client and arm:

- TTFT: request start to the arrival of the first event carrying a stamp; added TTFT is the
  difference from the same client's `direct` arm in the same round (paired);
- event delay: arrival minus the upstream's `tm_sent_ns` stamp (both CLOCK_MONOTONIC) of every
  event; added event delay is a quantile minus the same quantile of `direct`;
- for `raw` also the head's arrival, whether the head and the first event came in one read, and
  TTFT split at the upstream's receipt of the request (`x-mock-received-ns`): the way there
  (request start to the upstream's read) and the way back (from there to the first event).

Prints one JSON object on stdout; progress and a short table on stderr.

    python ab_client.py --arm direct=127.0.0.1:P1 --arm tokenmeter=127.0.0.1:P2 [...]
        [--rounds 200] [--events 16] [--clients raw,sdk] [--warmup 10] [--prompt-chars 0]

`--prompt-chars N` sends a user message of N characters of source-like text instead of "hello":
an agent's request is tens of KB.
"""

import argparse
import asyncio
import gc
import json
import os
import random
import sys
import time

KEY = b'"tm_sent_ns":'
API_KEY = "sk-overhead-bench-0123456789"
# The user message every request sends (`--prompt-chars`).
PROMPT = "hello"


def prompt_of(chars: int) -> str:
    """`chars` characters of source-like text (lines, indentation, quotes), or "hello" for 0."""
    if chars <= 0:
        return "hello"
    unit = 'def step(state, n):\n    """Advance the state."""\n    return [s + n for s in state]\n\n'
    return (unit * (chars // len(unit) + 1))[:chars]


def stamps(data: bytes):
    """Every `tm_sent_ns` value in `data`."""
    out = []
    i = data.find(KEY)
    while i >= 0:
        j = i + len(KEY)
        k = j
        while k < len(data) and 48 <= data[k] <= 57:
            k += 1
        if k > j:
            out.append(int(data[j:k]))
        i = data.find(KEY, k)
    return out


def body(events: int) -> bytes:
    return json.dumps(
        {
            "model": "mock-model",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": events,
            "stream": True,
        },
        separators=(",", ":"),
    ).encode()


class Result:
    """What one streamed request saw (monotonic ns)."""

    def __init__(self):
        self.ok = False
        self.t0 = 0
        self.head_ns = None
        self.first_ns = None
        self.first_with_head = False
        self.delays_ns = []
        self.upstream_received_ns = None


class RawConn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection that parses a chunked SSE response as reads arrive."""

    def __init__(self):
        self.transport = None
        self.result = None
        self.done = None
        self.lost = False

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        self.lost = True
        if self.done is not None and not self.done.done():
            self.done.set_result(False)

    def begin(self, request: bytes, result: Result):
        self.result = result
        self.buf = b""
        self.state = "head"
        self.left = 0
        self.sse = b""
        self.done = asyncio.get_running_loop().create_future()
        result.t0 = time.monotonic_ns()
        self.transport.write(request)

    def data_received(self, data):
        now = time.monotonic_ns()
        r = self.result
        if r is None or self.done.done():
            return
        self.buf += data
        had_head = r.head_ns is not None
        while True:
            if self.state == "head":
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buf[:end]
                self.buf = self.buf[end + 4 :]
                if not head.startswith(b"HTTP/1.1 200"):
                    self.done.set_result(False)
                    return
                if b"transfer-encoding: chunked" not in head.lower():
                    self.done.set_result(False)
                    return
                r.head_ns = now
                i = head.lower().find(b"x-mock-received-ns:")
                if i >= 0:
                    r.upstream_received_ns = int(head[i + 19 :].split(b"\r\n")[0])
                self.state = "size"
            elif self.state == "size":
                end = self.buf.find(b"\r\n")
                if end < 0:
                    return
                self.left = int(self.buf[:end].split(b";")[0], 16)
                self.buf = self.buf[end + 2 :]
                if self.left == 0:
                    self.state = "trailer"
                else:
                    self.state = "data"
            elif self.state == "data":
                if not self.buf:
                    return
                take = self.buf[: self.left]
                self.buf = self.buf[len(take) :]
                self.left -= len(take)
                self.on_sse(take, now, had_head)
                if self.left == 0:
                    self.state = "crlf"
            elif self.state == "crlf":
                if len(self.buf) < 2:
                    return
                self.buf = self.buf[2:]
                self.state = "size"
            elif self.state == "trailer":
                if len(self.buf) < 2:
                    return
                r.ok = r.ok or self.sse.endswith(b"data: [DONE]\n\n")
                self.done.set_result(r.ok)
                return

    def on_sse(self, data, now, had_head):
        r = self.result
        self.sse = (self.sse + data)[-64:]
        for s in stamps(data):
            if r.first_ns is None:
                r.first_ns = now
                r.first_with_head = not had_head
            r.delays_ns.append(now - s)


class RawClient:
    """The plain asyncio client of one arm: one connection, reopened if the peer closes it."""

    def __init__(self, addr):
        self.host, port = addr.rsplit(":", 1)
        self.port = int(port)
        self.conn = None

    async def stream(self, events):
        loop = asyncio.get_running_loop()
        if self.conn is None or self.conn.lost:
            _, self.conn = await loop.create_connection(RawConn, self.host, self.port)
        b = body(events)
        req = (
            b"POST /v1/chat/completions HTTP/1.1\r\n"
            b"Host: %s:%d\r\n"
            b"Authorization: Bearer %s\r\n"
            b"Content-Type: application/json\r\n"
            b"Accept: text/event-stream\r\n"
            b"Content-Length: %d\r\n\r\n%s"
        ) % (self.host.encode(), self.port, API_KEY.encode(), len(b), b)
        r = Result()
        self.conn.begin(req, r)
        try:
            await asyncio.wait_for(self.conn.done, 30)
        except asyncio.TimeoutError:
            self.conn.transport.close()
            self.conn = None
        return r


class SdkClient:
    """The official `openai` SDK's async client of one arm (its own connection pool)."""

    def __init__(self, addr):
        import openai

        self.client = openai.AsyncOpenAI(
            base_url=f"http://{addr}/v1", api_key=API_KEY, max_retries=0, timeout=30
        )

    async def stream(self, events):
        r = Result()
        r.t0 = time.monotonic_ns()
        try:
            s = await self.client.chat.completions.create(
                model="mock-model",
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=events,
                stream=True,
            )
            r.head_ns = time.monotonic_ns()
            n = 0
            async for chunk in s:
                now = time.monotonic_ns()
                stamp = (chunk.model_extra or {}).get("tm_sent_ns")
                if stamp is None:
                    continue
                if r.first_ns is None:
                    r.first_ns = now
                r.delays_ns.append(now - int(stamp))
                n += 1
            r.ok = n == events
        except Exception as e:  # an error is counted, not fatal: the run goes on
            print(f"sdk: {type(e).__name__}: {e}", file=sys.stderr)
        return r


def pct(v, q):
    """Nearest-rank percentile `q` (0..100) of `v`; None when empty."""
    if not v:
        return None
    s = sorted(v)
    rank = max(1, -(-q * len(s) // 100))
    return s[min(int(rank), len(s)) - 1]


def sub(a, b):
    return None if a is None or b is None else a - b


def summarize(name, arms, res, base="direct"):
    """Per arm of one client: raw and added TTFT, event delays, head/first-event shape."""
    out = {}
    b = res[base]
    d50, d99 = pct(b["delays"], 50), pct(b["delays"], 99)
    for arm in arms:
        a = res[arm]
        paired = [
            (x - y) / 1e3
            for x, y in zip(a["ttft"], b["ttft"])
            if x is not None and y is not None
        ]
        ttft = [x / 1e3 for x in a["ttft"] if x is not None]
        heads = [x / 1e3 for x in a["head"] if x is not None]
        there = [x / 1e3 for x in a["there"] if x is not None]
        there_paired = [
            (x - y) / 1e3 for x, y in zip(a["there"], b["there"]) if x is not None and y is not None
        ]
        back_paired = [
            (x - y) / 1e3 for x, y in zip(a["back"], b["back"]) if x is not None and y is not None
        ]
        firsts = a["first_with_head"]
        d = a["delays"]
        out[arm] = {
            "ttft_us_p50": pct(ttft, 50),
            "head_us_p50": pct(heads, 50),
            "added_ttft_us": {"p50": pct(paired, 50), "p90": pct(paired, 90), "p99": pct(paired, 99)},
            "ttft_pairs": len(paired),
            "way_there_us_p50": pct(there, 50),
            "added_way_there_us_p50": pct(there_paired, 50),
            "added_way_back_us_p50": pct(back_paired, 50),
            "event_delay_us": {"p50": pct(d, 50), "p99": pct(d, 99)},
            "added_event_delay_us": {"p50": sub(pct(d, 50), d50), "p99": sub(pct(d, 99), d99)},
            "events": len(d),
            "first_event_with_head": (sum(firsts) / len(firsts)) if (name == "raw" and firsts) else None,
            "errors": a["errors"],
        }
    return out


async def run(a):
    arms = [x.split("=", 1)[0] for x in a.arm]
    addrs = dict(x.split("=", 1) for x in a.arm)
    if "direct" not in addrs:
        sys.exit("ab_client: one arm must be named direct (the baseline)")
    kinds = {"raw": RawClient, "sdk": SdkClient}
    clients = [c for c in a.clients.split(",") if c]
    conns = {(c, arm): kinds[c](addrs[arm]) for c in clients for arm in arms}
    res = {
        c: {arm: {"ttft": [], "head": [], "there": [], "back": [], "delays": [], "first_with_head": [], "errors": 0} for arm in arms}
        for c in clients
    }
    pairs = list(conns)
    rng = random.Random(a.seed)
    for _ in range(a.warmup):
        for p in pairs:
            await conns[p].stream(a.events)
    gc.collect()
    gc.freeze()
    gc.disable()
    started = time.monotonic()
    for i in range(a.rounds):
        rng.shuffle(pairs)
        for c, arm in pairs:
            r = await conns[(c, arm)].stream(a.events)
            slot = res[c][arm]
            if not r.ok:
                slot["errors"] += 1
            slot["ttft"].append(None if r.first_ns is None else r.first_ns - r.t0)
            slot["head"].append(None if r.head_ns is None else r.head_ns - r.t0)
            slot["first_with_head"].append(r.first_with_head)
            up = r.upstream_received_ns
            slot["there"].append(None if up is None else up - r.t0)
            slot["back"].append(None if up is None or r.first_ns is None else r.first_ns - up)
            # The stamp delays in microseconds.
            slot["delays"].extend(d / 1e3 for d in r.delays_ns)
        gc.collect()
        if (i + 1) % 50 == 0:
            print(f"ab_client: {i + 1}/{a.rounds} rounds, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    gc.enable()
    out = {
        "rounds": a.rounds,
        "events_per_request": a.events,
        "seconds": time.monotonic() - started,
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "arms": arms,
        "clients": {c: summarize(c, arms, res[c]) for c in clients},
    }
    for c in clients:
        print(f"\n{c}: arm, TTFT p50, +TTFT p50, +there p50, +back p50, +event p50, first event with head, errors", file=sys.stderr)
        for arm, v in out["clients"][c].items():
            f = lambda x: "-" if x is None else f"{x:.1f}"
            print(
                f"  {arm}: {f(v['ttft_us_p50'])} {f(v['added_ttft_us']['p50'])} "
                f"{f(v['added_way_there_us_p50'])} {f(v['added_way_back_us_p50'])} "
                f"{f(v['added_event_delay_us']['p50'])} {v['first_event_with_head']} {v['errors']}",
                file=sys.stderr,
            )
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arm", action="append", required=True, help="NAME=HOST:PORT")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--events", type=int, default=16)
    p.add_argument("--clients", default="raw,sdk")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--prompt-chars", type=int, default=0)
    args = p.parse_args()
    global PROMPT
    PROMPT = prompt_of(args.prompt_chars)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
