//! TTFT breakdown: what tokenmeter does before the first byte of a stream leaves, stage by stage,
//! in nanoseconds, for issue 19's request shape (a streamed chat completion with an
//! `Authorization: Bearer` key and no `stream_options`, so the proxy injects `include_usage`).
//!
//! `cargo bench --bench ttft_breakdown -- [--iters 2000] [--e2e-only] [--evict-mb N] [--metering-off] [--nginx PATH|none]`
//!
//! With `--evict-mb N`, end to end runs cold the way agents' traffic leaves a proxy: before each
//! request a thread on every CPU walks N MB of memory, so the caches hold none of the proxy's
//! code or data (what the Python peers of `benches/overhead` do between two requests, minus
//! their noise).
//!
//! Three parts:
//! 1. **Stages in isolation**: each piece of `proxy::forward`'s work before the upstream request,
//!    called through the library with the same inputs the proxy sees, timed per call (median of 15
//!    batches, the cost of reading the clock subtracted).
//! 2. **End to end, in process**: the real proxy (`app::spawn`, access log and metering on) in
//!    front of a raw-socket upstream that stamps when the request arrives and when it answers. A
//!    raw-socket client stamps send and first byte. From CLOCK_MONOTONIC on every side:
//!    request path = upstream saw the request − client sent it; response path = client got the
//!    first byte − upstream wrote it; each minus the same quantity with the client talking to the
//!    upstream directly. nginx (one worker, access log on, the overhead harness's configuration)
//!    is measured the same way when it is installed, so the two proxies compare in one run. Warm (one keep-alive connection) and cold (a new client connection per
//!    request, the proxy's upstream pool warm: adds the accept, on the serving thread whose
//!    listener the kernel picked).
//! 3. **The upstream round trip**: request sent -> first body frame through hyper-util's pooled
//!    client (how the proxy sent before `proxy/pool.rs`) against hyper's own `client::conn` handle
//!    on one kept connection (what that pool kept until `proxy/upstream_h1.rs` replaced it), same
//!    runtime, same raw upstream: what hyper-util's pool added per request. The proxy's own
//!    connection is crate-private; part 2 times it inside the real proxy.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[path = "overhead/procs.rs"]
#[allow(dead_code)]
mod procs;
mod support;

use std::hint::black_box;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body_util::{BodyExt, Full, Limited};
use tokenmeter::clock::monotonic_ns;
use tokenmeter::config::UsersConfig;
use tokenmeter::proxy::identity::{self, Clues};
use tokenmeter::proxy::request::{inject_include_usage, RequestInfo};
use tokenmeter::proxy::{RequestMeta, Tracker, TrackerShared};

const BODY: &[u8] =
    br#"{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":16,"stream":true}"#;
const KEY: &str = "sk-overhead-bench-0123456789";

fn request_head(host: &str, path: &str, body_len: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n\
authorization: Bearer {KEY}\r\nuser-agent: ttft-breakdown/1\r\ncontent-length: {body_len}\r\n\r\n"
    )
}

fn headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("host", HeaderValue::from_static("127.0.0.1:8000"));
    h.insert("content-type", HeaderValue::from_static("application/json"));
    h.insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {KEY}")).unwrap(),
    );
    h.insert("user-agent", HeaderValue::from_static("ttft-breakdown/1"));
    h.insert("content-length", HeaderValue::from_static("97"));
    h
}

/// ns per call of `f`: median over 15 batches of `n` calls, minus the median cost of the empty loop.
/// The body of a recorded agent request (`tests/fixtures/vllm/agents/sessions/<file>`), as the
/// agent sent it.
fn agent_body(file: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm/agents/sessions")
        .join(file);
    let recorded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).expect("recorded request")).expect("JSON");
    match &recorded["body"] {
        serde_json::Value::String(s) => s.clone().into_bytes(),
        v => serde_json::to_vec(v).expect("body"),
    }
}

