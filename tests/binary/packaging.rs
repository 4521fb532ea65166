//! The Dockerfile, compose.yaml and the systemd unit: every command line and config in them is
//! accepted by `tokenmeter serve --check-config`, with the paths they use inside the image or on
//! the host mapped to the repository's files and a temporary log directory. (No container
//! engine runs on the test machines, so the image itself is not built here.)

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::TempDir;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Maps the deployed paths to where the same files are here.
fn map_path(arg: &str, logs: &Path) -> String {
    arg.replace(
        "/etc/tokenmeter/tokenmeter.toml",
        repo("deploy/tokenmeter.toml").to_str().unwrap(),
    )
    .replace("/var/log/tokenmeter", logs.to_str().unwrap())
}

/// Runs the binary with `args` (the first being `serve`) plus `--check-config`.
fn check(args: &[String], env: &[(String, String)]) {
    let logs = TempDir::new("packaging");
    assert_eq!(args.first().map(String::as_str), Some("serve"), "{args:?}");
    let mapped: Vec<String> = args.iter().map(|a| map_path(a, &logs.0)).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .args(&mapped)
        .arg("--check-config")
        .env_remove("TOKENMETER_CONFIG")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{mapped:?} {env:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        logs.0.join("access.jsonl").exists(),
        "the access log opened for append"
    );
}

/// The JSON array after `key` on one line of `text` (Dockerfile exec form, compose flow lists).
fn json_array_after(text: &str, key: &str) -> Vec<String> {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(key))
        .unwrap_or_else(|| panic!("no line starting with {key}"));
    let start = line.find('[').expect("an exec-form array");
    serde_json::from_str(&line[start..]).unwrap_or_else(|e| panic!("{line}: {e}"))
}

#[test]
fn the_dockerfile_runs_a_checked_config_as_non_root_with_a_healthcheck() {
    let text = read("Dockerfile");
    assert!(
        text.contains("AS build") && text.matches("\nFROM ").count() == 2,
        "multi-stage"
    );
    assert!(text.contains("\nUSER nonroot\n"), "non-root");
    let entry = json_array_after(&text, "ENTRYPOINT");
    assert_eq!(entry, vec!["/usr/local/bin/tokenmeter"]);
    check(&json_array_after(&text, "CMD [\"serve\""), &[]);
    // The healthcheck is the binary's own probe of the liveness endpoint.
    let health = json_array_after(&text, "CMD [\"/usr/local/bin/tokenmeter\", \"healthcheck\"");
    assert_eq!(health[1], "healthcheck");
    assert!(health.last().unwrap().ends_with("/stats/healthz"));
    // Files the image copies exist.
    for l in text
        .lines()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
    {
        let src = l.split_whitespace().nth(1).unwrap();
        assert!(src == "." || repo(src).exists(), "{l}");
    }
}

#[test]
fn compose_runs_vllm_on_the_gpu_tokenmeter_in_front_and_prometheus_scraping_both() {
    let text = read("compose.yaml");
    let (before, tm) = text
        .split_once("\n  tokenmeter:\n")
        .expect("a tokenmeter service");
    let tm = tm.split("\n  prometheus:\n").next().unwrap();
    assert!(before.contains("vllm/vllm-openai") && before.contains("capabilities: [gpu]"));
    assert!(before.contains("--enable-request-id-headers"));
    let env: Vec<(String, String)> = tm
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- TOKENMETER_"))
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (format!("TOKENMETER_{k}"), v.to_string())
        })
        .collect();
    assert!(env
        .iter()
        .any(|(k, v)| k == "TOKENMETER_UPSTREAM" && v == "http://vllm:8000"));
    check(&json_array_after(tm, "command:"), &env);
    assert!(
        tm.contains("tokenmeter-log:/var/log/tokenmeter"),
        "the access log on a volume"
    );
    // Prometheus scrapes tokenmeter's admin listener and vLLM.
    let prom = read("deploy/prometheus/prometheus.yml");
    let admin = env
        .iter()
        .find(|(k, _)| k == "TOKENMETER_ADMIN_LISTEN")
        .map(|(_, v)| v.rsplit(':').next().unwrap().to_string())
        .unwrap();
    assert!(prom.contains(&format!("\"tokenmeter:{admin}\"")), "{prom}");
    assert!(prom.contains("metrics_path: /stats/metrics") && prom.contains("\"vllm:8000\""));
    for f in [
        "deploy/prometheus/prometheus.yml",
        "deploy/grafana/provisioning",
    ] {
        assert!(text.contains(&format!("./{f}:")), "{f} mounted");
        assert!(repo(f).exists(), "{f}");
    }
}

