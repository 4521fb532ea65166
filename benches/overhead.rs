//! Overhead harness: what tokenmeter adds to a stream, against the simulator alone and nginx.
//!
//! `cargo bench --bench overhead -- [--quick] [options]`; `scripts/overhead.sh` prepares and runs it.
//! The harness starts its own processes (simulator, two tokenmeter instances, nginx) on loopback so it
//! can restart the simulator at a slower pace for the ramp, and kills every child on exit. The
//! `peers` phase puts Python peers on both sides instead (`benches/peers/`: an asyncio upstream
//! and two clients, plain asyncio and the `openai` SDK), in the interpreter `--python` names.

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[path = "overhead/client.rs"]
mod client;
#[path = "overhead/phases.rs"]
mod phases;
#[path = "overhead/procs.rs"]
mod procs;
#[path = "overhead/report.rs"]
mod report;
#[path = "overhead/stats.rs"]
mod stats;
mod support;

use rand::SeedableRng;
use std::path::PathBuf;

/// Harness options (see `--help`).
pub struct Opts {
    /// tokenmeter binary.
    pub bin: PathBuf,
    /// An earlier tokenmeter binary measured in the same run (`tokenmeter_before*` arms).
    pub bin_before: Option<PathBuf>,
    /// nginx binary; None skips the nginx arm.
    pub nginx: Option<PathBuf>,
    /// nginx worker_processes.
    pub nginx_workers: String,
    /// Concurrency levels of the latency phase.
    pub concurrency: Vec<usize>,
    /// Event-delay rounds per concurrency level.
    pub rounds: Vec<usize>,
    /// TTFT rounds (1-event requests) per concurrency level.
    pub ttft_rounds: Vec<usize>,
    /// Events per request in latency rounds.
    pub events: u64,
    /// Simulator gap between events in the latency and CPU phases, ms.
    pub gap_ms: f64,
    /// Simulator gap between events in the CPU phase, ms (`--gap-ms` unless given).
    pub cpu_gap_ms: f64,
    /// Requests per CPU run.
    pub cpu_requests: usize,
    /// The CPU phase's events carry the latency phase's send stamps (`--cpu-stamped`; the method
    /// before 2026-12-03): then no two events of a stream have the same bytes around their
    /// token, which vLLM's do.
    pub cpu_stamped: bool,
    /// CPU repetitions per arm.
    pub cpu_reps: usize,
    /// Ramp steps (concurrent streams).
    pub ramp: Vec<usize>,
    /// Phases to run.
    pub phases: Vec<String>,
    /// Where the JSON goes.
    pub out_dir: PathBuf,
    /// Extra environment for the tokenmeter processes (`--tm-env KEY=VALUE`, repeatable).
    pub tm_env: Vec<(String, String)>,
    /// The request every arm is sent.
    pub shape: client::Shape,
    /// The Python interpreter of the peers phase (a virtualenv with `tests/sdk/requirements.txt`).
    pub python: Option<PathBuf>,
    /// Rounds of the peers phase.
    pub peer_rounds: usize,
    /// Events per request in the peers phase.
    pub peer_events: u64,
    /// Characters of the user message the Python peers send (0: "hello").
    pub peer_prompt_chars: usize,
    /// The Python upstream's gap between events, ms.
    pub peer_gap_ms: f64,
    /// The peers phase's clients (`raw`, `sdk`), comma-separated.
    pub peer_clients: String,
}

const HELP: &str =
    "options: --quick | --ttft-rounds 2000,200,30 | --rounds 100,40,12 | --concurrency 1,16,256 | --events 8 | --gap-ms 10
  --cpu-gap-ms 10 (CPU phase pace; default --gap-ms) | --cpu-requests 128 | --cpu-reps 7 | --ramp 1000,4000,10000 | --phases latency,cpu,ramp
  --cpu-stamped (the CPU phase's events carry send stamps as the latency phase's do; the default, unstamped, is vLLM's shape)
  --bin PATH | --bin-before PATH (an earlier build, arms tokenmeter_before[_nometer]) | --nginx PATH|none | --nginx-workers 1|auto | --out DIR | --tm-env KEY=VALUE
  --shape completions|chat-bearer | --ttft-rounds 0 (TTFT from the event rounds)
  --issue19: issue 19's latency method (1 stream, 200 rounds of 16 events 2 ms apart, chat-bearer,
             TTFT from the same requests; latency phase only)
  --phases peers: Python peers (benches/peers/) on both sides: --python PATH (default target/peers-venv/bin/python)
  --peer-rounds 200 | --peer-events 16 | --peer-gap-ms 2 | --peer-clients raw,sdk | --peer-prompt-chars 0
  --issue37: the peers phase alone, with its defaults";

