//! Operating the real binary: health probes and readiness on drain, JSON process logs,
//! `--check-config` output and exit codes.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::common::*;

fn tokenmeter() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tokenmeter"));
    c.env_remove("TOKENMETER_LOG")
        .env_remove("RUST_LOG")
        .env_remove("TOKENMETER_LOG_FORMAT")
        .env("NO_COLOR", "1");
    c
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

async fn get(addr: std::net::SocketAddr, path: &str) -> Received {
    raw_request(
        addr,
        format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
}

/// A stream of `n` content events, `gap` apart.
fn slow_stream(n: usize, gap: Duration) -> Script {
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    let mut steps = vec![Step::Raw(Duration::ZERO, head.as_bytes().to_vec())];
    for i in 0..n {
        steps.push(Step::Chunk(
            gap,
            format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{i}\"}}}}]}}\n\n")
                .into_bytes(),
        ));
    }
    steps.push(Step::Chunk(gap, b"data: [DONE]\n\n".to_vec()));
    steps.push(Step::Raw(Duration::ZERO, b"0\r\n\r\n".to_vec()));
    Script { steps }
}

/// The admin address from the "stats listening on ADDR" line.
fn admin_addr(rx: &std::sync::mpsc::Receiver<String>) -> std::net::SocketAddr {
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a log line");
        if let Some(i) = line.find("stats listening on ") {
            return line[i + "stats listening on ".len()..]
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_turns_503_while_draining_and_liveness_stays_200() {
    let mut up = FakeUpstream::start(vec![slow_stream(12, Duration::from_millis(60))]).await;
    let (mut child, addr, rx) = spawn_logged(tokenmeter().args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &up.url(),
        "--admin-listen",
        "127.0.0.1:0",
    ]));
    let admin = admin_addr(&rx);
    // The main listener answers its probes even when the stats moved to admin_listen.
    for (a, p) in [(admin, "/readyz"), (addr, "/stats/readyz")] {
        let r = get(a, p).await;
        assert_eq!(r.status, 200, "{p}");
        assert_eq!(r.json()["status"], "ready");
    }
    let r = get(admin, "/healthz").await;
    assert_eq!(
        (r.status, r.json()["status"].clone()),
        (200, "alive".into())
    );
    let stream = tokio::spawn(async move {
        raw_request(
            addr,
            &post("/v1/chat/completions", r#"{"stream":true}"#, &[]),
        )
        .await
    });
    up.seen.recv().await.unwrap();
    signal(&child, "TERM");
    let deadline = Instant::now() + Duration::from_secs(5);
    let draining = loop {
        let r = get(admin, "/readyz").await;
        if r.status == 503 || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        draining.status, 503,
        "readiness never dropped during the drain"
    );
    let body = draining.json();
    assert_eq!(body["status"], "not_ready");
    assert_eq!(body["reasons"], serde_json::json!(["draining"]));
    assert_eq!(
        get(admin, "/healthz").await.status,
        200,
        "still alive while draining"
    );
    let got = stream.await.unwrap();
    assert!(got.complete && got.body.ends_with(b"data: [DONE]\n\n"));
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn readiness_is_503_while_the_upstream_refuses_and_recovers_after_the_period() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let proxy = TestProxy::start(&url, |c| c.readiness_upstream_failure_s = 1).await;
    assert_eq!(get(proxy.addr, "/stats/readyz").await.status, 200);
    let r = raw_request(proxy.addr, &post("/v1/chat/completions", "{}", &[])).await;
    assert_eq!(r.status, 502);
    let failed_at = Instant::now();
    let r = get(proxy.addr, "/stats/readyz").await;
    assert_eq!(r.status, 503);
    let body = r.json();
    assert_eq!(body["reasons"], serde_json::json!(["upstream_unreachable"]));
    assert!(body["upstream_failed_s_ago"].as_f64().unwrap() < 1.0);
    // Liveness does not follow the upstream.
    assert_eq!(get(proxy.addr, "/stats/healthz").await.status, 200);
    tokio::time::sleep(Duration::from_millis(1100).saturating_sub(failed_at.elapsed())).await;
    let r = get(proxy.addr, "/stats/readyz").await;
    assert_eq!(r.status, 200, "ready again once the period passed");
    proxy.stop().await;
}

#[test]
fn json_log_format_makes_every_process_log_line_a_json_object() {
    for (env, flag) in [(Some("json"), None), (None, Some("--log-format=json"))] {
        let mut cmd = tokenmeter();
        if let Some(v) = env {
            cmd.env("TOKENMETER_LOG_FORMAT", v);
        }
        if let Some(f) = flag {
            cmd.arg(f);
        }
        // RUST_LOG is the fallback filter when TOKENMETER_LOG is unset.
        cmd.env("RUST_LOG", "debug")
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                "http://127.0.0.1:9",
            ])
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null());
        // Killed if an assertion below panics.
        let mut child = ChildGuard(cmd.spawn().unwrap());
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(l);
            }
        });
        let mut lines = Vec::new();
        let addr = loop {
            let l = rx
                .recv_timeout(Duration::from_secs(20))
                .expect("a log line");
            if let Some(i) = l.find("listening on ") {
                let addr: String = l[i + 13..].chars().take_while(|c| *c != '"').collect();
                lines.push(l);
                break addr;
            }
            lines.push(l);
        };
        // A request to the absent upstream: the HTTP client logs its connection attempt at DEBUG.
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        std::io::Write::write_all(
            &mut s,
            b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .unwrap();
        let _ = std::io::Read::read_to_end(&mut s, &mut Vec::new());
        signal(&child, "TERM");
        assert!(child.wait().unwrap().success());
        lines.extend(rx.try_iter());
        let mut levels = Vec::new();
        for l in &lines {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            assert!(
                v["timestamp"].is_string() && v["message"].is_string(),
                "{l}"
            );
            levels.push(v["level"].as_str().unwrap().to_string());
        }
        assert!(lines
            .iter()
            .any(|l| l.contains("\"upstream\":\"http://127.0.0.1:9\"")));
        assert!(
            levels.iter().any(|l| l == "DEBUG"),
            "RUST_LOG=debug applies: {lines:?}"
        );
    }
}

