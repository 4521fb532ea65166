"""A streaming chat upstream in plain asyncio, for the overhead benchmark's Python peers.

It answers `POST /v1/chat/completions` with a chunked `text/event-stream` the way a Python ASGI
server in front of vLLM does: the response head in one write, then each event in a write of its
own, the first one a loop turn after the head (so head and first event leave as separate TCP
segments), the others `--gap-ms` apart. Every event carries `tm_sent_ns`, this process's
CLOCK_MONOTONIC at the write, which the client subtracts from its own receive time (same clock,
same machine). The head's `x-mock-received-ns` is the time the request's last byte was read, so
a client can split its TTFT into the way there and the way back. When the request asks for `stream_options.include_usage`, a usage-only event
(`"choices": []`) comes before `data: [DONE]`, as vLLM sends it.

`GET /v1/models` answers 200 so the harness can wait for readiness.

    python mock_upstream.py --listen 127.0.0.1:PORT [--gap-ms 2]
"""

import argparse
import asyncio
import json
import socket
import time

HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n"
    b"x-mock-received-ns: %d\r\n"
    b"\r\n"
)
MODELS = json.dumps({"object": "list", "data": [{"id": "mock-model", "object": "model"}]}).encode()


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(obj) -> bytes:
    """One SSE event, as a chunk."""
    return chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


class Stream:
    """One streamed answer on a connection: its events, written on the loop's timers."""

    def __init__(self, conn, n_events, usage, gap_s, received_ns):
        self.conn = conn
        self.received_ns = received_ns
        self.n = n_events
        self.usage = usage
        self.gap_s = gap_s
        self.sent = 0
        self.created = int(time.time())

    def start(self):
        loop = asyncio.get_running_loop()
        self.conn.write(HEAD % self.received_ns)
        self.t0 = loop.time()
        # One loop turn later: the head and the first event are two writes, two segments.
        loop.call_soon(self.next)

    def next(self):
        conn = self.conn
        if conn.closed:
            return
        i = self.sent
        last = i == self.n - 1
        delta = {"role": "assistant", "content": "tok"} if i == 0 else {"content": " tok"}
        conn.write(
            event(
                {
                    "id": "chatcmpl-mock",
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": "mock-model",
                    "choices": [
                        {
                            "index": 0,
                            "delta": delta,
                            "logprobs": None,
                            "finish_reason": "length" if last else None,
                        }
                    ],
                    "tm_sent_ns": time.monotonic_ns(),
                }
            )
        )
        self.sent += 1
        if not last:
            loop = asyncio.get_running_loop()
            loop.call_at(self.t0 + self.sent * self.gap_s, self.next)
            return
        tail = b""
        if self.usage:
            tail += event(
                {
                    "id": "chatcmpl-mock",
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": "mock-model",
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 1,
                        "completion_tokens": self.n,
                        "total_tokens": self.n + 1,
                    },
                }
            )
        tail += chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        conn.write(tail)
        conn.busy = False
        conn.serve_buffered()


class Conn(asyncio.Protocol):
    """One client connection: HTTP/1.1 requests in order, keep-alive."""

    def __init__(self, gap_s):
        self.gap_s = gap_s
        self.buf = b""
        self.busy = False
        self.closed = False
        self.received_ns = 0

    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc):
        self.closed = True

    def write(self, data):
        if not self.closed:
            self.transport.write(data)

    def data_received(self, data):
        self.received_ns = time.monotonic_ns()
        self.buf += data
        self.serve_buffered()

    def serve_buffered(self):
        """Answers the next complete request in the buffer, if any and if none is streaming."""
        if self.busy or self.closed:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].decode("latin-1").split("\r\n")
        length = 0
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4 : end + 4 + length]
        self.buf = self.buf[end + 4 + length :]
        method, target = head[0].split(" ")[:2]
        if method == "GET" and target.endswith("/models"):
            self.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(MODELS), MODELS)
            )
            return self.serve_buffered()
        if method != "POST" or not target.endswith("/chat/completions"):
            self.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            return self.serve_buffered()
        req = json.loads(body)
        n = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        usage = bool((req.get("stream_options") or {}).get("include_usage"))
        self.busy = True
        Stream(self, max(n, 1), usage, self.gap_s, self.received_ns).start()


async def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--gap-ms", type=float, default=2.0)
    a = p.parse_args()
    host, port = a.listen.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Conn(a.gap_ms / 1e3), host, int(port), backlog=1024)
    addr = server.sockets[0].getsockname()
    print(f"listening on {addr[0]}:{addr[1]}", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
