//! Prometheus exposition: well-formed lines, monotonic counters, cumulative histograms, live
//! token counters settled to usage, bounded labels.

use std::collections::BTreeMap;

use crate::meter_support::{at, record, T0};
use tokenmeter::meter::{Meter, MeterConfig};
use tokenmeter::record::Outcome;

/// Parses sample lines into `series -> value`, asserting every line is a comment or
/// `name{labels} value` / `name value`.
fn parse(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(name.starts_with("tokenmeter_"), "{line}");
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
        if name_end < series.len() {
            let labels = &series[name_end + 1..series.len() - 1];
            assert!(series.ends_with('}'), "{line}");
            for pair in labels.split("\",") {
                let (k, v) = pair
                    .split_once("=\"")
                    .unwrap_or_else(|| panic!("bad labels {line:?}"));
                assert!(
                    k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "{line}"
                );
                assert!(
                    !v.trim_end_matches('"').contains('"') || v.contains("\\\""),
                    "{line}"
                );
            }
        }
        let v: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value {line:?}"));
        assert!(
            out.insert(series.to_string(), v).is_none(),
            "duplicate series {series}"
        );
    }
    out
}

fn finish(m: &mut Meter, id: u64, t: f64, model: &str, user: &str, outcome: Outcome, e2e_ms: f64) {
    m.request_started(at(t), id, user, Some(model));
    let mut r = record(at(t), e2e_ms, Some(e2e_ms / 4.0), Some(20), Some(5), true);
    r.request_id = format!("tm-1-{id:x}");
    r.model = Some(model.into());
    r.user = user.into();
    r.outcome = outcome;
    if outcome == Outcome::UpstreamError {
        r.status = Some(503);
    }
    m.request_finished(at(t) + (e2e_ms * 1e6) as u64, &r);
}

fn check_histograms(s: &BTreeMap<String, f64>, name: &str, model: &str) {
    let prefix = format!("{name}_bucket{{model=\"{model}\",le=\"");
    let mut buckets: Vec<(f64, f64)> = s
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix(&prefix)
                .map(|le| (le.trim_end_matches("\"}"), *v))
        })
        .map(|(le, v)| {
            (
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                },
                v,
            )
        })
        .collect();
    buckets.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    assert!(buckets.len() > 10);
    assert!(
        buckets.iter().any(|(le, _)| *le >= 600.0 && le.is_finite()),
        "{name} covers 600 s"
    );
    assert!(
        buckets.windows(2).all(|w| w[0].1 <= w[1].1),
        "{name} cumulative"
    );
    let count = s[&format!("{name}_count{{model=\"{model}\"}}")];
    assert_eq!(buckets.last().unwrap(), &(f64::INFINITY, count));
}

