//! The burst sweep against a fake server with known per-token timing.

use std::collections::HashSet;
use std::time::Duration;

use crate::load_support::{spawn, FakeConfig, FAKE_MODEL};
use tokenmeter::load::prompts::prompt_for;
use tokenmeter::load::{run, LoadOptions, LoadReport, NoProgress, TokensFrom};

const TOKENS: u32 = 50;

/// This file's sweeps run one at a time: two at once would steal each other's CPU and show up as
/// server slowness.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn within(got: f64, want: f64, rel: f64) -> bool {
    (got - want).abs() <= want * rel
}

async fn sweep(
    cfg: FakeConfig,
    levels: &[usize],
    stream: bool,
) -> (LoadReport, crate::load_support::Fake) {
    let _serial = SERIAL.lock().await;
    let fake = spawn(cfg).await;
    let mut opts = LoadOptions::burst(format!("{}/v1/", fake.url), levels);
    opts.max_tokens = Some(TOKENS);
    opts.stream = stream;
    let report = run(opts, NoProgress).await.expect("run");
    (report, fake)
}

/// n / (ttft + (n-1)·gap): the fake's per-request rate.
fn expected_rate(cfg: &FakeConfig) -> f64 {
    let wall = cfg.ttft.as_secs_f64() + cfg.gap.as_secs_f64() * f64::from(TOKENS - 1);
    f64::from(TOKENS) / wall
}

