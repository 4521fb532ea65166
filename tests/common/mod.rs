//! Test kit: a scripted fake upstream that replays recorded vLLM responses over a real socket,
//! a raw HTTP/1.1 client that returns the exact bytes, and a proxy started on port 0.
// Included by several test targets (`#[path]`), each using part of it: what one leaves unused,
// another uses.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// A recorded response: status line, headers and body, split from a fixture file.
#[derive(Clone, Debug)]
pub struct Fixture {
    pub status_line: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm")
        .join(name)
}

/// Loads `tests/fixtures/vllm/<name>` (the `.http` captures).
pub fn fixture(name: &str) -> Fixture {
    let raw = std::fs::read(fixture_path(name)).expect("fixture");
    let end = find(&raw, b"\r\n\r\n").expect("head/body split");
    let head = String::from_utf8_lossy(&raw[..end]).to_string();
    let body = &raw[end + 4..];
    let mut lines = head.lines();
    let status_line = lines.next().unwrap().trim().to_string();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Fixture {
        status_line,
        headers,
        body: body.to_vec(),
    }
}

impl Fixture {
    pub fn status(&self) -> u16 {
        self.status_line
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap()
    }

    pub fn is_stream(&self) -> bool {
        self.headers
            .iter()
            .any(|(k, v)| k == "content-type" && v.starts_with("text/event-stream"))
    }

    /// The SSE events of the body, each with its trailing blank line.
    pub fn events(&self) -> Vec<Vec<u8>> {
        let text = String::from_utf8_lossy(&self.body).to_string();
        text.split_inclusive("\n\n")
            .filter(|e| !e.trim().is_empty())
            .map(|e| e.as_bytes().to_vec())
            .collect()
    }

    /// A script that replays this response, one event per chunk with `gap` between them.
    pub fn script(&self, gap: Duration) -> Script {
        let mut head = format!("{}\r\n", self.status_line);
        for (k, v) in &self.headers {
            if k == "content-length" || k == "transfer-encoding" || k == "date" {
                continue;
            }
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if self.is_stream() {
            head.push_str("transfer-encoding: chunked\r\n\r\n");
            let chunks = self
                .events()
                .into_iter()
                .map(|e| Step::Chunk(gap, e))
                .collect::<Vec<_>>();
            let mut steps = vec![Step::Raw(Duration::ZERO, head.into_bytes())];
            steps.extend(chunks);
            steps.push(Step::Raw(Duration::ZERO, b"0\r\n\r\n".to_vec()));
            Script { steps }
        } else {
            head.push_str(&format!("content-length: {}\r\n\r\n", self.body.len()));
            let mut bytes = head.into_bytes();
            bytes.extend_from_slice(&self.body);
            Script {
                steps: vec![Step::Raw(gap, bytes)],
            }
        }
    }
}

/// One action of the fake upstream.
#[derive(Clone, Debug)]
pub enum Step {
    /// Wait, then write these bytes as they are.
    Raw(Duration, Vec<u8>),
    /// Wait, then write these bytes as one HTTP chunk.
    Chunk(Duration, Vec<u8>),
    /// Wait, then reset the connection (RST).
    Reset(Duration),
    /// Wait this long (use a huge value for "never answers").
    Stall(Duration),
    /// Wait until the test adds a permit (it advances a manual clock first, then opens the gate,
    /// so each write happens at a known instant of that clock).
    Gate(Arc<tokio::sync::Semaphore>),
}

/// What the fake upstream does for each request, in order (the last one repeats).
#[derive(Clone, Debug, Default)]
pub struct Script {
    pub steps: Vec<Step>,
}

/// A request the fake upstream received.
#[derive(Clone, Debug)]
pub struct Seen {
    pub head: String,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }

    pub fn request_line(&self) -> &str {
        self.head.lines().next().unwrap_or("")
    }
}