#[test]
fn the_systemd_unit_is_hardened_reloads_with_sighup_and_runs_a_checked_command() {
    let text = read("deploy/systemd/tokenmeter.service");
    for want in [
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "LogsDirectory=tokenmeter",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=\n",
    ] {
        assert!(text.contains(want), "{want}");
    }
    let exec = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap();
    let mut words = exec.split_whitespace().map(String::from);
    assert_eq!(words.next().as_deref(), Some("/usr/local/bin/tokenmeter"));
    let env: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("Environment="))
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect();
    check(&words.collect::<Vec<_>>(), &env);
    // The unit's log directory is where the access log goes.
    assert!(exec.contains("/var/log/tokenmeter/"));
}

#[tokio::test]
async fn the_healthcheck_command_passes_on_a_live_proxy_and_fails_without_one() {
    let proxy = crate::common::TestProxy::start("http://127.0.0.1:9", |_| {}).await;
    let url = format!("http://{}/stats/healthz", proxy.addr);
    let run = |url: String| {
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
                .args(["healthcheck", "--url", &url])
                .output()
                .unwrap()
                .status
        })
    };
    assert!(
        run(url).await.unwrap().success(),
        "alive although vLLM is down"
    );
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/stats/healthz", dead.local_addr().unwrap());
    drop(dead);
    assert_eq!(run(url).await.unwrap().code(), Some(1));
    proxy.stop().await;
}

/// The `tokenmeter:` service of a compose file: its lines up to the next service.
fn service<'a>(text: &'a str, name: &str) -> &'a str {
    let (_, rest) = text
        .split_once(&format!("\n  {name}:\n"))
        .unwrap_or_else(|| panic!("no {name} service"));
    let end = rest
        .lines()
        .scan(0, |at, l| {
            let here = *at;
            *at += l.len() + 1;
            Some((here, l))
        })
        .find(|(_, l)| {
            l.len() > 2 && l.starts_with("  ") && !l.starts_with("   ") && l.ends_with(':')
        })
        .map_or(rest.len(), |(at, _)| at);
    &rest[..end]
}

/// Compose's `${NAME:-default}` and `${NAME:?message}` as they read with `set` defining some.
fn interpolate(v: &str, set: &[(&str, &str)]) -> String {
    let mut out = v.to_string();
    while let Some(start) = out.find("${") {
        let end = start + out[start..].find('}').unwrap();
        let inner = &out[start + 2..end];
        let name = inner.split([':', '-', '?']).next().unwrap();
        let value = match set.iter().find(|(k, _)| *k == name) {
            Some((_, v)) => v.to_string(),
            None => {
                let default = inner.split_once(":-").map(|(_, d)| d.to_string());
                default.unwrap_or_else(|| panic!("{name} has no default: {v}"))
            }
        };
        out.replace_range(start..=end, &value);
    }
    out
}

/// A list of `- item` entries under `key:` in a service block, unquoted.
fn list(block: &str, key: &str) -> Vec<String> {
    let mut lines = block.lines().skip_while(|l| l.trim() != format!("{key}:"));
    lines.next();
    lines
        .take_while(|l| l.trim().starts_with('-') || l.trim().starts_with('#'))
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|v| v.trim_matches('"').to_string())
        .collect()
}

/// The environment a compose service sets, interpolated with `set`.
fn compose_env(block: &str, set: &[(&str, &str)]) -> Vec<(String, String)> {
    list(block, "environment")
        .iter()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), interpolate(v, set))
        })
        .collect()
}