fn check_sweep(
    report: &LoadReport,
    cfg: &FakeConfig,
    levels: &[usize],
    fake: &crate::load_support::Fake,
) {
    let want = expected_rate(cfg);
    let timings = fake.state.timings.lock().unwrap().clone();
    // Arrival order is warm-up, then each level's batch in turn.
    let mut batch_start = 1;
    let burst = report.burst.as_ref().expect("burst");
    assert!(burst.warmup.ok, "warm-up failed: {:?}", burst.warmup.error);
    assert_eq!(burst.levels.len(), levels.len());
    for (l, &level) in burst.levels.iter().zip(levels) {
        assert_eq!(l.level, level);
        assert_eq!(l.figures.requests, level, "warm-up must not be in a level");
        assert_eq!(l.figures.failures, 0);
        let batch = &timings[batch_start..batch_start + level];
        batch_start += level;
        let (mut truths, mut ttft_excess) = (Vec::new(), Vec::new());
        for r in &l.results {
            // The fake's own timing of this request (prompts are distinct within a batch).
            let prompt = prompt_for(r.slot);
            let server = batch.iter().find(|t| t.prompt == prompt).unwrap();
            let (server_first, server_wall) = (server.first_ms.unwrap(), server.wall_ms.unwrap());
            let truth = f64::from(TOKENS) / (server_wall / 1e3);
            let got = r.tok_s.expect("tok_s");
            truths.push(truth);
            // Per request: the client's wall adds request transit and delivery, which a
            // loaded machine stretches by scheduler latency; hence 10% here, 5% on the average.
            assert!(
                within(got, truth, 0.10),
                "level {level}: {got:.1} vs server-side {truth:.1} tok/s"
            );
            // Against the configured schedule: a loaded machine can only make the fake late
            // (its timers never fire early), so the client may never report faster than the
            // schedule; how much slower is the server-side truth's business, checked above.
            assert!(
                got <= want * 1.02,
                "level {level}: {got:.1} vs scheduled {want:.1} tok/s (server wall {server_wall:.1} ms)"
            );
            assert_eq!(r.completion_tokens, Some(u64::from(TOKENS)));
            assert_eq!(r.tokens_from, TokensFrom::Usage);
            // TTFT is the first event with choices: not the (immediate) response head, not
            // before the fake sent that event, and long before the later events (10% of the
            // wall per request for scheduler latency, 5% on the level's average below).
            let ttft = r.ttft_ms.expect("ttft");
            let budget = 0.10 * r.e2e_ms;
            ttft_excess.push(ttft - server_first);
            assert!(
                ttft >= server_first && ttft <= server_first + budget,
                "ttft {ttft:.1} ms vs server-side {server_first:.1} ms (scheduled {:?})",
                cfg.ttft
            );
        }
        let pr = l.figures.per_request_tok_s.expect("per-request");
        let truth_avg = truths.iter().sum::<f64>() / truths.len() as f64;
        assert!(
            within(pr.avg, truth_avg, 0.05),
            "level {level}: avg {:.1} vs server-side {truth_avg:.1} tok/s",
            pr.avg
        );
        assert!(
            pr.avg <= want * 1.02,
            "level {level}: avg {} faster than the schedule",
            pr.avg
        );
        let excess_avg = ttft_excess.iter().sum::<f64>() / ttft_excess.len() as f64;
        let e2e_avg = l.figures.e2e_ms.unwrap().avg;
        assert!(
            excess_avg <= 0.05 * e2e_avg,
            "level {level}: TTFT {excess_avg:.1} ms late on average"
        );
        // Aggregate is exactly tokens / batch wall …
        let tokens = u64::from(TOKENS) * level as u64;
        assert_eq!(l.figures.completion_tokens, tokens);
        let agg = l.aggregate_tok_s.expect("aggregate");
        assert!((agg - tokens as f64 / l.wall_s).abs() < 1e-9);
        // … and, all requests running together, close to level × the per-request rate the
        // server itself delivered (not the schedule: a loaded machine makes the fake late).
        assert!(
            within(agg, truth_avg * level as f64, 0.15) && agg <= want * level as f64 * 1.02,
            "level {level}: aggregate {agg:.1}, server-side {truth_avg:.1} tok/s per request"
        );
    }
    let first = burst.levels[0].aggregate_tok_s.unwrap();
    for w in burst.levels.windows(2) {
        let (p, c) = (&w[0], &w[1]);
        let gain = (c.aggregate_tok_s.unwrap() / p.aggregate_tok_s.unwrap() - 1.0) * 100.0;
        assert!((c.marginal_gain_pct.unwrap() - gain).abs() < 1e-9);
        assert_eq!(c.users_ratio, Some(c.level as f64 / p.level as f64));
        assert!((c.scaling_vs_first.unwrap() - c.aggregate_tok_s.unwrap() / first).abs() < 1e-9);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_sweep_reproduces_known_rates_at_1_4_8_16() {
    let cfg = FakeConfig::default();
    let levels = [1, 4, 8, 16];
    let (report, fake) = sweep(cfg.clone(), &levels, true).await;
    // Shown with --nocapture: the table of a sweep with a known truth.
    println!("{}", tokenmeter::load::table::render(&report));
    check_sweep(&report, &cfg, &levels, &fake);
    // Model discovered from /v1/models and used by every request; prompts distinct per slot.
    assert_eq!(report.model, FAKE_MODEL);
    let seen = fake.state.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1 + 1 + 4 + 8 + 16);
    assert!(seen.iter().all(|s| s.body["model"] == FAKE_MODEL));
    assert!(seen
        .iter()
        .all(|s| s.body["stream_options"]["include_usage"] == true));
    let last16: HashSet<String> = seen[seen.len() - 16..]
        .iter()
        .map(|s| s.body["messages"][0]["content"].to_string())
        .collect();
    assert_eq!(last16.len(), 16);
    assert_eq!(
        fake.state
            .max_in_flight
            .load(std::sync::atomic::Ordering::SeqCst),
        16
    );
    // Keep-alive: batches reuse the pool, so about 16 connections serve all 30 requests (one
    // may rejoin the pool a moment after its response ended, and a new one is opened instead).
    let conns = fake
        .state
        .connections
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (16..=20).contains(&conns),
        "{conns} connections for 30 requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crlf_events_split_across_frames_measure_the_same() {
    let cfg = FakeConfig {
        crlf_split: true,
        ..FakeConfig::default()
    };
    let (report, fake) = sweep(cfg.clone(), &[1, 4], true).await;
    check_sweep(&report, &cfg, &[1, 4], &fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streaming_rates_come_from_usage_and_ttft_is_unknown() {
    let cfg = FakeConfig {
        nonstream_delay: Duration::from_millis(300),
        ..FakeConfig::default()
    };
    let (report, fake) = sweep(cfg, &[1, 4], false).await;
    let want = f64::from(TOKENS) / 0.3;
    let timings = fake.state.timings.lock().unwrap().clone();
    let mut batch_start = 1;
    for l in &report.burst.as_ref().unwrap().levels {
        let batch = &timings[batch_start..batch_start + l.level];
        batch_start += l.level;
        for r in &l.results {
            assert!(r.ttft_ms.is_none());
            assert_eq!(r.tokens_from, TokensFrom::Usage);
            assert_eq!(r.prompt_tokens, Some(12));
            let prompt = prompt_for(r.slot);
            let server = batch.iter().find(|t| t.prompt == prompt).unwrap();
            let truth = f64::from(TOKENS) / (server.wall_ms.unwrap() / 1e3);
            let got = r.tok_s.unwrap();
            assert!(within(got, truth, 0.05), "{got} vs server-side {truth}");
            assert!(got <= truth, "the client cannot be faster than the server");
            assert!(got <= want * 1.02, "{got} faster than scheduled {want}");
        }
        assert!(l.figures.ttft_ms.is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_counted_and_reported_not_dropped() {
    // Slot 2's prompt names merge sort; the fake fails it.
    let cfg = FakeConfig {
        fail_prompt_contains: Some("merge sort".into()),
        ..FakeConfig::default()
    };
    let (report, _fake) = sweep(cfg, &[1, 4], true).await;
    let levels = &report.burst.as_ref().unwrap().levels;
    assert_eq!(levels[0].figures.failures, 0);
    let l4 = &levels[1];
    assert_eq!((l4.figures.requests, l4.figures.failures), (4, 1));
    let failed = l4.results.iter().find(|r| !r.ok).unwrap();
    assert_eq!((failed.slot, failed.status), (2, Some(500)));
    assert_eq!(failed.error.as_deref(), Some("injected failure"));
    assert!(failed.tok_s.is_none());
    assert_eq!(l4.figures.completion_tokens, 3 * u64::from(TOKENS));
    assert_eq!(l4.figures.per_request_tok_s.unwrap().n, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_usage_tokens_are_counted_from_events_and_marked() {
    let cfg = FakeConfig {
        no_usage: true,
        ..FakeConfig::default()
    };
    let (report, _fake) = sweep(cfg, &[2], true).await;
    let l = &report.burst.as_ref().unwrap().levels[0];
    assert!(l.figures.tokens_counted_from_events);
    for r in &l.results {
        assert_eq!(r.tokens_from, TokensFrom::CountedEvents);
        assert_eq!(r.completion_tokens, Some(u64::from(TOKENS)));
        assert_eq!(r.prompt_tokens, None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_user_and_ignore_eos_are_sent_and_the_key_is_never_reported() {
    let fake = spawn(FakeConfig::default()).await;
    let mut opts = LoadOptions::burst(fake.url.clone(), &[1]);
    opts.max_tokens = Some(3);
    opts.model = Some("given-model".into());
    opts.api_key = Some(tokenmeter::load::ApiKey("sekrit-123".into()));
    opts.user = Some("alice".into());
    opts.ignore_eos = true;
    assert!(!format!("{opts:?}").contains("sekrit"));
    let report = run(opts, NoProgress).await.unwrap();
    let seen = fake.state.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert_eq!(s.auth.as_deref(), Some("Bearer sekrit-123"));
        assert_eq!(s.user_header.as_deref(), Some("alice"));
        assert_eq!(s.body["user"], "alice");
        assert_eq!(s.body["ignore_eos"], true);
        assert_eq!(s.body["model"], "given-model");
        assert_eq!(s.body["max_tokens"], 3);
    }
    let json = serde_json::to_string(&report).unwrap();
    assert!(!json.contains("sekrit") && json.contains("\"api_key_sent\":true"));
    assert!(!tokenmeter::load::table::render(&report).contains("sekrit"));
}

#[tokio::test]
async fn unreachable_server_fails_model_discovery_cleanly() {
    // Bind then drop to get a port with nothing listening.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let opts = LoadOptions::burst(format!("http://127.0.0.1:{port}"), &[1]);
    assert!(run(opts, NoProgress).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_answer_to_a_stream_request_is_read_as_json() {
    let cfg = FakeConfig {
        ignore_stream: true,
        nonstream_delay: Duration::from_millis(50),
        ..FakeConfig::default()
    };
    let (report, _fake) = sweep(cfg, &[1], true).await;
    let r = &report.burst.as_ref().unwrap().levels[0].results[0];
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.ttft_ms, None);
    assert_eq!(r.tokens_from, TokensFrom::Usage);
    assert_eq!(r.completion_tokens, Some(u64::from(TOKENS)));
}

#[tokio::test]
async fn refused_connections_are_failures_with_their_cause() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut opts = LoadOptions::burst(format!("http://127.0.0.1:{port}"), &[2]);
    opts.model = Some("m".into());
    let report = run(opts, NoProgress).await.unwrap();
    let burst = report.burst.unwrap();
    assert!(!burst.warmup.ok);
    let l = &burst.levels[0];
    assert_eq!((l.figures.requests, l.figures.failures), (2, 2));
    assert_eq!(l.aggregate_tok_s, Some(0.0));
    assert!(l.figures.per_request_tok_s.is_none());
    for r in &l.results {
        assert_eq!(r.status, None);
        let e = r.error.as_deref().unwrap().to_lowercase();
        assert!(e.contains("refused"), "{e}");
    }
}