fn per_call<R>(n: usize, mut f: impl FnMut() -> R) -> f64 {
    let batch = |f: &mut dyn FnMut()| {
        let mut v: Vec<f64> = (0..15)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..n {
                    f();
                }
                t.elapsed().as_nanos() as f64 / n as f64
            })
            .collect();
        v.sort_by(f64::total_cmp);
        v[7]
    };
    let empty = batch(&mut || {
        black_box(());
    });
    let full = batch(&mut || {
        black_box(f());
    });
    (full - empty).max(0.0)
}

fn meta(user: &str) -> RequestMeta {
    RequestMeta {
        user: user.into(),
        user_source: tokenmeter::record::UserSource::KeyHash,
        model: Some("sim-model".into()),
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        client_request_id: None,
        user_agent: Some("ttft-breakdown/1".into()),
        client_ip: None,
        api: tokenmeter::dialect::detect("/v1/chat/completions"),
        stream: Some(true),
        n: None,
        bytes_in: BODY.len() as u64,
        trace: None,
        session: None,
    }
}

/// Part 1: every stage of `forward` before the upstream request, alone.
fn stages(rt: &tokio::runtime::Runtime, n: usize) -> Vec<(&'static str, f64)> {
    let users = UsersConfig::default();
    let h = headers();
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let clues = Clues {
        path_user: None,
        headers: &h,
        body_user: None,
        client_ip: ip,
    };
    let mut out = Vec::new();
    out.push((
        "route: split_user_prefix + dialect::detect",
        per_call(n, || {
            let s = identity::split_user_prefix(black_box("/v1/chat/completions"));
            tokenmeter::dialect::detect(s.path)
        }),
    ));
    out.push((
        "identity: one identify() (default order, bearer key)",
        per_call(n, || identity::identify(&users, black_box(&clues))),
    ));
    out.push((
        "  of which key_pseudonym (SHA-256 + hex)",
        per_call(n, || identity::key_pseudonym(black_box(KEY))),
    ));
    out.push((
        "  of which known_key_name (SHA-256 + hex, no keys)",
        per_call(n, || identity::known_key_name(&users, black_box(KEY))),
    ));
    out.push((
        "request body collect (Limited<Full>, 97 B)",
        per_call(n, || {
            rt.block_on(async {
                let b = Limited::new(Full::new(Bytes::from_static(BODY)), 1 << 20);
                b.collect().await.unwrap().to_bytes()
            })
        }),
    ));
    out.push((
        "  the same block_on around nothing (subtract)",
        per_call(n, || rt.block_on(async { black_box(1) })),
    ));
    out.push((
        "RequestInfo::parse",
        per_call(n, || RequestInfo::parse(black_box(BODY))),
    ));
    // The agents' own requests are far larger than the bench's: the same read on recorded
    // Claude Code (Messages) and Codex CLI (Responses) requests.
    for (label, file) in [
        ("  on a Claude Code request", "claude/006_request.json"),
        ("  on a Codex CLI request", "codex/006_request.json"),
    ] {
        let body = agent_body(file);
        let name: &'static str =
            Box::leak(format!("{label} ({} KB)", body.len() / 1000).into_boxed_str());
        out.push((name, per_call(n, || RequestInfo::parse(black_box(&body)))));
    }
    let info = RequestInfo::parse(BODY);
    out.push((
        "inject_include_usage",
        per_call(n, || inject_include_usage(black_box(BODY), &info)),
    ));
    out.push((
        "request meta (strings, user agent)",
        per_call(n, || meta(black_box("key-0123abcd"))),
    ));
    let meter = tokenmeter::meter::spawn_meter(tokenmeter::meter::MeterConfig::default());
    let shared = Arc::new(TrackerShared::new(
        vec![Arc::new(meter.clone())],
        Duration::from_secs(5),
    ));
    // Start, id, admit (the meter hears of the request) and drop (finish: the meter and observers
    // hear of the end, after the stream in reality): timed separately within one loop.
    let (mut start_ns, mut admit_ns, mut drop_ns) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n.max(1000) {
        let m = meta("key-0123abcd");
        let t = Instant::now();
        let mut tr = Tracker::start(shared.clone(), t, m, true);
        let id = tr.request_id();
        let t1 = Instant::now();
        tr.admit();
        let t2 = Instant::now();
        drop(tr);
        let t3 = Instant::now();
        black_box(id);
        start_ns.push((t1 - t).as_nanos() as f64);
        admit_ns.push((t2 - t1).as_nanos() as f64);
        drop_ns.push((t3 - t2).as_nanos() as f64);
    }
    let clock = per_call(n, Instant::now);
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2] - clock).max(0.0)
    };
    out.push(("Tracker::start + request_id", med(&mut start_ns)));
    out.push(("Tracker::admit (observers.started)", med(&mut admit_ns)));
    out.push((
        "Tracker drop before finish (after the stream in reality)",
        med(&mut drop_ns),
    ));
    let host = HeaderValue::from_static("127.0.0.1:9000");
    out.push((
        "header rewrite + upstream URI",
        per_call(n, || {
            let mut h = h.clone();
            tokenmeter::proxy::strip_hop_by_hop(&mut h);
            h.remove(http::header::EXPECT);
            h.remove(http::header::CONTENT_LENGTH);
            h.remove("x-tokenmeter-user");
            h.insert(http::header::HOST, host.clone());
            h.insert(
                "x-request-id",
                HeaderValue::from_static("tm-00000000-00000001"),
            );
            let u = http::Uri::try_from(format!(
                "http://127.0.0.1:9000{}",
                black_box("/v1/chat/completions")
            ))
            .unwrap();
            (h, u)
        }),
    ));
    out.push((
        "  of which the HeaderMap clone (subtract)",
        per_call(n, || h.clone()),
    ));
    out
}

