//! The ClickHouse SQL in `clickhouse/` against `analyze` on the same synthetic log, through chdb
//! (embedded ClickHouse). Needs a Python with chdb: `scripts/clickhouse.sh` makes one in a venv
//! and runs this test with `TOKENMETER_CHDB_PYTHON` pointing at it (as `.ci/run` does).

use std::process::Command;

use tokenmeter::analyze::{analyze, synth, AnalyzeOptions};
use tokenmeter::slo::SloConfig;

/// Runs `scripts/clickhouse_check.py` on the logs `glob` and analyze's report of them.
fn check(glob: &std::path::Path, report: &tokenmeter::analyze::Report) {
    let python = std::env::var("TOKENMETER_CHDB_PYTHON")
        .expect("TOKENMETER_CHDB_PYTHON: a python with chdb (scripts/clickhouse.sh)");
    let json = glob.with_file_name("analyze.json");
    std::fs::write(&json, serde_json::to_vec(report).unwrap()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/clickhouse_check.py");
    let out = Command::new(python)
        .arg(script)
        .arg(glob)
        .arg(&json)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    assert!(out.status.success(), "{text}");
}

#[test]
#[ignore = "needs chdb: run scripts/clickhouse.sh"]
fn clickhouse_sql_reproduces_analyze() {
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
    check(&log, &report);
}

#[test]
#[ignore = "needs chdb: run scripts/clickhouse.sh"]
fn clickhouse_sql_reproduces_the_production_curve_of_several_proxies() {
    // Agent-like traffic through two proxies: token curves, non-streamed requests (the guard's
    // cap), lines written before the curve, errors without a usage.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("clickhouse-agents");
    std::fs::create_dir_all(&dir).unwrap();
    let logs = [dir.join("proxy-a.jsonl"), dir.join("proxy-b.jsonl")];
    let mut files: Vec<std::io::BufWriter<std::fs::File>> = logs
        .iter()
        .map(|p| std::io::BufWriter::new(std::fs::File::create(p).unwrap()))
        .collect();
    let mut outs: Vec<&mut dyn std::io::Write> = files
        .iter_mut()
        .map(|f| f as &mut dyn std::io::Write)
        .collect();
    // Verdicts that miss on both bounds at every level (TTFT above 1.5 s one time in 20, the
    // pace slower than 50 ms a token now and then, errors), so that levels meet and miss.
    let slo = SloConfig {
        max_ttft_ms: 1_500.0,
        max_tpot_ms: 50.0,
        attainment_pct: 90.0,
        ..SloConfig::default()
    };
    synth::write_agents_logs(&mut outs, 6_000, 34, &slo).unwrap();
    drop(outs);
    drop(files);
    let opts = AnalyzeOptions {
        per_second: true,
        slo,
        ..AnalyzeOptions::default()
    };
    let report = analyze(&logs, &opts).unwrap();
    let p = report.capacity_production_tokens;
    assert!(
        p.token_curve > 0 && p.spread > 0 && p.no_first_token > 0,
        "{p:?}"
    );
    assert!(
        report
            .capacity_production
            .iter()
            .filter(|r| !r.thin)
            .count()
            >= 5,
        "the logs have several non-thin levels"
    );
    let sl = &report.service_level;
    let judged: Vec<_> = sl.levels.iter().filter(|r| !r.thin).collect();
    println!(
        "service level: {} | {}",
        sl.capacity.text,
        judged
            .iter()
            .map(|r| format!("{}: {:.1} %", r.in_flight, r.attainment_pct.unwrap_or(0.0)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(
        judged.len() >= 5,
        "several non-thin levels: {}",
        sl.capacity.text
    );
    check(&dir.join("proxy-*.jsonl"), &report);
}