/// Every compose form publishes the admin port, on the host's loopback unless told otherwise,
/// and binds the admin listener inside the container where that published port reaches it;
/// the image does the same for `docker run`, and each file names the dashboard's URL.
#[test]
fn the_dashboard_is_reachable_through_the_published_admin_port() {
    let toml: toml::Table = read("deploy/tokenmeter.toml").parse().unwrap();
    let file_admin = toml["admin_listen"].as_str().unwrap().to_string();
    for file in ["compose.yaml", "compose.existing-vllm.yaml"] {
        let text = read(file);
        assert!(
            text.contains("http://127.0.0.1:9090/"),
            "{file} names the dashboard"
        );
        let tm = service(&text, "tokenmeter");
        let env = compose_env(tm, &[("VLLM_URL", "http://10.0.0.5:8000")]);
        let admin = env
            .iter()
            .find(|(k, _)| k == "TOKENMETER_ADMIN_LISTEN")
            .map_or(file_admin.clone(), |(_, v)| v.clone());
        let (host, port) = admin.rsplit_once(':').unwrap();
        assert!(
            host == "0.0.0.0" || host == "[::]",
            "{file}: admin on {admin} is unreachable from a published port"
        );
        let published: Vec<String> = list(tm, "ports")
            .iter()
            .map(|p| interpolate(p, &[]))
            .collect();
        let admin_port = published
            .iter()
            .find(|p| p.ends_with(&format!(":{port}")))
            .unwrap_or_else(|| panic!("{file}: admin port {port} not published: {published:?}"));
        assert!(
            admin_port.starts_with("127.0.0.1:"),
            "{file}: {admin_port} is not the host's loopback by default"
        );
        assert!(published.iter().any(|p| p == "8080:8080"), "{file}");
        // The same environment passes the config check.
        check(&json_array_after(tm, "command:"), &env);
    }
    let existing = read("compose.existing-vllm.yaml");
    assert!(!existing.contains("\n  vllm:\n"), "no second vLLM");
    let env = compose_env(
        service(&existing, "tokenmeter"),
        &[("VLLM_URL", "http://x:1")],
    );
    assert!(env.contains(&("TOKENMETER_UPSTREAM".into(), "http://x:1".into())));
    let docker = read("Dockerfile");
    assert!(docker.contains("\nENV TOKENMETER_ADMIN_LISTEN=0.0.0.0:9090\n"));
    assert!(docker.contains("EXPOSE 8080 9090"));
    assert!(docker.contains("-p 127.0.0.1:9090:9090") && docker.contains("http://127.0.0.1:9090/"));
}

/// compose.yaml's tokenmeter without containers: the binary with the image's config, the
/// service's command line and environment (the upstream pointed at a stand-in, and port 0 for
/// the fixed ports), on all interfaces as in the container: the dashboard answers on the admin
/// port, and /stats counts the request that went through.
#[tokio::test]
async fn the_compose_configuration_serves_its_dashboard_without_containers() {
    use crate::common::{fixture, post, raw_request, spawn_logged, FakeUpstream};
    let up = FakeUpstream::start(vec![
        fixture("01_chat_nonstream.http").script(std::time::Duration::ZERO)
    ])
    .await;
    let text = read("compose.yaml");
    let tm = service(&text, "tokenmeter");
    let logs = TempDir::new("compose");
    let args: Vec<String> = json_array_after(tm, "command:")
        .iter()
        .map(|a| map_path(a, &logs.0))
        .collect();
    let env: Vec<(String, String)> = compose_env(tm, &[])
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "TOKENMETER_UPSTREAM" => (k, up.url()),
            "TOKENMETER_ADMIN_LISTEN" => {
                let host = v.rsplit_once(':').unwrap().0.to_string();
                (k, format!("{host}:0"))
            }
            _ => (k, v),
        })
        .chain([("TOKENMETER_LISTEN".to_string(), "0.0.0.0:0".to_string())])
        .collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tokenmeter"));
    cmd.args(&args)
        .env_remove("TOKENMETER_CONFIG")
        .env_remove("TOKENMETER_LOG")
        .envs(env.iter().map(|(k, v)| (k, v)));
    let (_child, addr, rx) = spawn_logged(&mut cmd);
    let admin_port: u16 = loop {
        let line = rx.recv_timeout(std::time::Duration::from_secs(20)).unwrap();
        if let Some(i) = line.find("stats listening on ") {
            let rest = &line[i + "stats listening on ".len()..];
            let a = rest
                .split(|c: char| c.is_whitespace() || c == '"')
                .next()
                .unwrap();
            break a.rsplit_once(':').unwrap().1.parse().unwrap();
        }
    };
    let main = std::net::SocketAddr::from(([127, 0, 0, 1], addr.port()));
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], admin_port));
    let r = raw_request(
        main,
        &post(
            "/v1/chat/completions",
            r#"{"model":"m","messages":[]}"#,
            &[],
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    let page = raw_request(
        admin,
        b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(page.status, 200);
    assert!(String::from_utf8_lossy(&page.body).contains("<title>tokenmeter"));
    let stats = raw_request(
        admin,
        b"GET /stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(stats.status, 200);
    assert_eq!(stats.json()["totals"]["requests"], 1);
    // What Prometheus scrapes there too.
    assert_eq!(
        raw_request(
            admin,
            b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        .await
        .status,
        200
    );
}