/// A fake upstream on 127.0.0.1:0.
pub struct FakeUpstream {
    pub addr: SocketAddr,
    pub seen: mpsc::UnboundedReceiver<Seen>,
    /// When each connection's client side was seen closed (EOF or error), after a request.
    pub closed: mpsc::UnboundedReceiver<Instant>,
    scripts: Arc<Mutex<Vec<Script>>>,
}

impl FakeUpstream {
    pub async fn start(scripts: Vec<Script>) -> FakeUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (seen_tx, seen) = mpsc::unbounded_channel();
        let (closed_tx, closed) = mpsc::unbounded_channel();
        let scripts = Arc::new(Mutex::new(scripts));
        let s2 = scripts.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let seen_tx = seen_tx.clone();
                let closed_tx = closed_tx.clone();
                let scripts = s2.clone();
                tokio::spawn(serve_conn(stream, seen_tx, closed_tx, scripts));
            }
        });
        FakeUpstream {
            addr,
            seen,
            closed,
            scripts,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

async fn serve_conn(
    mut stream: TcpStream,
    seen_tx: mpsc::UnboundedSender<Seen>,
    closed_tx: mpsc::UnboundedSender<Instant>,
    scripts: Arc<Mutex<Vec<Script>>>,
) {
    stream.set_nodelay(true).ok();
    let mut buf = Vec::new();
    loop {
        let Some(req) = read_request(&mut stream, &mut buf).await else {
            return;
        };
        let _ = seen_tx.send(req);
        let script = {
            let mut s = scripts.lock().unwrap();
            if s.len() > 1 {
                s.remove(0)
            } else {
                s.first().cloned().unwrap_or_default()
            }
        };
        let mut probe = [0u8; 1];
        for step in script.steps {
            let (wait, action) = match step {
                Step::Raw(d, b) => (d, Some(b)),
                Step::Chunk(d, b) => {
                    let mut c = format!("{:x}\r\n", b.len()).into_bytes();
                    c.extend_from_slice(&b);
                    c.extend_from_slice(b"\r\n");
                    (d, Some(c))
                }
                Step::Reset(d) => {
                    tokio::time::sleep(d).await;
                    let std = stream.into_std().unwrap();
                    let sock = socket2_linger_zero(std);
                    drop(sock);
                    return;
                }
                Step::Stall(d) => (d, None),
                Step::Gate(g) => {
                    tokio::select! {
                        p = g.acquire() => p.unwrap().forget(),
                        r = stream.read(&mut probe) => {
                            if matches!(r, Ok(0) | Err(_)) {
                                let _ = closed_tx.send(Instant::now());
                                return;
                            }
                        }
                    }
                    continue;
                }
            };
            // Wait, but notice the client leaving meanwhile.
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                r = stream.read(&mut probe) => {
                    if matches!(r, Ok(0) | Err(_)) {
                        let _ = closed_tx.send(Instant::now());
                        return;
                    }
                }
            }
            if let Some(bytes) = action {
                if stream.write_all(&bytes).await.is_err() {
                    let _ = closed_tx.send(Instant::now());
                    return;
                }
            }
        }
    }
}

/// Closes a socket with RST instead of FIN (SO_LINGER with a zero timeout).
pub fn socket2_linger_zero(s: std::net::TcpStream) -> std::net::TcpStream {
    let _ = rustix::net::sockopt::set_socket_linger(&s, Some(std::time::Duration::ZERO));
    s
}

/// Reads one request (head and content-length body) from `stream`, `buf` keeping what was read
/// past it; None at EOF.
pub async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Seen> {
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len = head
                .lines()
                .find_map(|l| {
                    l.split_once(':')
                        .filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                        .map(|(_, v)| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let mut tmp = [0u8; 8192];
                let n = stream.read(&mut tmp).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&tmp[..n]);
            }
            let body = buf[end + 4..end + 4 + len].to_vec();
            buf.drain(..end + 4 + len);
            return Some(Seen { head, body });
        }
        let mut tmp = [0u8; 8192];
        let n = stream.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A response as the client received it.
#[derive(Debug)]
pub struct Received {
    pub status: u16,
    pub head: String,
    /// The body after de-chunking.
    pub body: Vec<u8>,
    /// The chunked body ended with its terminating chunk (or the content-length was complete).
    pub complete: bool,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("json body")
    }
}