/// Stamps the raw upstream records per request: (request fully read, response written).
type Stamps = Arc<Mutex<Vec<(u64, u64)>>>;

/// Reads one request (head and `content-length` body) into `buf`; false at end of stream.
async fn read_request(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> bool {
    use tokio::io::AsyncReadExt;
    buf.clear();
    let mut tmp = [0u8; 4096];
    loop {
        if let Some(end) = memchr::memmem::find(buf, b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end])
                .unwrap_or("")
                .to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return true;
            }
        }
        match s.read(&mut tmp).await {
            Ok(0) | Err(_) => return false,
            Ok(k) => buf.extend_from_slice(&tmp[..k]),
        }
    }
}

/// A keep-alive HTTP/1.1 upstream on raw sockets (one current-thread runtime on a thread of its
/// own, a task per connection, so a new connection costs an accept and a task, as in a server):
/// answers every request with one SSE event, then `[DONE]` 200 µs later, stamping arrival and
/// answer.
fn raw_upstream(stamps: Stamps) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            loop {
                let Ok((s, _)) = l.accept().await else {
                    continue;
                };
                tokio::spawn(serve_raw(s, stamps.clone()));
            }
        });
    });
    addr
}

async fn serve_raw(mut s: tokio::net::TcpStream, stamps: Stamps) {
    use tokio::io::AsyncWriteExt;
    s.set_nodelay(true).unwrap();
    let mut buf = Vec::new();
    let event = b"data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"sim-model\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"hi\"},\"finish_reason\":null}]}\n\n";
    let mut resp = Vec::new();
    resp.extend_from_slice(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
    );
    resp.extend_from_slice(format!("{:x}\r\n", event.len()).as_bytes());
    resp.extend_from_slice(event);
    resp.extend_from_slice(b"\r\n");
    let done = b"data: [DONE]\n\n";
    let tail = [
        format!("{:x}\r\n", done.len()).into_bytes(),
        done.to_vec(),
        b"\r\n0\r\n\r\n".to_vec(),
    ]
    .concat();
    while read_request(&mut s, &mut buf).await {
        let t1 = monotonic_ns();
        let t2 = monotonic_ns();
        if s.write_all(&resp).await.is_err() {
            return;
        }
        // The rest a little later, so the first event travels alone as in a stream.
        tokio::time::sleep(Duration::from_micros(200)).await;
        if s.write_all(&tail).await.is_err() {
            return;
        }
        stamps.lock().unwrap().push((t1, t2));
    }
}

