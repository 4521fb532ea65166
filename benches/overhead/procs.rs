//! The processes under test: the upstream (the simulator, or the Python mock of the peers phase),
//! two tokenmeter instances and nginx, started and killed here.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed (and reaped) when dropped, so no run leaves servers behind.
pub struct Proc {
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGTERM first: an nginx master only takes its workers down when asked to stop (a killed
        // master leaves them running). SIGKILL after 3 s bounds the wait.
        // Our own child, not reaped yet, so the pid is still its.
        if let Some(pid) = i32::try_from(self.child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Everything one measurement phase runs against, all on loopback.
pub struct Env {
    /// The upstream's address (the simulator, or the Python mock).
    pub sim: SocketAddr,
    /// tokenmeter with metering on.
    pub tm: SocketAddr,
    /// tokenmeter with `metering=false`.
    pub nometer: SocketAddr,
    /// The `--bin-before` build with metering on and off, when given (before/after in one run).
    pub before: Option<(SocketAddr, SocketAddr)>,
    /// nginx, when it could be started.
    pub nginx: Option<SocketAddr>,
    /// Process ids per proxy arm (nginx: master and workers).
    pub pids: Vec<(&'static str, Vec<u32>)>,
    // Declared last: killed after the addresses are no longer used.
    _procs: Vec<Proc>,
}

/// What to start.
pub struct EnvSpec<'a> {
    /// The tokenmeter binary.
    pub bin: &'a Path,
    /// An earlier tokenmeter build measured beside it (`--bin-before`).
    pub bin_before: Option<&'a Path>,
    /// nginx binary, if the nginx arm is wanted.
    pub nginx: Option<&'a Path>,
    /// nginx `worker_processes` value (`1` or `auto`).
    pub nginx_workers: &'a str,
    /// Simulator gap between events, ms.
    pub gap_ms: f64,
    /// The simulator stamps every event with its send time (`tm_sent_ns`, for the latency
    /// phase). Unstamped events are shaped as vLLM's are: a stream's events differ only in
    /// their tokens.
    pub stamp_events: bool,
    /// Scratch directory for configs and logs.
    pub dir: &'a Path,
    /// Extra environment for both tokenmeter instances (e.g. `TOKIO_WORKER_THREADS=1`).
    pub tm_env: &'a [(String, String)],
    /// The upstream: the simulator when `None`, else this Python interpreter running
    /// `benches/peers/mock_upstream.py` (the peers phase), at the same gap.
    pub python: Option<&'a Path>,
}

fn free_port() -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    l.local_addr()
}

fn log_file(dir: &Path, name: &str) -> std::io::Result<Stdio> {
    Ok(Stdio::from(std::fs::File::create(dir.join(name))?))
}

/// Waits (bounded) until `GET /v1/models` at `addr` answers 200.
fn wait_ready(addr: SocketAddr, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let req =
                format!("GET /v1/models HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
            if s.write_all(req.as_bytes()).is_ok() {
                let mut buf = [0u8; 16];
                if s.read_exact(&mut buf).is_ok() && buf.starts_with(b"HTTP/1.1 200") {
                    return Ok(());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::bail!("{what} at {addr} not ready within 15 s")
}

/// Children of `pid` (nginx workers), from /proc.
pub fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}

fn nginx_conf(dir: &Path, listen: SocketAddr, sim: SocketAddr, workers: &str) -> String {
    let d = dir.display();
    format!(
        "worker_processes {workers};\nworker_rlimit_nofile 65536;\ndaemon off;\npid {d}/nginx.pid;\n\
error_log {d}/nginx-error.log warn;\nevents {{ worker_connections 30000; }}\nhttp {{\n\
  access_log {d}/nginx-access.log;\n  client_body_temp_path {d}/ngx-body;\n  proxy_temp_path {d}/ngx-proxy;\n\
  fastcgi_temp_path {d}/ngx-fcgi;\n  uwsgi_temp_path {d}/ngx-uwsgi;\n  scgi_temp_path {d}/ngx-scgi;\n\
  keepalive_requests 100000;\n  upstream sim {{ server {sim}; keepalive 1024; keepalive_requests 100000; }}\n\
  server {{\n    listen {listen} backlog=4096;\n    location / {{\n      proxy_pass http://sim;\n\
      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n\
      proxy_read_timeout 600s;\n    }}\n  }}\n}}\n"
    )
}

/// Starts nginx (`worker_processes` = `workers`) in front of `sim`, with its own prefix and
/// config under `dir`.
pub fn start_nginx(
    dir: &Path,
    workers: &str,
    bin: &Path,
    sim: SocketAddr,
) -> anyhow::Result<(Proc, SocketAddr)> {
    let addr = free_port()?;
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, nginx_conf(dir, addr, sim, workers))?;
    let child = Command::new(bin)
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(dir.join("nginx-error.log"))
        .stdout(Stdio::null())
        .stderr(log_file(dir, "nginx.stderr")?)
        .spawn()?;
    // Killed on drop, also when it never becomes ready.
    let proc = Proc { child };
    wait_ready(addr, "nginx")?;
    Ok((proc, addr))
}

impl Env {
    /// Starts the simulator, both tokenmeter instances and (if given) nginx, and waits until each answers.
    pub fn start(spec: &EnvSpec) -> anyhow::Result<Env> {
        let mut procs = Vec::new();
        let sim = free_port()?;
        let gap = spec.gap_ms.to_string();
        let child = match spec.python {
            None => Command::new(spec.bin)
                .args([
                    "sim",
                    "--listen",
                    &sim.to_string(),
                    "--fixed-pace",
                    "--fixed-ttft-ms",
                    "0",
                ])
                .args(["--fixed-gap-ms", &gap, "--max-num-seqs", "100000"])
                .args(spec.stamp_events.then_some("--stamp-events"))
                .stdout(Stdio::null())
                .stderr(log_file(spec.dir, "sim.log")?)
                .spawn()?,
            Some(python) => Command::new(python)
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers/mock_upstream.py"))
                .args(["--listen", &sim.to_string(), "--gap-ms", &gap])
                .stdout(Stdio::null())
                .stderr(log_file(spec.dir, "mock.log")?)
                .spawn()?,
        };
        procs.push(Proc { child });
        wait_ready(sim, "upstream")?;
        let mut pids = Vec::new();
        let mut serve =
            |name: &'static str, bin: &Path, extra: &[&str]| -> anyhow::Result<SocketAddr> {
                let addr = free_port()?;
                let log = spec.dir.join(format!("{name}-access.jsonl"));
                let child = Command::new(bin)
                    .args(["serve", "--listen", &addr.to_string()])
                    .args(["--upstream", &format!("http://{sim}")])
                    .arg("--access-log")
                    .arg(&log)
                    .args(extra)
                    .env("TOKENMETER_LOG", "warn")
                    .envs(spec.tm_env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                    .stdout(Stdio::null())
                    .stderr(log_file(spec.dir, &format!("{name}.log"))?)
                    .spawn()?;
                pids.push((name, vec![child.id()]));
                procs.push(Proc { child });
                wait_ready(addr, name)?;
                Ok(addr)
            };
        let tm = serve("tokenmeter", spec.bin, &[])?;
        let nometer = serve("tokenmeter_nometer", spec.bin, &["--set", "metering=false"])?;
        let before = match spec.bin_before {
            Some(bin) => Some((
                serve("tokenmeter_before", bin, &[])?,
                serve(
                    "tokenmeter_before_nometer",
                    bin,
                    &["--set", "metering=false"],
                )?,
            )),
            None => None,
        };
        let mut nginx = None;
        if let Some(bin) = spec.nginx {
            match start_nginx(spec.dir, spec.nginx_workers, bin, sim) {
                Ok((proc, addr)) => {
                    let master = proc.child.id();
                    procs.push(proc);
                    let mut p = vec![master];
                    p.extend(children(master));
                    pids.push(("nginx", p));
                    nginx = Some(addr);
                }
                Err(e) => eprintln!(
                    "note: nginx did not start ({e}; see nginx-error.log): the nginx arm is skipped"
                ),
            }
        }
        Ok(Env {
            sim,
            tm,
            nometer,
            before,
            nginx,
            pids,
            _procs: procs,
        })
    }

    /// Process ids of a proxy arm (empty for the direct arms).
    pub fn pids_of(&self, arm: &str) -> Vec<u32> {
        let arm = if arm == "nginx" { "nginx" } else { arm };
        let mut v: Vec<u32> = self
            .pids
            .iter()
            .filter(|(n, _)| *n == arm)
            .flat_map(|(_, p)| p.clone())
            .collect();
        if arm == "nginx" {
            // Workers may be respawned: look them up again.
            if let Some(&m) = v.first() {
                v.truncate(1);
                v.extend(children(m));
            }
        }
        v
    }
}

/// Nanoseconds on CPU of all threads of `pids` (`/proc/PID/task/*/schedstat`, first field).
pub fn cpu_ns(pids: &[u32]) -> u64 {
    let mut total = 0;
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let p: PathBuf = t.path().join("schedstat");
            if let Ok(s) = std::fs::read_to_string(p) {
                total += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    total
}

/// Resident set size in KiB summed over `pids` (`VmRSS` in /proc/PID/status).
pub fn rss_kib(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter_map(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        })
        .sum()
}