/// Sends one raw request and reads the whole response (connection closed afterwards).
pub async fn raw_request(addr: SocketAddr, request: &[u8]) -> Received {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw).await;
    parse_response(&raw)
}

pub fn parse_response(raw: &[u8]) -> Received {
    let end = find(raw, b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..end]).to_string();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let rest = &raw[end + 4..];
    let lower = head.to_ascii_lowercase();
    if lower.contains("transfer-encoding: chunked") {
        let (body, complete) = dechunk(rest);
        Received {
            status,
            head,
            body,
            complete,
        }
    } else {
        let len = lower.lines().find_map(|l| {
            l.strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap())
        });
        let complete = len.is_none_or(|n| rest.len() >= n);
        Received {
            status,
            head,
            body: rest.to_vec(),
            complete,
        }
    }
}

pub fn dechunk(mut rest: &[u8]) -> (Vec<u8>, bool) {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = find(rest, b"\r\n") else {
            return (body, false);
        };
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap().trim(), 16)
                .unwrap();
        rest = &rest[line_end + 2..];
        if size == 0 {
            return (body, true);
        }
        if rest.len() < size + 2 {
            body.extend_from_slice(&rest[..rest.len().min(size)]);
            return (body, false);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// A POST with a JSON body.
pub fn post(path: &str, body: &str, extra_headers: &[(&str, &str)]) -> Vec<u8> {
    let mut r = format!("POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n", body.len());
    for (k, v) in extra_headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    r.push_str(body);
    r.into_bytes()
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("tokenmeter-test-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A proxy in front of `upstream`, logging to a temp file.
pub struct TestProxy {
    pub handle: Option<tokenmeter::app::ProxyHandle>,
    pub addr: SocketAddr,
    pub log_path: PathBuf,
    _dir: TempDir,
}

impl TestProxy {
    pub async fn start(
        upstream: &str,
        tweak: impl FnOnce(&mut tokenmeter::config::ServeConfig),
    ) -> TestProxy {
        Self::start_with_time(upstream, tokenmeter::clock::TimeSource::real(), tweak).await
    }

    /// The same, measuring on `time` (a manual clock the test advances).
    pub async fn start_with_time(
        upstream: &str,
        time: tokenmeter::clock::TimeSource,
        tweak: impl FnOnce(&mut tokenmeter::config::ServeConfig),
    ) -> TestProxy {
        let dir = TempDir::new("proxy");
        let log_path = dir.0.join("access.jsonl");
        let mut config = tokenmeter::config::ServeConfig {
            listen: "127.0.0.1:0".into(),
            upstream: upstream.into(),
            access_log: Some(log_path.clone()),
            ..Default::default()
        };
        tweak(&mut config);
        let handle = tokenmeter::app::spawn_with_time(config, Vec::new(), time)
            .await
            .unwrap();
        let addr = handle.addr();
        TestProxy {
            handle: Some(handle),
            addr,
            log_path,
            _dir: dir,
        }
    }

    /// Waits until the access log holds `n` lines (the writer flushes whenever its queue empties).
    pub async fn log_lines(&self, n: usize) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
            let lines: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            if lines.len() >= n || Instant::now() > deadline {
                assert_eq!(lines.len(), n, "access log lines: {text}");
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub async fn stop(mut self) {
        if let Some(h) = self.handle.take() {
            h.shutdown().await;
        }
    }
}

impl TestProxy {
    /// Stops the proxy (which flushes the access log) and returns every line.
    pub async fn finish(self) -> Vec<serde_json::Value> {
        let path = self.log_path.clone();
        let dir_guard = TempDir(self._dir.0.clone());
        let mut me = self;
        if let Some(h) = me.handle.take() {
            h.shutdown().await;
        }
        std::mem::forget(dir_guard);
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// Validates `value` against the committed JSON Schema `schemas/<name>`.
pub fn assert_schema(name: &str, value: &serde_json::Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("schemas")
        .join(name);
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(errors.is_empty(), "{name}: {errors:?}\n{value}");
}

/// Drops a tokio stream with RST (SO_LINGER 0) instead of FIN.
pub fn reset(stream: TcpStream) {
    drop(socket2_linger_zero(stream.into_std().unwrap()));
}

/// A spawned process that is killed (and reaped) when dropped, so a test that panics never leaves
/// a server running on the machine. Derefs to the [`std::process::Child`].
pub struct ChildGuard(pub std::process::Child);

impl std::ops::Deref for ChildGuard {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // Already waited for: nothing to do (kill on a reaped child is a no-op).
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts a tokenmeter process; returns it (killed when dropped), the address of its
/// "listening on" line, and its further stderr lines.
pub fn spawn_logged(
    cmd: &mut std::process::Command,
) -> (ChildGuard, SocketAddr, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead;
    let mut child = cmd
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let addr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a log line");
        if let Some(i) = line.find("listening on ") {
            // The address ends where the text line's words or the JSON line's quote do.
            break line[i + "listening on ".len()..]
                .split(|c: char| c.is_whitespace() || c == '"')
                .next()
                .unwrap()
                .parse()
                .unwrap();
        }
    };
    (ChildGuard(child), addr, rx)
}

/// A test CA and a server certificate it signed for `localhost` and 127.0.0.1, as PEM files in
/// `dir`: `<tag>-ca.pem`, `<tag>-cert.pem` (leaf then CA), `<tag>-key.pem`.
pub struct TestCerts {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCerts {
    pub fn generate(dir: &Path, tag: &str) -> TestCerts {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, format!("tokenmeter test CA {tag}"));
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let leaf_key = KeyPair::generate().unwrap();
        let leaf_params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        let issuer = Issuer::from_params(&ca_params, &ca_key);
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
        let certs = TestCerts {
            ca: dir.join(format!("{tag}-ca.pem")),
            cert: dir.join(format!("{tag}-cert.pem")),
            key: dir.join(format!("{tag}-key.pem")),
        };
        std::fs::write(&certs.ca, ca_cert.pem()).unwrap();
        std::fs::write(&certs.cert, format!("{}{}", leaf.pem(), ca_cert.pem())).unwrap();
        std::fs::write(&certs.key, leaf_key.serialize_pem()).unwrap();
        certs
    }
}

/// The live `/stats` document of `meter` now, for the default query (upstream named "sim").
pub async fn stats_now(meter: &tokenmeter::meter::MeterHandle) -> tokenmeter::meter::StatsSnapshot {
    meter
        .snapshot(
            tokenmeter::clock::Clock::global().now(),
            tokenmeter::meter::SnapshotQuery::default(),
            "sim",
            &Default::default(),
        )
        .await
        .unwrap()
}

/// Starts the simulator with `cfg` on 127.0.0.1:0.
pub async fn start_sim(cfg: tokenmeter::sim::SimConfig) -> tokenmeter::sim::SimHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    tokenmeter::sim::spawn(cfg, listener).await.unwrap()
}

/// The environment variable `name` as a number, else `default` (how long a by-hand run lasts).
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Busy agents: think 0.1–0.7 s against answers of 100–600 tokens (about 5–30 s each), so the
/// level stays near N with constant turnover (at 16 agents a request ends about every second);
/// prompts of 10–2,000 words (up to 0.3 s of prefill each).
pub fn busy_agents() -> tokenmeter::load::AgentSpec {
    use tokenmeter::load::Dist;
    tokenmeter::load::AgentSpec {
        apis: Vec::new(),
        think_ms: Dist::Uniform { min: 100, max: 700 },
        prompt_words: Dist::Uniform { min: 10, max: 2000 },
        output_tokens: Dist::Uniform { min: 100, max: 600 },
        stream_share: 1.0,
        seed: 14,
        ..tokenmeter::load::AgentSpec::default()
    }
}
