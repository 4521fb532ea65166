//! The ClickHouse SQL in `clickhouse/` against `analyze` on the same synthetic log, through chdb
//! (embedded ClickHouse). Needs a Python with chdb: `scripts/clickhouse.sh` makes one in a venv
//! and runs this test with `TOKENMETER_CHDB_PYTHON` pointing at it (as `.ci/run` does).

use std::process::Command;

use tokenmeter::analyze::{analyze, synth, AnalyzeOptions};

#[test]
#[ignore = "needs chdb: run scripts/clickhouse.sh"]
fn clickhouse_sql_reproduces_analyze() {
    let python = std::env::var("TOKENMETER_CHDB_PYTHON")
        .expect("TOKENMETER_CHDB_PYTHON: a python with chdb (scripts/clickhouse.sh)");
    // Kept under target/ to rerun the script by hand.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("clickhouse");
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.jsonl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&log).unwrap());
    synth::write_load_log(&mut f, 20_000, 18).unwrap();
    drop(f);
    let opts = AnalyzeOptions {
        per_second: true,
        ..AnalyzeOptions::default()
    };
    let report = analyze(std::slice::from_ref(&log), &opts).unwrap();
    assert!(
        report.capacity.len() > 5,
        "the log has several steady levels"
    );
    let json = dir.join("analyze.json");
    std::fs::write(&json, serde_json::to_vec(&report).unwrap()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/clickhouse_check.py");
    let out = Command::new(python)
        .arg(script)
        .arg(&log)
        .arg(&json)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    assert!(out.status.success(), "{text}");
}
