//! `tokenmeter load` as a process: argument parsing, JSON on stdout, tables, exit codes.

use crate::load_support::{spawn, FakeConfig, FAKE_MODEL};

async fn tokenmeter(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .args(args)
        .env_remove("TOKENMETER_API_KEY")
        // A test that panics while waiting must not leave the process running.
        .kill_on_drop(true)
        .output()
        .await
        .expect("spawn tokenmeter")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_report_on_stdout_progress_on_stderr() {
    let fake = spawn(FakeConfig::default()).await;
    let url = format!("{}/v1", fake.url);
    let out = tokenmeter(&[
        "load",
        "--url",
        &url,
        "--levels",
        "1,2",
        "--max-tokens",
        "5",
        "--json",
        "--timeout",
        "5s",
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("stdout is one JSON document");
    assert_eq!(v["kind"], "load_report");
    assert_eq!(v["model"], FAKE_MODEL);
    assert_eq!(v["max_tokens"], 5);
    let levels = v["burst"]["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    assert_eq!(levels[1]["level"], 2);
    assert_eq!(levels[1]["completion_tokens"], 10);
    assert!(levels[1]["marginal_gain_pct"].is_number());
    assert!(levels[0]["marginal_gain_pct"].is_null());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warm-up") && err.contains("level   2"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn human_table_and_secret_stays_out_of_output() {
    let fake = spawn(FakeConfig::default()).await;
    let out = tokenmeter(&[
        "load",
        "--url",
        &fake.url,
        "--levels",
        "1,4",
        "--max-tokens",
        "5",
        "--no-stream",
        "--api-key",
        "sekrit-9",
        "--user",
        "bob",
        "--ignore-eos",
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("| Concurrency | Aggregate |"), "{text}");
    assert!(text.contains("for 4× users"), "{text}");
    assert!(!text.contains("sekrit") && !String::from_utf8_lossy(&out.stderr).contains("sekrit"));
    let seen = fake.state.seen.lock().unwrap().clone();
    assert!(seen
        .iter()
        .all(|s| s.body["stream"] == false && s.body["ignore_eos"] == true));
}

#[tokio::test]
async fn bad_arguments_fail_with_a_message() {
    for args in [
        &["load", "--url", "https://x"][..],
        &["load", "--url", "http://127.0.0.1:1", "--levels", "0"],
        &[
            "load",
            "--url",
            "http://127.0.0.1:1",
            "--sustained",
            "--duration",
            "5x",
        ],
    ] {
        let out = tokenmeter(args).await;
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!out.stderr.is_empty());
    }
}
