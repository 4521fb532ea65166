//! Outputs: SVG plots parse as XML with one series element per line, `--json` matches the
//! committed schema, the binary prints the tables and writes the files.

use std::path::PathBuf;
use std::process::Command;

use crate::analyze_support::TempDir;
use tokenmeter::analyze::{analyze, svg, AnalyzeOptions};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/analyze/phases.jsonl")
}

fn series_of(svg_text: &str) -> Vec<(String, usize)> {
    let doc = roxmltree::Document::parse(svg_text).expect("SVG parses as XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.attribute("class") == Some("series"))
        .map(|n| {
            let pts = n
                .attribute("points")
                .unwrap_or("")
                .split_whitespace()
                .count();
            (n.attribute("data-series").unwrap().to_string(), pts)
        })
        .collect()
}

#[test]
fn svgs_parse_and_have_one_series_element_per_line() {
    let r = analyze(&[fixture()], &AnalyzeOptions::default()).unwrap();
    let plots = svg::all(&r);
    let names: Vec<&str> = plots.iter().map(|p| p.0).collect();
    assert_eq!(
        names,
        [
            "service_level.svg",
            "capacity.svg",
            "ttft.svg",
            "timeline.svg"
        ]
    );
    // The service-level plot: one point per level with a rate, thin ones hollow, the line drawn.
    let sl = roxmltree::Document::parse(&plots[0].1).unwrap();
    let dots = sl
        .descendants()
        .filter(|n| n.has_tag_name("circle") && n.attribute("data-n").is_some())
        .count();
    let rated = r
        .service_level
        .levels
        .iter()
        .filter(|l| l.per_request_tok_s.is_some())
        .count();
    assert_eq!(dots, rated);
    assert!(sl
        .descendants()
        .any(|n| n.attribute("class") == Some("service-line")));
    let plots = &plots[1..];
    let prod = r
        .capacity_production
        .iter()
        .filter(|c| c.gen_tok_s.is_some())
        .count();
    assert!(prod >= 3, "the fixture's levels are not thin: {prod}");
    assert_eq!(
        series_of(&plots[0].1),
        [
            ("aggregate tok/s".into(), 3),
            ("per-request tok/s".into(), 3),
            ("production aggregate tok/s".into(), prod),
            ("production per-request tok/s".into(), prod)
        ]
    );
    assert_eq!(
        series_of(&plots[1].1),
        [("ttft p50".into(), 16), ("ttft p90".into(), 16)]
    );
    assert_eq!(
        series_of(&plots[2].1),
        [("generated tok/s".into(), 360), ("in flight".into(), 360)]
    );
    for (_, text) in plots {
        let doc = roxmltree::Document::parse(text).unwrap();
        let ticks = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("tick"))
            .count();
        assert!(ticks >= 6, "axes have ticks");
        assert!(doc.descendants().filter(|n| n.has_tag_name("text")).count() >= 8);
    }
}

#[test]
fn an_empty_report_still_plots_valid_svg() {
    let dir = TempDir::new("empty");
    let path = dir.path("empty.jsonl");
    std::fs::write(&path, b"").unwrap();
    let r = analyze(&[path], &AnalyzeOptions::default()).unwrap();
    for (name, text) in svg::all(&r) {
        assert!(roxmltree::Document::parse(&text).is_ok(), "{name}");
        let want = match name {
            "capacity.svg" => 4,
            "service_level.svg" => 0,
            _ => 2,
        };
        assert_eq!(series_of(&text).len(), want);
    }
}