#[test]
fn check_config_prints_toml_that_is_accepted_again_with_secrets_redacted() {
    let dir = TempDir::new("check-toml");
    let out = tokenmeter()
        .args([
            "serve",
            "--check-config",
            "--set",
            "users.api_keys.bob=\"sk-canary-1\"",
        ])
        .args([
            "--set",
            "stats_token=tok-canary",
            "--set",
            "timeouts.connect_ms=1234",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("# config ok\n"), "{text}");
    assert!(!text.contains("canary"), "{text}");
    let doc: toml::Table = text.parse().expect("valid TOML");
    assert_eq!(doc["timeouts"]["connect_ms"].as_integer(), Some(1234));
    assert_eq!(doc["users"]["api_keys"]["bob"].as_str(), Some("<redacted>"));
    let file = dir.0.join("effective.toml");
    std::fs::write(&file, &text).unwrap();
    let again = tokenmeter()
        .args(["serve", "--check-config", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(
        String::from_utf8(again.stdout).unwrap(),
        text,
        "a fixed point"
    );
}

#[test]
fn help_shows_defaults_and_no_code_doc_syntax() {
    let help = |args: &[&str]| {
        let out = tokenmeter().args(args).arg("--help").output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    for cmd in ["serve", "demo", "sim", "load", "analyze", "healthcheck"] {
        let text = help(&[cmd]);
        for link in ["[`", "`]"] {
            assert!(!text.contains(link), "{cmd} --help has {link}: {text}");
        }
    }
    let serve = help(&["serve"]);
    for want in [
        "[default: 127.0.0.1:8080]",
        "[default: http://127.0.0.1:8000]",
    ] {
        assert!(serve.contains(want), "{want}: {serve}");
    }
    let sim = help(&["sim"]);
    for flag in [
        "--max-num-seqs",
        "--step-base-ms",
        "--step-per-seq-ms",
        "--prefill-tok-s",
        "--cold-start-ms",
        "--model",
        "--max-model-len",
        "--fixed-ttft-ms",
        "--fixed-gap-ms",
    ] {
        let at = sim.find(&format!("{flag} <")).expect(flag);
        let entry = &sim[at..];
        let end = entry.find("\n\n").unwrap_or(entry.len());
        assert!(
            entry[..end].contains("[default: "),
            "{flag}: {}",
            &entry[..end]
        );
    }
    assert!(sim.contains("[default: 256]"), "{sim}");
    assert!(help(&["demo"]).contains("--duration <"));
}

#[test]
fn serve_names_each_config_problem_once_and_all_in_one_run() {
    let out = tokenmeter()
        .args(["serve", "--upstream", "127.0.0.1:8000"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("upstream: `127.0.0.1:8000`").count(),
        1,
        "{err}"
    );
    assert!(!err.contains("problems"), "one problem: {err}");
    assert!(
        err.contains("did you mean `http://127.0.0.1:8000`?"),
        "{err}"
    );
    // An unknown key and an ill-typed value: both named, in one run.
    let out = tokenmeter()
        .args(["serve", "--set", "timeouts.conect_ms=1"])
        .args(["--set", "max_header_bytes=big"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "2 problems",
        "timeouts.conect_ms: unknown field `conect_ms`",
        "max_header_bytes: invalid type: string \"big\"",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
}

#[test]
fn check_config_reports_every_problem_and_exits_2() {
    let out = tokenmeter()
        .args(["serve", "--check-config", "--set", "timeouts.connect_ms=0"])
        .args([
            "--set",
            "max_header_bytes=10",
            "--set",
            "tls.cert_file=/nonexistent.pem",
        ])
        .args(["--access-log", "/nonexistent-dir/access.jsonl"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "4 problems",
        "timeouts.connect_ms",
        "max_header_bytes",
        "tls: cert_file and key_file go together",
        "access_log: cannot open /nonexistent-dir/access.jsonl for append",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
    // A usage error is 2 as well; a runtime failure (the port is taken) is 1.
    let out = tokenmeter()
        .args(["serve", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let out = tokenmeter()
        .args([
            "serve",
            "--listen",
            &taken.local_addr().unwrap().to_string(),
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn request_ids_are_kept_or_made_forwarded_returned_and_logged() {
    let models = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    let script = Script {
        steps: vec![Step::Raw(Duration::ZERO, models.as_bytes().to_vec())],
    };
    let mut up = FakeUpstream::start(vec![script]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let long_agent = "a".repeat(1000);
    // The client's id is kept end to end.
    let r = raw_request(
        proxy.addr,
        &post(
            "/v1/models",
            "",
            &[
                ("x-request-id", "agent-run-7/step-3"),
                ("user-agent", &long_agent),
            ],
        ),
    )
    .await;
    assert_eq!(
        r.header("x-request-id").as_deref(),
        Some("agent-run-7/step-3")
    );
    let seen = up.seen.recv().await.unwrap();
    assert_eq!(
        seen.header("x-request-id").as_deref(),
        Some("agent-run-7/step-3")
    );
    // Without one (or with an invalid one), the proxy's id is sent and returned.
    let r2 = raw_request(
        proxy.addr,
        &post("/v1/models", "", &[("x-request-id", "has space")]),
    )
    .await;
    let made = r2.header("x-request-id").unwrap();
    assert!(made.starts_with("tm-"), "{made}");
    assert_eq!(
        up.seen.recv().await.unwrap().header("x-request-id"),
        Some(made.clone())
    );
    let lines = proxy.log_lines(2).await;
    assert_eq!(lines[0]["client_request_id"], "agent-run-7/step-3");
    assert!(lines[0]["request_id"].as_str().unwrap().starts_with("tm-"));
    assert_eq!(
        lines[0]["user_agent"].as_str().unwrap().len(),
        256,
        "bounded"
    );
    assert_eq!(
        lines[0]["client_ip"],
        serde_json::Value::Null,
        "off by default"
    );
    assert_eq!(lines[1]["request_id"], made.as_str());
    assert_eq!(lines[1]["client_request_id"], serde_json::Value::Null);
    assert_eq!(lines[1]["user_agent"], serde_json::Value::Null);
    for l in &lines {
        assert_schema("record.schema.json", l);
    }
    proxy.stop().await;

    // A configured header name, the client address, and the proxy's own errors carry the id.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let proxy = TestProxy::start(&url, |c| {
        c.request_id_header = "x-correlation-id".into();
        c.access_log_client_ip = true;
    })
    .await;
    let r = raw_request(
        proxy.addr,
        &post("/v1/models", "", &[("x-correlation-id", "c-1")]),
    )
    .await;
    assert_eq!(r.status, 502);
    assert_eq!(r.header("x-correlation-id").as_deref(), Some("c-1"));
    let lines = proxy.log_lines(1).await;
    assert_eq!(lines[0]["client_request_id"], "c-1");
    assert_eq!(lines[0]["client_ip"], "127.0.0.1");
    proxy.stop().await;
}

/// Waits for a process-log line containing `needle`; returns it.
fn wait_line(rx: &std::sync::mpsc::Receiver<String>, needle: &str) -> String {
    loop {
        let l = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("no log line with {needle:?}"));
        if l.contains(needle) {
            return l;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_keys_and_the_stats_token_without_cutting_a_stream() {
    let json = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    let mut up = FakeUpstream::start(vec![
        slow_stream(15, Duration::from_millis(60)),
        Script {
            steps: vec![Step::Raw(Duration::ZERO, json.as_bytes().to_vec())],
        },
    ])
    .await;
    let dir = TempDir::new("reload");
    let file = dir.0.join("tokenmeter.toml");
    let url = up.url();
    let write = |stats: &str, connect_ms: u64, keys: &str| {
        let text = format!(
            "upstream = \"{url}\"\nstats_token = \"{stats}\"\n[timeouts]\nconnect_ms = {connect_ms}\n\
             [users]\nrequire_known_key = true\n[users.api_keys]\n{keys}\n"
        );
        std::fs::write(&file, text).unwrap();
    };
    write("t1", 5000, "alice = \"sk-alice\"");
    let (mut child, addr, rx) = spawn_logged(
        tokenmeter()
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&file),
    );
    let call = |key: &'static str| async move {
        let auth = format!("Bearer {key}");
        raw_request(
            addr,
            &post("/v1/chat/completions", "{}", &[("authorization", &auth)]),
        )
        .await
        .status
    };
    let stats = |token: &'static str| async move {
        let req = format!("GET /stats HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\nconnection: close\r\n\r\n");
        raw_request(addr, req.as_bytes()).await.status
    };
    let stream = tokio::spawn(async move {
        let body = r#"{"stream":true}"#;
        raw_request(
            addr,
            &post(
                "/v1/chat/completions",
                body,
                &[("authorization", "Bearer sk-alice")],
            ),
        )
        .await
    });
    up.seen.recv().await.unwrap();
    write("t2", 1234, "bob = \"sk-bob\"");
    signal(&child, "HUP");
    let restart = wait_line(&rx, "need a restart");
    assert!(restart.contains("timeouts.connect_ms"), "{restart}");
    let done = wait_line(&rx, "configuration reloaded");
    assert!(
        done.contains("users.api_keys") && done.contains("stats_token"),
        "{done}"
    );
    assert_eq!(
        call("sk-bob").await,
        200,
        "a new key works after the reload"
    );
    assert_eq!(call("sk-alice").await, 401, "a removed key is refused");
    assert_eq!((stats("t2").await, stats("t1").await), (200, 401));
    let got = stream.await.unwrap();
    assert!(
        got.complete,
        "the stream that ran across the reload was cut"
    );
    assert!(got.body.ends_with(b"data: [DONE]\n\n"));
    // A bad file is rejected whole, with its reason; the running settings stay.
    std::fs::write(&file, "[users]\nrequire_known_key = true\nbogus_key = 1\n").unwrap();
    signal(&child, "HUP");
    let rejected = wait_line(&rx, "reload rejected");
    assert!(rejected.contains("bogus_key"), "{rejected}");
    assert_eq!(call("sk-bob").await, 200);
    assert_eq!(call("sk-alice").await, 401);
    signal(&child, "TERM");
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success());
}

/// With the upstream down, the process log says so once (with the reason), not once per
/// request, and says when it answers again.
#[tokio::test]
async fn upstream_connection_failures_and_the_recovery_are_logged_once() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut cmd = tokenmeter();
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
        .args(["--upstream", &format!("http://127.0.0.1:{port}")])
        .args(["--set", "upstream_metrics_url=\"\""]);
    let (child, addr, rx) = spawn_logged(&mut cmd);
    let models = b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    for _ in 0..5 {
        assert_eq!(raw_request(addr, models).await.status, 502);
    }
    // The upstream comes up on its port.
    let up = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut s in up.incoming().map_while(Result::ok) {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}");
        }
    });
    assert_eq!(raw_request(addr, models).await.status, 200);
    assert_eq!(raw_request(addr, models).await.status, 200);
    signal(&child, "TERM");
    let mut failed = Vec::new();
    let mut recovered = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(10)) {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let msg = v["message"].as_str().unwrap_or_default();
        if msg.starts_with("cannot connect to the upstream") {
            failed.push(v);
        } else if msg.starts_with("the upstream answers again") {
            recovered.push(v);
        }
    }
    assert_eq!(failed.len(), 1, "rate-limited: {failed:?}");
    assert_eq!(failed[0]["reason"], "connection refused");
    assert_eq!(failed[0]["upstream"], format!("127.0.0.1:{port}"));
    assert_eq!(failed[0]["level"], "WARN");
    assert_eq!(recovered.len(), 1, "{recovered:?}");
    assert_eq!(recovered[0]["failures"], 5);
}