/// Evicts every CPU's caches: a thread pinned to each CPU writes a byte in every 64-byte line of
/// `buf` (its own slice of it). Data in L1/L2 and the shared LLC, and code in the unified L2 and
/// the LLC, are replaced; the next request runs as it would after another program ran.
fn evict(buf: &mut [u8]) {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let chunk = buf.len().div_ceil(cpus);
    std::thread::scope(|s| {
        for (cpu, part) in buf.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                pin_to(cpu);
                // Twice over its own slice, then once over the rest is not needed: each CPU's
                // private caches are far smaller than its slice, and the slices cover the LLC.
                for _ in 0..2 {
                    for line in part.chunks_mut(64) {
                        line[0] = line[0].wrapping_add(1);
                    }
                }
                black_box(&part[0]);
            });
        }
    });
}

#[allow(unsafe_code)]
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it; the call reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Sends one request on `s`; returns (sent, first event byte received), reading to the end.
fn one(s: &mut TcpStream, head: &[u8], body: &[u8], buf: &mut Vec<u8>) -> (u64, u64) {
    buf.clear();
    let mut tmp = [0u8; 8192];
    let t0 = monotonic_ns();
    s.write_all(head).unwrap();
    s.write_all(body).unwrap();
    let mut first = None;
    loop {
        let k = s.read(&mut tmp).unwrap();
        assert!(k > 0, "connection closed: {}", String::from_utf8_lossy(buf));
        let now = monotonic_ns();
        buf.extend_from_slice(&tmp[..k]);
        if first.is_none() && memchr::memmem::find(buf, b"data: {").is_some() {
            first = Some(now);
        }
        if buf.ends_with(b"0\r\n\r\n") {
            return (t0, first.expect("an event before the end"));
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Part 2: request path and response path, through the proxy and direct, warm and cold, for the
/// bench's chat request (the proxy injects `include_usage`) and, warm, for a recorded Claude Code
/// request (`/v1/messages`, tens of KB: nothing in it is changed on the way).
fn end_to_end(
    rt: &tokio::runtime::Runtime,
    n: usize,
    evict_mb: usize,
    metering: bool,
    nginx: Option<&std::path::Path>,
) -> Vec<(String, f64)> {
    let mut evicted = vec![0u8; evict_mb << 20];
    let stamps: Stamps = Arc::default();
    let up = raw_upstream(stamps.clone());
    let dir = std::env::temp_dir().join(format!("tm-ttft-breakdown-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = tokenmeter::config::ServeConfig {
        listen: "127.0.0.1:0".into(),
        upstream: format!("http://{up}"),
        access_log: Some(dir.join("access.jsonl")),
        metering,
        ..Default::default()
    };
    let proxy = rt
        .block_on(tokenmeter::app::spawn(config, Vec::new()))
        .unwrap();
    let px = proxy.addr();
    let mut arms = vec![("direct", up)];
    // Killed when this function returns.
    let mut _nginx_proc = None;
    if let Some(bin) = nginx {
        let ndir = dir.join("nginx");
        std::fs::create_dir_all(&ndir).unwrap();
        match procs::start_nginx(&ndir, "1", bin, up) {
            Ok((p, addr)) => {
                _nginx_proc = Some(p);
                arms.push(("nginx", addr));
            }
            Err(e) => println!("note: nginx did not start ({e}): its arm is skipped"),
        }
    }
    arms.push(("tokenmeter", px));
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let claude = agent_body("claude/006_request.json");
    let requests: [(&str, &str, &[u8], &[bool]); 2] = [
        ("", "/v1/chat/completions", BODY, &[false, true]),
        (
            ", Claude Code request",
            "/v1/messages?beta=true",
            &claude,
            &[false],
        ),
    ];
    // Arms interleave, one request each in turn (the order rotating), so a drift of the machine
    // reaches every arm alike.
    for &(request, path, body, kinds) in &requests {
        // nginx holds a body past its 16 KB buffer in a file before it sends it on: the large
        // request measures that, not the proxying.
        let arms: Vec<_> = arms
            .iter()
            .filter(|(arm, _)| body.len() < 16 << 10 || *arm != "nginx")
            .collect();
        for &cold in kinds {
            let connect = |addr: SocketAddr| {
                let s = TcpStream::connect(addr).unwrap();
                s.set_nodelay(true).unwrap();
                s
            };
            let heads: Vec<String> = arms
                .iter()
                .map(|(_, addr)| request_head(&addr.to_string(), path, body.len()))
                .collect();
            let mut conns: Vec<TcpStream> = arms.iter().map(|(_, addr)| connect(*addr)).collect();
            // Per arm: request path, response path, total.
            let mut times = vec![[Vec::new(), Vec::new(), Vec::new()]; arms.len()];
            for i in 0..n + 50 {
                for k in 0..arms.len() {
                    let a = (i + k) % arms.len();
                    if cold {
                        conns[a] = connect(arms[a].1);
                    }
                    stamps.lock().unwrap().clear();
                    if evict_mb > 0 {
                        evict(&mut evicted);
                    }
                    let (t0, t3) = one(&mut conns[a], heads[a].as_bytes(), body, &mut buf);
                    let (t1, t2) = loop {
                        if let Some(&p) = stamps.lock().unwrap().first() {
                            break p;
                        }
                        std::thread::sleep(Duration::from_micros(50));
                    };
                    if i >= 50 {
                        times[a][0].push((t1 - t0) as f64);
                        times[a][1].push((t3 - t2) as f64);
                        times[a][2].push((t3 - t0) as f64);
                    }
                }
            }
            let kind = if cold { "cold" } else { "warm" };
            for ((arm, _), [req_path, resp_path, total]) in arms.iter().zip(&mut times) {
                for (what, v) in [
                    ("request path (client sent -> upstream read)", req_path),
                    (
                        "response path (upstream wrote -> client first byte)",
                        resp_path,
                    ),
                    ("total (client sent -> first byte)", total),
                ] {
                    out.push((format!("{arm} {kind}{request}: {what}"), median(v)));
                }
            }
        }
    }
    rt.block_on(proxy.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// One streamed request through `send`, timed from the call to the first body frame, then read
/// to its end (so a pooled connection is free for the next).
async fn timed<F, Fut, E>(send: F) -> u64
where
    F: FnOnce(hyper::Request<Full<Bytes>>) -> Fut,
    Fut: std::future::Future<Output = Result<hyper::Response<hyper::body::Incoming>, E>>,
    E: std::fmt::Debug,
{
    let req = hyper::Request::post("http://127.0.0.1/v1/chat/completions")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(BODY)))
        .unwrap();
    let t0 = monotonic_ns();
    let mut body = send(req).await.unwrap().into_body();
    let _first = body.frame().await.unwrap().unwrap();
    let t1 = monotonic_ns();
    while body.frame().await.is_some() {}
    t1 - t0
}

/// Part 3: the upstream round trip (request sent -> first body frame) through hyper-util's pooled
/// client, as the proxy sent it before `proxy/pool.rs`, against hyper's own connection handle on
/// one kept connection: what that pool's checkout and return added per request.
fn client_paths(rt: &tokio::runtime::Runtime, n: usize) -> (f64, f64) {
    let up = raw_upstream(Arc::default());
    rt.block_on(async move {
        let pooled: hyper_util::client::legacy::Client<_, Full<Bytes>> =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_timer(hyper_util::rt::TokioTimer::new())
                .build_http();
        let uri: http::Uri = format!("http://{up}/v1/chat/completions").parse().unwrap();
        let stream = tokio::net::TcpStream::connect(up).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (mut conn, task) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(task);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for i in 0..n + 50 {
            let u = uri.clone();
            let ta = timed(|mut r| {
                *r.uri_mut() = u;
                pooled.request(r)
            })
            .await;
            conn.ready().await.unwrap();
            let tb = timed(|mut r| {
                *r.uri_mut() = "/v1/chat/completions".parse().unwrap();
                conn.send_request(r)
            })
            .await;
            // The first few connect and warm up.
            if i >= 50 {
                a.push(ta as f64);
                b.push(tb as f64);
            }
        }
        (median(&mut a), median(&mut b))
    })
}

fn main() {
    let mut n = 2000;
    let mut e2e_only = false;
    let mut evict_mb = 0;
    let mut metering = true;
    let mut nginx = Some(std::path::PathBuf::from("/usr/sbin/nginx")).filter(|p| p.exists());
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => {}
            "--e2e-only" => e2e_only = true,
            "--metering-off" => metering = false,
            "--evict-mb" => {
                evict_mb = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--evict-mb N");
            }
            "--nginx" => {
                let v = args.next().expect("--nginx PATH|none");
                nginx = (v != "none").then(|| v.into());
            }
            "--iters" => n = args.next().and_then(|v| v.parse().ok()).expect("--iters N"),
            _ => {
                println!(
                    "usage: cargo bench --bench ttft_breakdown -- [--iters 2000] [--e2e-only] [--evict-mb N] [--metering-off] [--nginx PATH|none]"
                );
                return;
            }
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("load average before: {}", support::loadavg());
    if !e2e_only {
        println!("\n## Stages in isolation (ns per call, median of 15 batches of {n})\n");
        println!("| stage | ns |\n|---|---|");
        for (name, ns) in stages(&rt, n) {
            println!("| {name} | {ns:.0} |");
        }
    }
    // The proxy's supervisor runs on this runtime's worker while the client blocks this thread.
    let mt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let e2e = end_to_end(&mt, n, evict_mb, metering, nginx.as_deref());
    let caches = if evict_mb > 0 {
        format!("; every CPU's caches evicted ({evict_mb} MB walked) before each request")
    } else {
        String::new()
    };
    println!("\n## End to end in process (median ns over {n} requests; raw-socket client and upstream{caches})\n");
    println!("| path | ns |\n|---|---|");
    for (name, ns) in &e2e {
        println!("| {name} | {ns:.0} |");
    }
    let get = |k: &str| {
        e2e.iter()
            .find(|(n, _)| n == k)
            .map_or(f64::NAN, |(_, v)| *v)
    };
    println!("\n## Added by each proxy (median through it − median direct, ns)\n");
    println!(
        "| | tokenmeter warm | nginx warm | tokenmeter cold | nginx cold |\n|---|---|---|---|---|"
    );
    for part in [
        "request path (client sent -> upstream read)",
        "response path (upstream wrote -> client first byte)",
        "total (client sent -> first byte)",
    ] {
        let d = |arm: &str, k: &str| {
            get(&format!("{arm} {k}: {part}")) - get(&format!("direct {k}: {part}"))
        };
        println!(
            "| {part} | {:.0} | {:.0} | {:.0} | {:.0} |",
            d("tokenmeter", "warm"),
            d("nginx", "warm"),
            d("tokenmeter", "cold"),
            d("nginx", "cold")
        );
    }
    let (pooled, own) = client_paths(&rt, n);
    println!("\n## Upstream round trip, request sent -> first frame (median ns over {n})\n");
    println!("| client | ns |\n|---|---|");
    println!("| hyper-util's pooled client (the proxy's before proxy/pool.rs) | {pooled:.0} |");
    println!("| hyper client::conn on one kept connection (what proxy/pool.rs kept before upstream_h1) | {own:.0} |");
    println!(
        "| difference (the pool's checkout and return) | {:.0} |",
        pooled - own
    );
    println!("\nload average after: {}", support::loadavg());
}