fn list<T: std::str::FromStr>(s: &str) -> anyhow::Result<Vec<T>> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<T>()
                .map_err(|_| anyhow::anyhow!("bad list item {x:?}"))
        })
        .collect()
}

fn parse_opts() -> anyhow::Result<Opts> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let default_nginx = [
        "/usr/sbin/nginx",
        "/usr/local/sbin/nginx",
        "/usr/local/nginx/sbin/nginx",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists());
    let mut o = Opts {
        bin: target.join("release/tokenmeter"),
        bin_before: None,
        nginx: default_nginx,
        nginx_workers: "1".into(),
        concurrency: vec![1, 16, 256],
        rounds: vec![100, 40, 12],
        ttft_rounds: vec![2000, 200, 30],
        events: 8,
        gap_ms: 10.0,
        cpu_gap_ms: f64::NAN,
        cpu_stamped: false,
        cpu_requests: 128,
        cpu_reps: 7,
        ramp: vec![1000, 4000, 10000],
        phases: vec!["latency".into(), "cpu".into(), "ramp".into()],
        out_dir: root.join("benches/results"),
        tm_env: Vec::new(),
        shape: client::Shape::Completions,
        python: Some(target.join("peers-venv/bin/python")).filter(|p| p.exists()),
        peer_rounds: 200,
        peer_events: 16,
        peer_prompt_chars: 0,
        peer_gap_ms: 2.0,
        peer_clients: "raw,sdk".into(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .ok_or_else(|| anyhow::anyhow!("{a} needs a value"))
        };
        match a.as_str() {
            "--bench" => {} // cargo bench passes this to harness=false targets
            "--quick" => {
                o.rounds = vec![30, 12, 4];
                o.ttft_rounds = vec![400, 40, 8];
                o.cpu_requests = 64;
                o.cpu_reps = 2;
                o.ramp = vec![1000, 10000];
            }
            "--issue19" => {
                o.concurrency = vec![1];
                o.rounds = vec![200];
                o.ttft_rounds = vec![0];
                o.events = 16;
                o.gap_ms = 2.0;
                o.shape = client::Shape::ChatBearer;
                o.phases = vec!["latency".into()];
            }
            "--issue37" => o.phases = vec!["peers".into()],
            "--python" => o.python = Some(val()?.into()),
            "--peer-rounds" => o.peer_rounds = val()?.parse()?,
            "--peer-events" => o.peer_events = val()?.parse()?,
            "--peer-prompt-chars" => o.peer_prompt_chars = val()?.parse()?,
            "--peer-gap-ms" => o.peer_gap_ms = val()?.parse()?,
            "--peer-clients" => o.peer_clients = val()?,
            "--shape" => o.shape = client::Shape::parse(&val()?)?,
            "--rounds" => o.rounds = list(&val()?)?,
            "--ttft-rounds" => o.ttft_rounds = list(&val()?)?,
            "--concurrency" => o.concurrency = list(&val()?)?,
            "--events" => o.events = val()?.parse()?,
            "--gap-ms" => o.gap_ms = val()?.parse()?,
            "--cpu-gap-ms" => o.cpu_gap_ms = val()?.parse()?,
            "--cpu-stamped" => o.cpu_stamped = true,
            "--cpu-requests" => o.cpu_requests = val()?.parse()?,
            "--cpu-reps" => o.cpu_reps = val()?.parse()?,
            "--ramp" => o.ramp = list(&val()?)?,
            "--phases" => o.phases = list(&val()?)?,
            "--bin" => o.bin = val()?.into(),
            "--bin-before" => o.bin_before = Some(val()?.into()),
            "--nginx" => o.nginx = Some(val()?).filter(|v| v != "none").map(PathBuf::from),
            "--nginx-workers" => o.nginx_workers = val()?,
            "--out" => o.out_dir = val()?.into(),
            "--tm-env" => {
                let kv = val()?;
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--tm-env wants KEY=VALUE"))?;
                o.tm_env.push((k.to_string(), v.to_string()));
            }
            "--help" | "-h" => {
                println!("{HELP}");
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown option {other}\n{HELP}"),
        }
    }
    if o.cpu_gap_ms.is_nan() {
        o.cpu_gap_ms = o.gap_ms;
    }
    anyhow::ensure!(
        o.rounds.len() == o.concurrency.len() && o.ttft_rounds.len() == o.concurrency.len(),
        "--rounds and --ttft-rounds need one value per --concurrency level"
    );
    anyhow::ensure!(
        o.bin.exists(),
        "{} missing: cargo build --release first",
        o.bin.display()
    );
    anyhow::ensure!(
        o.events >= 1 && o.cpu_requests >= 1 && o.cpu_reps >= 1,
        "counts must be >= 1"
    );
    Ok(o)
}

