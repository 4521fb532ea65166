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
