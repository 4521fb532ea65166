//! Shared by the monitoring tests (browser, Prometheus, Grafana): the simulator behind the proxy
//! with `admin_listen` and a 1 s scrape of the simulator's `/metrics`, traffic of held streams and
//! one-shot users, and the external programs (Chromium, Prometheus) found and started.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenmeter::sim::{SimConfig, SimHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The simulator, the proxy in front of it and the proxy's admin listener.
pub struct Rig {
    pub sim: SimHandle,
    /// Held, never read: the proxy serves for as long as the rig lives.
    #[allow(dead_code)]
    pub proxy: tokenmeter::app::ProxyHandle,
    /// The proxy's main listener (clients).
    pub main: SocketAddr,
    /// `admin_listen`: the dashboard, `/stats`, `/metrics`.
    pub admin: SocketAddr,
    /// Content tokens received by the load's clients.
    pub received: Arc<AtomicU64>,
}

impl Rig {
    /// Starts the simulator (requests run to `max_tokens`) and the proxy, with the cross-check
    /// scraping the simulator every second and the `user` label on the counters.
    pub async fn start() -> Rig {
        Rig::start_with(SimConfig {
            stop_probability_per_token: 0.0,
            ..Default::default()
        })
        .await
    }

    /// As [`Rig::start`], the simulator configured by `sim_config`.
    pub async fn start_with(sim_config: SimConfig) -> Rig {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sim = tokenmeter::sim::spawn(sim_config, listener).await.unwrap();
        let mut config = tokenmeter::config::ServeConfig {
            listen: "127.0.0.1:0".into(),
            upstream: format!("http://{}", sim.addr()),
            admin_listen: Some("127.0.0.1:0".into()),
            upstream_metrics_url: Some("auto".into()),
            metrics_scrape_interval_s: 1.0,
            ..Default::default()
        };
        config.meter.metrics_user_label = true;
        // Room for the 1,000 one-shot users and the agents, each tracked by name.
        config.meter.max_tracked_users = 2000;
        let proxy = tokenmeter::app::spawn(config, Vec::new()).await.unwrap();
        let main = proxy.addr();
        let admin = proxy.admin_addr().unwrap();
        Rig {
            sim,
            proxy,
            main,
            admin,
            received: Arc::default(),
        }
    }

    /// Keeps one stream per `(start delay, max_tokens)` in flight from that delay until
    /// `deadline` (user `agent-<i>`, restarted as soon as it ends).
    pub fn hold_streams(
        &self,
        streams: &[(Duration, u32)],
        deadline: Instant,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        streams
            .iter()
            .enumerate()
            .map(|(i, &(delay, max))| {
                let addr = self.main;
                let received = self.received.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    while Instant::now() < deadline {
                        let user = format!("agent-{i}");
                        let body = format!(
                            r#"{{"model":"sim-model","messages":[{{"role":"user","content":"task {i}: refactor the parser"}}],"max_tokens":{max},"stream":true}}"#
                        );
                        let got = send(addr, &user, &body, deadline).await;
                        received.fetch_add(got, Ordering::Relaxed);
                    }
                })
            })
            .collect()
    }

    /// `count` users (`user-0000`, ...) send one short non-streamed request each, 100 at a time.
    pub async fn one_shot_users(&self, count: usize) {
        let addr = self.main;
        let next = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..100)
            .map(|_| {
                let next = next.clone();
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                        if i >= count {
                            return;
                        }
                        let body = format!(
                            r#"{{"model":"sim-model","messages":[{{"role":"user","content":"q{i}"}}],"max_tokens":{}}}"#,
                            4 + i % 7
                        );
                        let far = Instant::now() + Duration::from_secs(60);
                        send(addr, &format!("user-{i:04}"), &body, far).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    }
}

/// One chat completion through the proxy; returns the content events seen.
async fn send(addr: SocketAddr, user: &str, body: &str, deadline: Instant) -> u64 {
    let Ok(mut c) = TcpStream::connect(addr).await else {
        return 0;
    };
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nx-tokenmeter-user: {user}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    if c.write_all(req.as_bytes()).await.is_err() {
        return 0;
    }
    let mut buf = vec![0u8; 16 * 1024];
    let mut got = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, c.read(&mut buf)).await {
            Ok(Ok(k)) if k > 0 => {
                got += buf[..k]
                    .windows(11)
                    .filter(|w| w == b"\"content\":\"")
                    .count() as u64;
            }
            _ => return got,
        }
    }
}

/// GET `path` from `addr`; (status, body).
pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    try_get(addr, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path} from {addr}: {e}"))
}

/// GET `path` from `addr`; (status, body), or the connection's error.
pub async fn try_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr).await?;
    let req = format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A program from `PATH` (or the environment variable `var`), or a panic naming how to get it.
pub fn program(var: &str, names: &[&str], package: &str) -> PathBuf {
    if let Ok(p) = std::env::var(var) {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for n in names {
            let p = dir.join(n);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!(
        "{} not found: install the Debian package {package} (.ci/run does), or set {var}",
        names[0]
    );
}

/// Headless Chromium with the flags a container needs, a profile of its own under `profile`.
pub fn chromium(profile: &Path) -> Command {
    let mut c = Command::new(program(
        "CHROMIUM",
        &["chromium", "chromium-browser"],
        "chromium",
    ));
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .stdin(Stdio::null());
    c
}

/// A free port on 127.0.0.1 (bound, then released for a child process to take).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed when dropped.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fresh directory under the target dir, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "{tag}-{}-{}",
            std::process::id(),
            Instant::now().elapsed().as_nanos()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
