//! The alerting rules of `deploy/prometheus/tokenmeter-alerts.yml`: `promtool` accepts them and
//! their unit test (`tokenmeter-alerts.test.yml`) passes; and in a real Prometheus scraping the
//! proxy, `VllmQueueing` fires once more streams are held than the simulator runs at once
//! (`max_num_seqs`), so requests wait in it.
//!
//! Needs promtool and Prometheus (`.ci/run` installs the Debian package):
//! `cargo test --release --test monitoring -- --ignored --nocapture monitoring_alerts::`.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use tokenmeter::sim::SimConfig;

use crate::monitoring_prometheus::{query, start_prometheus_with_rules, unix_now};
use crate::monitoring_support::*;

fn deploy(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/prometheus")
        .join(file)
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new(program("PROMTOOL", &["promtool"], "prometheus"))
        .args(args)
        .current_dir(deploy(""))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}: {text}");
    text
}

#[test]
#[ignore = "needs promtool; run by .ci/run"]
fn promtool_accepts_the_rules_and_their_unit_test_passes() {
    let checked = promtool(&["check", "rules", "tokenmeter-alerts.yml"]);
    assert!(checked.contains("SUCCESS: 4 rules found"), "{checked}");
    promtool(&["test", "rules", "tokenmeter-alerts.test.yml"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Prometheus; run by .ci/run"]
async fn the_queueing_alert_fires_in_prometheus_when_requests_wait_in_the_simulator() {
    // Two sequences at once: the third and fourth held streams wait.
    let rig = Rig::start_with(SimConfig {
        stop_probability_per_token: 0.0,
        max_num_seqs: 2,
        ..Default::default()
    })
    .await;
    let dir = Scratch::new("alerts");
    let (_prom, prom) = start_prometheus_with_rules(
        &dir,
        &[("tokenmeter", rig.admin)],
        Some(&deploy("tokenmeter-alerts.yml")),
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    let plan: Vec<(Duration, u32)> = (0..4).map(|_| (Duration::ZERO, 400)).collect();
    let streams = rig.hold_streams(&plan, deadline);
    let started = Instant::now();
    let fired = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let r = query(
            prom,
            r#"ALERTS{alertname="VllmQueueing",alertstate="firing"}"#,
            unix_now(),
        )
        .await;
        if !r.is_empty() {
            break Some(started.elapsed());
        }
        if Instant::now() > deadline {
            break None;
        }
    };
    let state = query(prom, "tokenmeter_saturation_state", unix_now()).await;
    eprintln!("VllmQueueing firing after {fired:?}; tokenmeter_saturation_state: {state:?}");
    let fired = fired.expect("VllmQueueing never fired");
    // The state needs a 10 s window with waiting requests in half its scrapes, the rule 10 s
    // more; Prometheus scrapes and evaluates every second.
    assert!(fired < Duration::from_secs(45), "fired after {fired:?}");
    for s in streams {
        s.abort();
    }
}
