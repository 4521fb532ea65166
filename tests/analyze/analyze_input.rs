//! Inputs: malformed lines, gzip, several files in any order, stdin-like spooling, filters.

use std::io::Write;

use crate::analyze_support::{lines_of, write, TempDir};
use flate2::write::GzEncoder;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokenmeter::analyze::{analyze, filter::Filter, synth, AnalyzeOptions, Report};
use tokenmeter::clock::NANOS_PER_SEC;

fn json(r: &Report) -> serde_json::Value {
    let mut v = serde_json::to_value(r).unwrap();
    v["inputs"]["files"] = serde_json::Value::Null;
    v
}

#[test]
fn malformed_lines_are_counted_with_positions_not_fatal() {
    let good = lines_of(&synth::steady_phases()[..3]);
    let mut valid = serde_json::to_value(&synth::steady_phases()[0]).unwrap();
    let mut log = Vec::new();
    log.extend_from_slice(&good); // lines 1-3
    log.extend_from_slice(b"{\"type\":\"request\",\"schema\":1,\"ts_ns\":12\n"); // 4: truncated
    log.extend_from_slice(b"\x00\xff\xfe garbage\n"); // 5: random bytes
    valid["schema"] = 7.into();
    log.extend_from_slice(format!("{valid}\n").as_bytes()); // 6: unknown schema
    valid["schema"] = 1.into();
    valid.as_object_mut().unwrap().remove("user");
    log.extend_from_slice(format!("{valid}\n").as_bytes()); // 7: missing field
    log.extend_from_slice(b"{\"type\":\"server_sample\",\"running\":[1,2]}\n"); // 8: other type
    log.extend_from_slice(b"\n"); // 9: blank
    log.extend_from_slice(b"{\"type\":\"request\",\"schema\":1,\"e2e_ms\":\"x\"}\n"); // 10: wrong type
    log.extend_from_slice(b"[1,2,3]\n"); // 11: not an object
    log.extend_from_slice(b"{\"type\":\"request\""); // 12: truncated, no newline
    let dir = TempDir::new("bad");
    let path = write(&dir.path("bad.jsonl"), &log);
    let r = analyze(&[path], &AnalyzeOptions::default()).unwrap();
    let i = &r.inputs;
    assert_eq!(i.lines, 12);
    assert_eq!(i.request_lines, 3);
    assert_eq!(i.other_lines, 1);
    assert_eq!(i.bad_lines, 7);
    let by: Vec<(String, u64)> = serde_json::from_value::<serde_json::Map<_, _>>(
        serde_json::to_value(&i.bad_by_reason).unwrap(),
    )
    .unwrap()
    .into_iter()
    .map(|(k, v)| (k, v.as_u64().unwrap()))
    .collect();
    assert_eq!(
        by,
        [
            ("not_json".into(), 3),
            ("missing_field".into(), 1),
            ("unknown_schema".into(), 1),
            ("invalid_value".into(), 2)
        ]
    );
    let name = dir.path("bad.jsonl").display().to_string();
    let want: Vec<String> = [4, 5, 6, 7, 10]
        .iter()
        .map(|l| format!("{name}:{l}"))
        .collect();
    assert_eq!(i.bad_positions, want);
    assert_eq!(r.summary.bad_lines, 7);
    assert_eq!(r.summary.requests, 3);
}

#[test]
fn extreme_timestamps_do_not_panic() {
    let mut recs = synth::steady_phases()[..2].to_vec();
    recs[0].ts_ns = u64::MAX - 5;
    recs[1].ts_ns = 0;
    recs[1].e2e_ms = Some(86_400_000.0);
    let dir = TempDir::new("extreme");
    let path = write(&dir.path("x.jsonl"), &lines_of(&recs));
    let r = analyze(&[path], &AnalyzeOptions::default()).unwrap();
    assert_eq!(r.summary.requests, 2);
    let _ = tokenmeter::analyze::tables::render(&r);
    let _ = tokenmeter::analyze::svg::all(&r);
}

