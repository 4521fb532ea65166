#!/usr/bin/env python3
"""Code a proxy touches per request, counted by callgrind: the cold-cache cost of a request.

With agents' traffic (seconds between a user's requests, other work in between) a request finds
none of the proxy's code in the CPU's caches, and each 64-byte line of code it runs is a miss.
The count of such lines repeats exactly between runs, where the added TTFT of one run differs
from the next by tens of microseconds (docs/performance.md, issue 37).

Four windows, each over the same keep-alive chat stream request (a bearer key, no
`stream_options`, as the overhead benchmark's Python peers send it), through the simulator:

- `tokenmeter handler`: the request's handler (`forward::handle`) and the front's build of its
  head, less what the toggles can cut out of what runs after the upstream write (the admission,
  the identification, the response head's parse and framing, its hop-by-hop fields, the metered
  body's setup): about the work between the client's request and the upstream write (the
  front's parse of the head, inlined in its loop, is not in it);
- `tokenmeter response head`: the upstream's response head read, parsed and framed, what the
  handler makes of it (its content type, the metered body) and the client's head encoded;
- `tokenmeter whole`: everything the process runs per request, all threads;
- `nginx whole`: the same for nginx (one worker, no master, access log on), when installed.

A line counts when an instruction in it ran in at least half of the requests (a connect or a
timer that fires once in the run does not).

    scripts/footprint.py [--bin target/release/tokenmeter] [--nginx /usr/sbin/nginx|none]
                         [--requests 200] [--top 25] [--post-write f1,f2]
"""

import argparse
import collections
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BODY = (b'{"model":"sim-model","messages":[{"role":"user","content":"hello"}],'
        b'"max_tokens":16,"stream":true}')
# The handler window: entered with these functions, left inside the ones after the write.
HANDLER_TOGGLES = [
    "tokenmeter::proxy::forward::handle::*",
    "tokenmeter::proxy::front_h1::build",
    "tokenmeter::proxy::forward::admit",
    "tokenmeter::proxy::admission::admit",
    "tokenmeter::proxy::upstream_h1::H1Conn<T>::poll_parse_head",
    "tokenmeter::proxy::body::MeteredBody::new",
    "tokenmeter::proxy::body::Reading::for_response",
    "tokenmeter::proxy::h1_message::frame_head",
    "tokenmeter::proxy::body::content_type_starts",
]
# The response head's window: its parse and framing, what the handler makes of it, and the
# client head's encoding (the names of this build and of the builds before 324f682; none of them
# runs inside another for a stream).
RESPONSE_HEAD_TOGGLES = [
    "tokenmeter::proxy::upstream_h1::H1Conn<T>::poll_parse_head",
    "tokenmeter::proxy::h1_message::frame_head",
    "tokenmeter::proxy::body::content_type_starts",
    "tokenmeter::proxy::headers::strip_hop_by_hop",
    "tokenmeter::proxy::body::Reading::for_response",
    "tokenmeter::proxy::body::MeteredBody::new",
    "tokenmeter::proxy::front_h1::encode_head",
]
# The admission: what is recorded of the request once it is written upstream (its identity, what
# its body says, its session's clues, the observers told), while the upstream works on it.
ADMISSION_TOGGLES = ["tokenmeter::proxy::admission::admit"]
# What ran after the upstream write in the builds from 856780a to 9785a7e, named as then, but
# before it in older ones (`--post-write`; later builds run neither, and the admission's toggle
# covers what replaced them). A toggle flips collection on every entry: a function that runs
# inside one already left out (identification, inside the admission) must not be listed.
POST_WRITE = "headers::strip_hop_by_hop,deferred_identity::deferred_identity"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, what):
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"footprint.py: {what} does not answer on port {port}")


def requests(port, n):
    """`n` streamed chat requests on one keep-alive connection, 20 ms apart, each read whole."""
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
            b"authorization: Bearer sk-footprint-0123456789\r\ncontent-type: application/json\r\n"
            b"accept: */*\r\nuser-agent: footprint/1\r\ncontent-length: %d\r\n\r\n") % (port, len(BODY))
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            s.sendall(head + BODY)
            got = b""
            while not got.endswith(b"0\r\n\r\n"):
                d = s.recv(65536)
                if not d:
                    sys.exit(f"footprint.py: the connection closed: {got[:200]!r}")
                got += d
            time.sleep(0.02)