/// The commit the measured binary was built from (best effort: the tree's HEAD).
fn git_head() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() -> anyhow::Result<()> {
    let o = parse_opts()?;
    client::set_shape(o.shape);
    stats::self_check();
    client::self_check();
    let mut o = o;
    let nofile = support::raise_nofile();
    // A proxy holds two descriptors per stream (client side, upstream side).
    let cap = (nofile.saturating_sub(100) / 2) as usize;
    if o.ramp.iter().any(|&n| n > cap) {
        eprintln!("note: open-files limit {nofile} lets a proxy hold at most {cap} streams: ramp steps capped to {cap}");
        o.ramp = o.ramp.iter().map(|&n| n.min(cap)).collect();
        o.ramp.dedup();
    }
    let dir = std::env::temp_dir().join(format!("tokenmeter-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    if o.nginx.is_none() {
        eprintln!("note: nginx not found (or --nginx none): the nginx arm is skipped");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut rng = rand::rngs::SmallRng::from_entropy();
    let started = std::time::Instant::now();
    let load_before = support::loadavg();
    let mut res = serde_json::Map::new();
    let has = |p: &str| o.phases.iter().any(|x| x == p);
    let start_env = |gap_ms: f64, stamp_events: bool| {
        procs::Env::start(&procs::EnvSpec {
            python: None,
            bin: &o.bin,
            bin_before: o.bin_before.as_deref(),
            nginx: o.nginx.as_deref(),
            nginx_workers: &o.nginx_workers,
            gap_ms,
            stamp_events,
            dir: &dir,
            tm_env: &o.tm_env,
        })
    };
    if has("peers") {
        let python = o.python.as_deref().ok_or_else(|| {
            anyhow::anyhow!(
                "the peers phase needs --python (scripts/overhead.sh makes the virtualenv)"
            )
        })?;
        let e = procs::Env::start(&procs::EnvSpec {
            bin: &o.bin,
            bin_before: o.bin_before.as_deref(),
            nginx: o.nginx.as_deref(),
            nginx_workers: &o.nginx_workers,
            gap_ms: o.peer_gap_ms,
            stamp_events: true,
            dir: &dir,
            tm_env: &o.tm_env,
            python: Some(python),
        })?;
        res.insert("peers".into(), phases::peers(&e, &o, python)?);
    }
    let mut env = None;
    if has("latency") {
        let e = env.insert(start_env(o.gap_ms, true)?);
        res.insert(
            "latency".into(),
            rt.block_on(phases::latency(e, &o, &mut rng)),
        );
    }
    if has("cpu") {
        // Fresh processes when the CPU phase runs at its own pace or on unstamped events.
        if env.is_none() || o.cpu_gap_ms != o.gap_ms || !o.cpu_stamped {
            drop(env.take());
            env = Some(start_env(o.cpu_gap_ms, o.cpu_stamped)?);
        }
        if let Some(e) = &env {
            res.insert("cpu".into(), rt.block_on(phases::cpu(e, &o, &mut rng)));
        }
    }
    drop(env);
    if has("ramp") {
        // A slow pace (1 event/s per stream) so 10,000 open streams are an idle-connection test.
        let env = start_env(1000.0, true)?;
        res.insert("ramp".into(), rt.block_on(phases::ramp(&env, &o)));
    }
    let meta = serde_json::json!({
        "date_utc": report::now_utc(), "nproc": std::thread::available_parallelism().map(std::num::NonZero::get).unwrap_or(0),
        "loadavg_before": load_before, "loadavg_after": support::loadavg(), "seconds": started.elapsed().as_secs_f64(),
        "nginx_workers": o.nginx.as_ref().map(|_| o.nginx_workers.clone()), "events_per_request": o.events,
        "gap_ms": o.gap_ms, "cpu_gap_ms": o.cpu_gap_ms, "cpu_events_stamped": o.cpu_stamped, "nofile_limit": nofile, "ramp_steps": o.ramp, "concurrency": o.concurrency, "rounds": o.rounds, "ttft_rounds": o.ttft_rounds, "tm_env": o.tm_env,
        "shape": o.shape.name(), "peer_rounds": o.peer_rounds, "peer_events": o.peer_events, "peer_prompt_chars": o.peer_prompt_chars, "peer_gap_ms": o.peer_gap_ms, "peer_clients": o.peer_clients, "python": o.python, "git_head": git_head(), "bin": o.bin, "bin_before": o.bin_before,
    });
    res.insert("meta".into(), meta);
    let all = serde_json::Value::Object(res);
    report::print(&all, &o);
    std::fs::create_dir_all(&o.out_dir)?;
    let path = o
        .out_dir
        .join(format!("overhead-{}.json", report::file_stamp()));
    std::fs::write(&path, serde_json::to_string_pretty(&all)?)?;
    println!("{}", serde_json::to_string(&all)?);
    eprintln!("written {}", path.display());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