#[test]
fn random_bytes_never_crash() {
    let mut rng = SmallRng::seed_from_u64(42);
    let good = lines_of(&synth::steady_phases());
    let dir = TempDir::new("fuzz");
    for round in 0..30 {
        let mut data = good.clone();
        // Flip, insert and cut bytes at random places.
        for _ in 0..rng.gen_range(1..200) {
            let at = rng.gen_range(0..data.len());
            match rng.gen_range(0..3) {
                0 => data[at] = rng.gen(),
                1 => data.insert(at, rng.gen()),
                _ => data.truncate(at.max(1)),
            }
        }
        if round % 5 == 0 {
            data = (0..4096).map(|_| rng.gen()).collect();
        }
        let path = write(&dir.path("fuzz.jsonl"), &data);
        let r = analyze(&[path], &AnalyzeOptions::default()).unwrap();
        assert!(
            r.inputs.request_lines + r.inputs.bad_lines + r.inputs.other_lines <= r.inputs.lines
        );
        let _ = tokenmeter::analyze::tables::render(&r);
        let _ = tokenmeter::analyze::svg::all(&r);
    }
}

#[test]
fn gzip_and_shuffled_split_files_give_the_same_report() {
    let records = synth::steady_phases();
    let dir = TempDir::new("multi");
    let one = write(&dir.path("all.jsonl"), &lines_of(&records));
    let mut shuffled = records.clone();
    shuffled.shuffle(&mut SmallRng::seed_from_u64(3));
    let (a, b) = shuffled.split_at(15);
    let first = write(&dir.path("part-b.jsonl"), &lines_of(b));
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&lines_of(a)).unwrap();
    // No .gz suffix: detected by the magic bytes.
    let second = write(&dir.path("part-a.log"), &gz.finish().unwrap());
    let opts = AnalyzeOptions {
        per_second: true,
        ..AnalyzeOptions::default()
    };
    let whole = analyze(&[one], &opts).unwrap();
    let split = analyze(&[first, second], &opts).unwrap();
    assert_eq!(json(&whole), json(&split));
    assert_eq!(split.inputs.files.len(), 2);
    assert_eq!(split.capacity.len(), 3);
}

#[test]
fn a_truncated_gzip_keeps_what_was_read_and_a_missing_file_is_an_error() {
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&lines_of(&synth::steady_phases())).unwrap();
    let bytes = gz.finish().unwrap();
    let dir = TempDir::new("trunc");
    let path = write(&dir.path("cut.jsonl.gz"), &bytes[..bytes.len() - 20]);
    let r = analyze(&[path], &AnalyzeOptions::default()).unwrap();
    assert_eq!(r.inputs.read_errors.len(), 1, "{:?}", r.inputs.read_errors);
    assert!(r.inputs.read_errors[0].contains("cut.jsonl.gz"));
    assert!(r.summary.requests > 30, "{}", r.summary.requests);
    let text = tokenmeter::analyze::tables::render(&r);
    assert!(text.contains("Read error"));
    let err = analyze(&[dir.path("nope.jsonl")], &AnalyzeOptions::default()).unwrap_err();
    assert!(err.to_string().contains("cannot open"), "{err}");
}