fn validate(value: &serde_json::Value) {
    let schema_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schemas/analyze.schema.json");
    let schema: serde_json::Value =
        serde_json::from_slice(&std::fs::read(schema_path).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{e} at {}", e.instance_path))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn json_report_matches_the_schema() {
    let opts = AnalyzeOptions {
        per_second: true,
        ..AnalyzeOptions::default()
    };
    let r = analyze(&[fixture()], &opts).unwrap();
    let v = serde_json::to_value(&r).unwrap();
    validate(&v);
    assert_eq!(v["capacity"][1]["gen_tok_s"]["mean"], 150.0);
    // The schema is strict enough to catch a renamed field.
    let schema: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schemas/analyze.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let mut broken = v.clone();
    broken["capacity"][0]["gen_tok_s"] = serde_json::json!({"avg": 1.0});
    assert!(!validator.is_valid(&broken));
    let empty = analyze(&[], &AnalyzeOptions::default()).unwrap();
    validate(&serde_json::to_value(&empty).unwrap());
}

#[test]
fn binary_prints_tables_and_writes_json_svg_and_html() {
    let bin = env!("CARGO_BIN_EXE_tokenmeter");
    let out = Command::new(bin)
        .arg("analyze")
        .arg(fixture())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "## Summary",
        "## Capacity",
        "| 16 ",
        "350.0 ± 0.0 tok/s",
        "## Per user",
        "## Cold starts (1;",
        "phases.jsonl:13",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    let dir = TempDir::new("cli");
    let html = dir.path("report.html");
    let out = Command::new(bin)
        .args(["analyze", "--json", "--user", "lane-0", "--svg"])
        .arg(dir.path("svg"))
        .arg("--html")
        .arg(&html)
        .arg(fixture())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    validate(&v);
    assert_eq!(v["summary"]["users"], 1);
    for f in [
        "service_level.svg",
        "capacity.svg",
        "ttft.svg",
        "timeline.svg",
    ] {
        let text = std::fs::read_to_string(dir.path("svg").join(f)).unwrap();
        assert!(roxmltree::Document::parse(&text).is_ok());
    }
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(page.matches("<svg ").count(), 4);
    assert!(page.contains("<table>") && page.contains("Capacity"));
    assert!(
        !page.contains("src=\"http") && !page.contains("href=\"http"),
        "self-contained"
    );
    // Relative bounds: the fixture is from 2026-11-29 18:00-18:06 UTC.
    let requests = |args: &[&str]| {
        let out = Command::new(bin)
            .arg("analyze")
            .args(args)
            .arg("--json")
            .arg(fixture())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["summary"]["requests"].as_u64().unwrap()
    };
    assert_eq!(requests(&["--from", "-100000d"]), 36);
    assert_eq!(requests(&["--to", "-100000d"]), 0);
    assert_eq!(
        requests(&[
            "--from",
            "2026-11-29T18:02:00Z",
            "--to",
            "2026-11-29T18:04:00Z"
        ]),
        16
    );
    // A bad bound or a missing file is an error exit with a message, not a crash.
    for args in [&["--from", "-2x"][..], &["--to", "yesterday"][..]] {
        let out = Command::new(bin)
            .arg("analyze")
            .args(args)
            .arg(fixture())
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("bad"),
            "{args:?}"
        );
    }
    let out = Command::new(bin)
        .args(["analyze", "/nonexistent/x.jsonl"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open"));
}

#[test]
fn html_escapes_every_cell() {
    let mut recs = tokenmeter::analyze::synth::steady_phases();
    recs[0].user = "<b>x|y</b> & co".into();
    let dir = TempDir::new("html");
    let path = dir.path("a.jsonl");
    std::fs::write(&path, crate::analyze_support::lines_of(&recs)).unwrap();
    let r = analyze(&[path], &AnalyzeOptions::default()).unwrap();
    let page = tokenmeter::analyze::html::page(&r);
    assert!(
        page.contains("<td>&lt;b&gt;x|y&lt;/b&gt; &amp; co</td>"),
        "{page}"
    );
    assert!(!page.contains("<b>x"));
    // Every table row of the per-user table has its six cells.
    let users = page.split("<h2>Per user</h2>").nth(1).unwrap();
    let table = &users[..users.find("</table>").unwrap()];
    for row in table.split("<tr>").skip(2) {
        assert_eq!(row.matches("<td>").count(), 6, "{row}");
    }
}

#[test]
fn per_api_table_counts_every_api_and_reads_old_lines_by_path() {
    use tokenmeter::analyze::synth::{record, T0};
    use tokenmeter::dialect::Api;
    let dir = TempDir::new("apis");
    let path = dir.path("apis.jsonl");
    let mut log = Vec::new();
    let cases = [
        (Some(Api::Messages), "/v1/messages", 30u64),
        (Some(Api::Messages), "/v1/messages", 10),
        (Some(Api::Responses), "/v1/responses", 20),
        (None, "/v1/chat/completions", 40),
        (None, "/v1/messages/count_tokens", 0),
    ];
    for (i, (api, p, tokens)) in cases.into_iter().enumerate() {
        let mut r = record(
            T0 + i as u64 * 1_000_000_000,
            500.0,
            Some(50.0),
            tokens,
            true,
            "u",
        );
        r.api = api;
        r.path = p.into();
        let mut v = serde_json::to_value(&r).unwrap();
        if api.is_none() {
            // A line written before the `api` field existed.
            v.as_object_mut().unwrap().remove("api");
        }
        log.extend_from_slice(format!("{v}\n").as_bytes());
    }
    std::fs::write(&path, &log).unwrap();
    let r = analyze(std::slice::from_ref(&path), &AnalyzeOptions::default()).unwrap();
    let v = serde_json::to_value(&r).unwrap();
    validate(&v);
    let rows: Vec<(String, u64, u64)> = v["apis"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["api"].as_str().unwrap().to_string(),
                a["requests"].as_u64().unwrap(),
                a["completion_tokens"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("chat".to_string(), 1, 40),
            ("responses".to_string(), 1, 20),
            ("messages".to_string(), 2, 40)
        ]
    );
    assert_eq!(v["apis"][2]["share_pct"], 40.0);
    assert_eq!(v["summary"]["generation_requests"], 4);
    let out = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .arg("analyze")
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("## Per API"), "{text}");
    assert!(text.contains("| messages "), "{text}");
}

#[test]
fn the_simulators_record_is_reported_beside_the_log() {
    use tokenmeter::sim::request_log::TruthRecord;
    let dir = TempDir::new("sim-truth");
    let truth = dir.0.join("truth.jsonl");
    // Two requests over the same 0.8 s (level 2), one alone after them (level 1): one met, one
    // missed on its pace (10 tokens: 700 ms / 9 = 78 ms a token against 40), one non-streamed
    // met on its whole time.
    let rec = |arrival_s: u64, tokens: u64, stream: bool| TruthRecord {
        arrival_ns: arrival_s * 1_000_000_000,
        queue_ns: 0,
        ttft_ns: 100_000_000,
        e2e_ns: 800_000_000,
        prompt_tokens: 1_000,
        cached_tokens: 0,
        completion_tokens: tokens,
        stream,
    };
    let lines: String = [rec(10, 20, true), rec(10, 10, true), rec(20, 20, false)]
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    std::fs::write(&truth, lines).unwrap();
    let bin = env!("CARGO_BIN_EXE_tokenmeter");
    let run = |json: bool| {
        let mut c = Command::new(bin);
        c.arg("analyze")
            .arg(fixture())
            .arg("--sim-truth")
            .arg(&truth);
        if json {
            c.arg("--json");
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let v: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    validate(&v);
    let t = &v["sim_truth"];
    assert_eq!(t["requests"], 3);
    let levels = t["service_level"]["levels"].as_array().unwrap();
    let at = |n: u64| levels.iter().find(|l| l["in_flight"] == n).unwrap();
    assert_eq!(
        (at(2)["requests"].clone(), at(2)["met"].clone()),
        (2.into(), 1.into())
    );
    assert_eq!(at(2)["missed"]["pace"], 1);
    assert_eq!(
        (at(1)["requests"].clone(), at(1)["met"].clone()),
        (1.into(), 1.into())
    );
    let text = run(false);
    assert!(
        text.contains("Against the simulator's truth (3 requests in"),
        "{text}"
    );
    // Without the flag the report has no such field.
    let plain = analyze(&[fixture()], &AnalyzeOptions::default()).unwrap();
    assert!(serde_json::to_value(&plain)
        .unwrap()
        .get("sim_truth")
        .is_none());
}