def lines_touched(path, n):
    """Per function: the code lines with an instruction run at least n/2 times, and its self Ir."""
    names, fn, addr, skip = {}, None, 0, False
    lines = collections.defaultdict(set)
    ir = collections.Counter()
    least = max(1, n // 2)
    pos_re = re.compile(r"^(ob|fl|fi|fe|fn|cob|cfi|cfl|cfn)=\((\d+)\)(?: (.*))?$")
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not line:
                continue
            m = pos_re.match(line)
            if m:
                kind, id_, name = m.groups()
                if name is not None and kind in ("fn", "cfn"):
                    names[id_] = name
                if kind == "fn":
                    fn = names.get(id_, id_)
                continue
            if line.startswith("calls="):
                # The next cost line is a call's inclusive cost.
                skip = True
                continue
            if line[0] in "0123456789+-*":
                parts = line.split()
                tok = parts[0]
                if tok.startswith("+"):
                    addr += int(tok[1:], 0)
                elif tok.startswith("-"):
                    addr -= int(tok[1:], 0)
                elif tok != "*":
                    addr = int(tok, 0)
                if skip:
                    skip = False
                    continue
                cost = int(parts[2]) if len(parts) > 2 else 0
                ir[fn] += cost
                if cost >= least:
                    lines[fn].add(addr >> 6)
    return lines, ir


def profile(cmd, port, n, toggles, out_dir, name, env=None):
    """Runs `cmd` under callgrind, warms it, counts `n` requests, returns (lines, ir)."""
    out = os.path.join(out_dir, name)
    args = ["valgrind", "--tool=callgrind", "--dump-instr=yes", f"--callgrind-out-file={out}"]
    if toggles:
        args.append("--collect-atstart=no")
        args += [f"--toggle-collect={t}" for t in toggles]
    log = open(os.path.join(out_dir, name + ".log"), "w")
    proc = subprocess.Popen(args + cmd, stdout=log, stderr=log, env=env)
    try:
        wait_port(port, name)
        requests(port, 50)
        subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True,
                       stdout=subprocess.DEVNULL)
        requests(port, n)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True,
                       stdout=subprocess.DEVNULL)
        time.sleep(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    dumps = [f for f in os.listdir(out_dir) if f.startswith(name + ".") and f.endswith(".1")]
    if not dumps:
        sys.exit(f"footprint.py: no dump from {name}")
    return lines_touched(os.path.join(out_dir, dumps[0]), n)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/tokenmeter"))
    ap.add_argument("--nginx", default="/usr/sbin/nginx")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--post-write", default=POST_WRITE,
                    help="functions of tokenmeter::proxy (comma-separated) that run after the "
                    "upstream write in the build measured; '' for a build before 856780a")
    o = ap.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("footprint.py: valgrind is not installed")
    d = tempfile.mkdtemp(prefix="tm-footprint-")
    sim_port = free_port()
    sim = subprocess.Popen([o.bin, "sim", "--listen", f"127.0.0.1:{sim_port}", "--fixed-pace",
                            "--fixed-ttft-ms", "0", "--fixed-gap-ms", "1", "--max-num-seqs",
                            "100000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_port(sim_port, "the simulator")
        env = dict(os.environ, TOKENMETER_LOG="warn")
        post = [f"tokenmeter::proxy::{f}" for f in o.post_write.split(",") if f]
        for name, toggles in (("handler", HANDLER_TOGGLES + post),
                              ("response head", RESPONSE_HEAD_TOGGLES),
                              ("admission", ADMISSION_TOGGLES), ("whole", None)):
            port = free_port()
            cmd = [o.bin, "serve", "--listen", f"127.0.0.1:{port}", "--upstream",
                   f"http://127.0.0.1:{sim_port}", "--access-log",
                   os.path.join(d, f"access-{name.replace(' ', '-')}.jsonl")]
            rows.append((f"tokenmeter {name}",) + profile(cmd, port, o.requests, toggles, d,
                                                           f"tm-{name.replace(' ', '-')}", env))
        if o.nginx != "none" and os.path.exists(o.nginx):
            port = free_port()
            ng = os.path.join(d, "nginx")
            os.makedirs(ng)
            conf = os.path.join(ng, "nginx.conf")
            with open(conf, "w") as f:
                f.write(f"""worker_processes 1; master_process off; daemon off; pid {ng}/nginx.pid;
error_log {ng}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log {ng}/access.log;
  client_body_temp_path {ng}/b; proxy_temp_path {ng}/p; fastcgi_temp_path {ng}/f;
  uwsgi_temp_path {ng}/u; scgi_temp_path {ng}/s;
  keepalive_requests 100000;
  upstream sim {{ server 127.0.0.1:{sim_port}; keepalive 1024; keepalive_requests 100000; }}
  server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://sim;
    proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off;
    proxy_read_timeout 600s; }} }}
}}
""")
            rows.append(("nginx whole",) + profile([o.nginx, "-p", ng, "-c", conf], port,
                                                   o.requests, None, d, "ngx"))
    finally:
        sim.terminate()
        sim.wait(timeout=30)
        if os.environ.get("KEEP") != "1":
            shutil.rmtree(d, ignore_errors=True)
    n = o.requests
    print(f"## Code touched per request ({n} requests; a line counts when run in half of them)\n")
    print("| window | code lines | KiB | instructions per request |\n|---|---|---|---|")
    for name, lines, ir in rows:
        total = set().union(*lines.values()) if lines else set()
        print(f"| {name} | {len(total)} | {len(total) * 64 / 1024:.1f} | "
              f"{sum(ir.values()) / n:.0f} |")
    for name, lines, ir in rows[:1]:
        print(f"\n## {name}: the functions with the most lines\n")
        print("| lines | instructions per request | function |\n|---|---|---|")
        for fn, s in sorted(lines.items(), key=lambda kv: -len(kv[1]))[:o.top]:
            print(f"| {len(s)} | {ir[fn] / n:.0f} | `{fn[:120]}` |")


if __name__ == "__main__":
    main()