#[test]
fn filters_select_by_time_user_and_model() {
    let mut records = synth::steady_phases();
    records[5].model = Some("other-model".into());
    let dir = TempDir::new("filter");
    let path = write(&dir.path("a.jsonl"), &lines_of(&records));
    let run = |filter: Filter| {
        analyze(
            std::slice::from_ref(&path),
            &AnalyzeOptions {
                filter,
                ..AnalyzeOptions::default()
            },
        )
        .unwrap()
    };
    // The N=4 phase only: arrivals in [120 s, 240 s).
    let r = run(Filter {
        from: Some(synth::T0 + 120 * NANOS_PER_SEC),
        to: Some(synth::T0 + 240 * NANOS_PER_SEC),
        ..Filter::default()
    });
    assert_eq!(r.summary.requests, 16);
    assert_eq!(r.inputs.filtered_out, 20);
    assert_eq!(
        r.capacity.iter().map(|c| c.in_flight).collect::<Vec<_>>(),
        [4]
    );
    // One user: lane-0 alone is at N=1 all the time.
    let r = run(Filter {
        users: vec!["lane-0".into()],
        ..Filter::default()
    });
    assert_eq!(r.summary.requests, 4 + 4 + 1);
    assert_eq!(r.summary.users, 1);
    assert_eq!(r.capacity.len(), 1);
    assert_eq!((r.capacity[0].in_flight, r.capacity[0].seconds), (1, 360));
    let r = run(Filter {
        models: vec!["other-model".into()],
        ..Filter::default()
    });
    assert_eq!(r.summary.requests, 1);
    assert_eq!(r.summary.models[0].model, "other-model");
    let r = run(Filter {
        models: vec!["nope".into()],
        ..Filter::default()
    });
    assert_eq!(r.summary.requests, 0);
    assert!(r.capacity.is_empty());
    assert_eq!(r.summary.first_arrival, None);
}

#[test]
fn stdin_is_read_once_plain_or_gzip() {
    let bytes = lines_of(&synth::steady_phases());
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&bytes).unwrap();
    for input in [bytes.clone(), gz.finish().unwrap()] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
            .args(["analyze", "--json", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&input).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["inputs"]["files"][0], "-");
        assert_eq!(v["summary"]["requests"], 36);
        assert_eq!(v["capacity"][2]["gen_tok_s"]["mean"], 350.0);
    }
}

/// The client's faults are told from the server's: a `client_error` line, and lines written
/// before the outcome existed (vLLM's 404 logged `upstream_error`, the proxy's 413 logged
/// `proxy_error`), count as the client's; a 500 and an unreachable upstream (502) as the box's.
#[test]
fn client_faults_are_not_errors_of_the_box_in_old_lines_too() {
    let base = serde_json::to_value(&synth::steady_phases()[0]).unwrap();
    let mut log = Vec::new();
    for (outcome, status) in [
        ("client_error", 400),
        ("upstream_error", 404),
        ("proxy_error", 413),
        ("upstream_error", 429),
        ("upstream_error", 500),
        ("proxy_error", 502),
        ("ok", 200),
    ] {
        let mut v = base.clone();
        v["outcome"] = outcome.into();
        v["status"] = status.into();
        log.extend_from_slice(format!("{v}\n").as_bytes());
    }
    let dir = TempDir::new("faults");
    let path = write(&dir.path("faults.jsonl"), &log);
    let r = analyze(&[path], &AnalyzeOptions::default()).unwrap();
    let s = &r.summary;
    assert_eq!(s.client_errors, 3, "{:?}", s.by_outcome);
    assert_eq!(s.errors, 3, "429, 500 and 502: {:?}", s.by_outcome);
    assert_eq!(s.by_outcome.get("client_error"), Some(&3));
    assert_eq!(s.by_outcome.get("upstream_error"), Some(&2));
    assert_eq!(s.by_outcome.get("proxy_error"), Some(&1));
}

/// A file of garbage is not an empty report: the binary says no record was found and fails;
/// an `--html` path that cannot be written is named.
#[test]
fn garbage_only_input_and_an_unwritable_html_path_fail_with_a_reason() {
    let dir = TempDir::new("garbage");
    let garbage = write(&dir.path("g.jsonl"), b"not json\n\x00\xff\n{\"a\":1}\n");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .arg("analyze")
        .arg(&garbage)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no request record found"), "{err}");
    assert!(err.contains("3 lines read"), "{err}");
    assert!(out.stdout.is_empty(), "no empty tables");
    let good = write(
        &dir.path("ok.jsonl"),
        &lines_of(&synth::steady_phases()[..3]),
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .arg("analyze")
        .arg(&good)
        .args(["--html", "/nonexistent-dir/r.html"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent-dir/r.html"), "{err}");
}