#[test]
fn exposition_parses_counters_grow_and_histograms_are_cumulative() {
    let mut m = Meter::new(MeterConfig::default(), T0);
    finish(&mut m, 1, 1.0, "llama", "a", Outcome::Ok, 800.0);
    finish(&mut m, 2, 2.0, "llama", "b", Outcome::UpstreamError, 30.0);
    finish(&mut m, 3, 3.0, "qwen \"7b\"", "a", Outcome::Ok, 700_000.0);
    let first = parse(&m.prometheus(at(800.0)));
    assert_eq!(
        first["tokenmeter_requests_total{model=\"llama\",api=\"chat\",outcome=\"ok\",status=\"2xx\"}"],
        1.0
    );
    assert_eq!(
        first["tokenmeter_requests_total{model=\"llama\",api=\"chat\",outcome=\"upstream_error\",status=\"5xx\"}"],
        1.0
    );
    assert_eq!(
        first["tokenmeter_completion_tokens_total{model=\"llama\",api=\"chat\"}"],
        40.0
    );
    assert_eq!(
        first["tokenmeter_prompt_tokens_total{model=\"qwen \\\"7b\\\"\"}"],
        5.0
    );
    assert_eq!(first["tokenmeter_requests_in_flight"], 0.0);
    // 700 s falls between the 480 s and 960 s bounds.
    assert_eq!(
        first
            ["tokenmeter_e2e_request_latency_seconds_bucket{model=\"qwen \\\"7b\\\"\",le=\"480\"}"],
        0.0
    );
    assert_eq!(
        first
            ["tokenmeter_e2e_request_latency_seconds_bucket{model=\"qwen \\\"7b\\\"\",le=\"960\"}"],
        1.0
    );
    assert!(
        (first["tokenmeter_e2e_request_latency_seconds_sum{model=\"llama\"}"] - 0.83).abs() < 1e-12
    );
    for name in [
        "tokenmeter_time_to_first_token_seconds",
        "tokenmeter_time_per_output_token_seconds",
        "tokenmeter_e2e_request_latency_seconds",
        "tokenmeter_first_byte_seconds",
    ] {
        check_histograms(&first, name, "llama");
    }
    assert!(
        !first.keys().any(|k| k.contains("user=")),
        "no user label by default"
    );
    finish(&mut m, 4, 900.0, "llama", "c", Outcome::Ok, 50.0);
    m.request_started(at(901.0), 5, "c", Some("llama"));
    let second = parse(&m.prometheus(at(902.0)));
    for (k, v) in &first {
        if k.contains("_total")
            || k.contains("_bucket")
            || k.contains("_count")
            || k.contains("_sum")
        {
            assert!(second[k] >= *v, "{k} went down");
        }
    }
    assert_eq!(
        second["tokenmeter_requests_total{model=\"llama\",api=\"chat\",outcome=\"ok\",status=\"2xx\"}"],
        2.0
    );
    assert_eq!(second["tokenmeter_requests_in_flight"], 1.0);
}

#[test]
fn user_label_is_opt_in_and_capped() {
    let cfg = MeterConfig {
        metrics_user_label: true,
        max_tracked_users: 2,
        ..Default::default()
    };
    let mut m = Meter::new(cfg, T0);
    for (i, u) in ["a", "b", "c", "d"].iter().enumerate() {
        finish(
            &mut m,
            i as u64 + 1,
            1.0 + i as f64,
            "llama",
            u,
            Outcome::Ok,
            100.0,
        );
    }
    let s = parse(&m.prometheus(at(10.0)));
    let users: std::collections::BTreeSet<_> = s
        .keys()
        .filter_map(|k| {
            k.split("user=\"")
                .nth(1)
                .map(|r| r.split('"').next().unwrap().to_string())
        })
        .collect();
    assert_eq!(users.into_iter().collect::<Vec<_>>(), ["a", "b", "other"]);
    assert_eq!(
        s["tokenmeter_requests_total{model=\"llama\",api=\"chat\",user=\"other\",outcome=\"ok\",status=\"2xx\"}"],
        2.0
    );
    assert!(!s
        .keys()
        .any(|k| k.contains("_bucket") && k.contains("user=")));
}

#[test]
fn generation_tokens_advance_while_streaming_and_settle_to_usage() {
    let mut m = Meter::new(MeterConfig::default(), T0);
    m.request_started(at(1.0), 7, "a", Some("llama"));
    let gen = |m: &mut Meter, t: f64| {
        let s = parse(&m.prometheus(at(t)));
        (
            s["tokenmeter_generation_tokens_total{model=\"llama\"}"],
            // The finish-time series appears with the first finished request.
            s.get("tokenmeter_completion_tokens_total{model=\"llama\",api=\"chat\"}")
                .copied()
                .unwrap_or(0.0),
        )
    };
    for i in 0..30 {
        m.tokens(at(1.5 + i as f64 * 0.1), 7, 1);
    }
    // Live: all 30 streamed tokens, while the finish-time counter still shows nothing.
    assert_eq!(gen(&mut m, 4.5), (30.0, 0.0));
    m.prompt_tokens(7, 9);
    let mut r = record(at(1.0), 4000.0, Some(400.0), Some(33), Some(9), true);
    r.request_id = "tm-1-7".into();
    r.model = Some("llama".into());
    m.request_finished(at(5.0), &r);
    // Usage said 33: the 3 events that carried no count are added at the end.
    assert_eq!(gen(&mut m, 6.0), (33.0, 33.0));
    let s = parse(&m.prometheus(at(6.0)));
    assert_eq!(s["tokenmeter_prompt_tokens_total{model=\"llama\"}"], 9.0);

    // A request whose usage is below what streamed: the counter cannot go down; the next
    // increments pay the difference, and the total meets the exact sum again.
    m.request_started(at(7.0), 8, "a", Some("llama"));
    m.tokens(at(7.5), 8, 10);
    let mut r = record(at(7.0), 1000.0, Some(100.0), Some(6), Some(1), true);
    r.request_id = "tm-1-8".into();
    r.model = Some("llama".into());
    m.request_finished(at(8.0), &r);
    assert_eq!(gen(&mut m, 8.5), (43.0, 39.0));
    m.request_started(at(9.0), 9, "a", Some("llama"));
    m.tokens(at(9.5), 9, 3);
    assert_eq!(gen(&mut m, 9.6).0, 43.0, "the debt of 4 absorbs these 3");
    m.tokens(at(9.7), 9, 5);
    assert_eq!(
        gen(&mut m, 9.8).0,
        47.0,
        "4 of the 5 pay the rest of the debt"
    );
    let mut r = record(at(9.0), 1000.0, Some(100.0), Some(8), Some(1), true);
    r.request_id = "tm-1-9".into();
    r.model = Some("llama".into());
    m.request_finished(at(10.0), &r);
    assert_eq!(gen(&mut m, 11.0), (47.0, 47.0), "exact again: 33 + 6 + 8");
}

#[test]
fn models_are_capped_at_100_and_status_classes_are_bounded() {
    let mut m = Meter::new(MeterConfig::default(), T0);
    for i in 0..130u64 {
        let model = format!("model-{i:03}");
        finish(
            &mut m,
            i + 1,
            1.0 + i as f64 * 0.01,
            &model,
            "a",
            Outcome::Ok,
            100.0,
        );
    }
    let mut r = record(at(3.0), 10.0, None, None, None, true);
    r.request_id = "tm-1-ffff".into();
    r.outcome = Outcome::ClientAborted;
    r.status = None;
    m.request_finished(at(3.1), &r);
    let mut r = record(at(3.0), 10.0, None, None, None, true);
    r.request_id = "tm-1-fffe".into();
    r.outcome = Outcome::UpstreamError;
    r.status = Some(429);
    m.request_finished(at(3.1), &r);
    let s = parse(&m.prometheus(at(10.0)));
    let models: std::collections::BTreeSet<String> = s
        .keys()
        .filter(|k| k.starts_with("tokenmeter_generation_tokens_total{"))
        .map(|k| k.split('"').nth(1).unwrap().to_string())
        .collect();
    assert_eq!(models.len(), 101, "100 names and other");
    assert!(models.contains("other") && models.contains("model-099"));
    assert!(!models.contains("model-100"));
    // 30 models folded: 30 requests of 20 tokens, plus the two records of tiny-llama (its own
    // name did not fit either).
    assert_eq!(
        s["tokenmeter_generation_tokens_total{model=\"other\"}"],
        600.0
    );
    let statuses: std::collections::BTreeSet<&str> = s
        .keys()
        .filter_map(|k| k.split("status=\"").nth(1))
        .map(|v| v.split('"').next().unwrap())
        .collect();
    assert_eq!(
        statuses.into_iter().collect::<Vec<_>>(),
        ["2xx", "4xx", "none"]
    );
    assert_eq!(
        s["tokenmeter_requests_total{model=\"other\",api=\"chat\",outcome=\"client_aborted\",status=\"none\"}"],
        1.0
    );
    assert_eq!(
        s["tokenmeter_requests_total{model=\"other\",api=\"chat\",outcome=\"upstream_error\",status=\"4xx\"}"],
        1.0
    );
    let hist_models = s
        .keys()
        .filter(|k| k.starts_with("tokenmeter_e2e_request_latency_seconds_count"))
        .count();
    assert_eq!(hist_models, 101);
}

#[test]
fn tpot_buckets_resolve_fast_decoders() {
    let mut m = Meter::new(MeterConfig::default(), T0);
    // 2.5 ms and 6.5 ms per token: two different buckets below vLLM's 10 ms floor.
    for (id, tpot_ms) in [(1u64, 2.5), (2, 6.5)] {
        m.request_started(at(1.0), id, "a", Some("llama"));
        let mut r = record(
            at(1.0),
            100.0 + tpot_ms * 100.0,
            Some(100.0),
            Some(101),
            Some(5),
            true,
        );
        r.request_id = format!("tm-1-{id:x}");
        r.model = Some("llama".into());
        m.request_finished(at(2.0), &r);
    }
    let s = parse(&m.prometheus(at(3.0)));
    let b = |le: &str| {
        s[&format!(
            "tokenmeter_time_per_output_token_seconds_bucket{{model=\"llama\",le=\"{le}\"}}"
        )]
    };
    assert_eq!(
        (b("0.002"), b("0.003"), b("0.006"), b("0.0075")),
        (0.0, 1.0, 1.0, 2.0)
    );
}

#[test]
fn api_label_and_itl_histogram_with_vllm_bounds() {
    use tokenmeter::dialect::Api;
    use tokenmeter::itl::{ItlHistogram, VLLM_ITL_BOUNDS_S};
    let mut m = Meter::new(MeterConfig::default(), T0);
    // Request 1 (messages): gaps of 5, 20 and 30 ms; request 2 (responses): one gap of 2 s.
    for (id, api, gaps_ms) in [
        (1u64, Api::Messages, &[5.0, 20.0, 30.0][..]),
        (2, Api::Responses, &[2000.0][..]),
    ] {
        m.request_started(at(1.0), id, "u", Some("m"));
        let mut r = record(at(1.0), 3000.0, Some(10.0), Some(4), Some(2), true);
        r.request_id = format!("tm-1-{id:x}");
        r.model = Some("m".into());
        r.api = Some(api);
        r.path = if api == Api::Messages {
            "/v1/messages".into()
        } else {
            "/v1/responses".into()
        };
        let mut h = ItlHistogram::default();
        for g in gaps_ms {
            h.record((g * 1e6) as u64);
        }
        r.itl = Some(Box::new(h));
        m.request_finished(at(4.0), &r);
    }
    let s = parse(&m.prometheus(at(10.0)));
    assert_eq!(
        s["tokenmeter_requests_total{model=\"m\",api=\"messages\",outcome=\"ok\",status=\"2xx\"}"],
        1.0
    );
    assert_eq!(
        s["tokenmeter_completion_tokens_total{model=\"m\",api=\"responses\"}"],
        4.0
    );
    assert!(!s.keys().any(|k| k.contains("api=\"chat\"")));
    let name = "tokenmeter_inter_token_latency_seconds";
    let bucket = |le: &str| s[&format!("{name}_bucket{{model=\"m\",le=\"{le}\"}}")];
    // Exactly vLLM's bounds, cumulative: 5 ms <= 0.01; 20 ms <= 0.025; 30 ms <= 0.05; 2 s <= 2.5.
    let les: Vec<String> = VLLM_ITL_BOUNDS_S.iter().map(ToString::to_string).collect();
    assert_eq!(les.len(), 19);
    assert_eq!(bucket("0.01"), 1.0);
    assert_eq!(bucket("0.025"), 2.0);
    assert_eq!(bucket("0.05"), 3.0);
    assert_eq!(bucket("1"), 3.0);
    assert_eq!(bucket("2.5"), 4.0);
    assert_eq!(bucket("80"), 4.0);
    assert_eq!(bucket("+Inf"), 4.0);
    assert_eq!(s[&format!("{name}_count{{model=\"m\"}}")], 4.0);
    assert!((s[&format!("{name}_sum{{model=\"m\"}}")] - 2.055).abs() < 1e-9);
    // The window's ITL percentiles cover every gap of both requests.
    let snap = m
        .snapshot(at(10.5), &tokenmeter::meter::SnapshotQuery::default())
        .unwrap();
    let w = snap.windows.get("10s").unwrap();
    let (p50, p99) = (w.itl_ms.p50.unwrap(), w.itl_ms.p99.unwrap());
    assert!((p50 / 20.0 - 1.0).abs() < 0.05, "{p50}");
    assert!((p99 / 2000.0 - 1.0).abs() < 0.05, "{p99}");
}
