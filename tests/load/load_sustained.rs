//! The sustained method against the fake server.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::load_support::{spawn, FakeConfig, FAKE_WINDOW_TOK_S};
use tokenmeter::load::{run, LoadOptions, NoProgress, ProgressEvent};

const TOKENS: u32 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_exactly_n_in_flight_and_samples_the_proxy_windows() {
    let cfg = FakeConfig {
        ttft: Duration::from_millis(10),
        gap: Duration::from_millis(10),
        stats: true,
        ..FakeConfig::default()
    };
    let fake = spawn(cfg).await;
    let n = 4;
    let mut opts = LoadOptions::sustained(fake.url.clone(), n, Duration::from_secs(2));
    opts.max_tokens = Some(TOKENS);
    opts.stats_interval = Duration::from_millis(500);
    let ticks = std::sync::atomic::AtomicUsize::new(0);
    let progress = |e: &ProgressEvent<'_>| {
        if matches!(e, ProgressEvent::SustainedTick(_)) {
            ticks.fetch_add(1, Ordering::SeqCst);
        }
    };
    let report = run(opts, &progress).await.unwrap();
    let s = report.sustained.as_ref().unwrap();

    // The server saw exactly N at once, never more, and the client agrees.
    assert_eq!(fake.state.max_in_flight.load(Ordering::SeqCst), n);
    assert_eq!(s.max_in_flight, n);
    assert_eq!(s.cancelled_at_deadline, n);
    assert!(s.stopped_early.is_none());
    assert!(s.wall_s >= 2.0 && s.wall_s < 2.3, "wall {}", s.wall_s);
    // Each request lasts ≈ 10 + 19·10 = 200 ms: ≈ 10 per slot in 2 s, less the cancelled ones.
    let done = s.figures.requests;
    assert!((28..=40).contains(&done), "completed {done}");
    assert_eq!(s.started, done + n);
    assert_eq!(s.figures.failures, 0);
    assert_eq!(s.figures.completion_tokens, u64::from(TOKENS) * done as u64);
    let agg = s.client_aggregate_tok_s.unwrap();
    assert!((agg - s.figures.completion_tokens as f64 / s.wall_s).abs() < 1e-9);
    let with_partial = s.client_aggregate_incl_partial_tok_s.unwrap();
    assert!(
        (with_partial - (s.figures.completion_tokens + s.partial_content_events) as f64 / s.wall_s)
            .abs()
            < 1e-9
    );
    assert!(s.partial_content_events <= u64::from(TOKENS) * n as u64);
    let per = s.figures.per_request_tok_s.unwrap();
    assert!(
        (per.avg - 100.0).abs() < 15.0,
        "per-request avg {}",
        per.avg
    );
    assert_eq!(ticks.load(Ordering::SeqCst), s.ticks.len());
    assert!(s.ticks.len() >= 3);

    // Proxy detected; polled every 0.5 s plus once after the run.
    let p = report.proxy.as_ref().unwrap();
    assert!(p.detected, "{}", p.note);
    assert!(p.samples.len() >= 4, "{} samples", p.samples.len());
    let steady = p.steady_10s.as_ref().unwrap();
    assert_eq!(steady.gen_tok_s.avg, FAKE_WINDOW_TOK_S);
    assert_eq!(steady.gen_tok_s.n, p.samples.len());
    let text = tokenmeter::load::table::render(&report);
    println!("{text}");
    assert!(
        text.contains("Proxy steady 10 s windows: 123.0 tok/s"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_server_is_reported_as_not_a_proxy_and_non_streaming_works() {
    let cfg = FakeConfig {
        nonstream_delay: Duration::from_millis(100),
        ..FakeConfig::default()
    };
    let fake = spawn(cfg).await;
    let mut opts = LoadOptions::sustained(fake.url.clone(), 3, Duration::from_millis(700));
    opts.max_tokens = Some(TOKENS);
    opts.stream = false;
    let report = run(opts, NoProgress).await.unwrap();
    let s = report.sustained.as_ref().unwrap();
    assert_eq!(fake.state.max_in_flight.load(Ordering::SeqCst), 3);
    assert!(s.client_aggregate_incl_partial_tok_s.is_none());
    assert!(s.figures.ttft_ms.is_none());
    assert!(s.figures.requests >= 12, "{}", s.figures.requests);
    let p = report.proxy.as_ref().unwrap();
    assert!(!p.detected && p.samples.is_empty());
    assert!(p.note.starts_with("not a tokenmeter proxy"), "{}", p.note);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_server_stops_the_run_early() {
    // Every prompt names "a Python function"; fail them all.
    let cfg = FakeConfig {
        fail_prompt_contains: Some("Python".into()),
        ..FakeConfig::default()
    };
    let fake = spawn(cfg).await;
    let opts = LoadOptions::sustained(fake.url.clone(), 2, Duration::from_secs(5));
    let report = run(opts, NoProgress).await.unwrap();
    let s = report.sustained.as_ref().unwrap();
    assert!(s.stopped_early.is_some());
    assert!(s.wall_s < 2.0);
    assert_eq!(s.figures.failures, 10);
    assert_eq!(s.client_aggregate_tok_s, Some(0.0));
}

/// A proxy whose `/stats` is on its admin address: `--stats-url` reads it there, and the table
/// says the production-traffic curve is the proxy's whole history, not this run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_url_reads_a_proxy_whose_stats_are_on_another_address() {
    let plain = spawn(FakeConfig::default()).await;
    let stats = spawn(FakeConfig {
        stats: true,
        ..FakeConfig::default()
    })
    .await;
    let mut opts = LoadOptions::sustained(plain.url.clone(), 2, Duration::from_millis(1200));
    opts.max_tokens = Some(TOKENS);
    opts.stats_interval = Duration::from_millis(1000);
    let report = run(opts.clone(), NoProgress).await.unwrap();
    let p = report.proxy.as_ref().unwrap();
    assert!(!p.detected);
    assert!(p.note.contains("--stats-url"), "{}", p.note);
    opts.stats_url = Some(stats.url.clone());
    let report = run(opts, NoProgress).await.unwrap();
    let p = report.proxy.as_ref().unwrap();
    assert!(p.detected, "{}", p.note);
    assert!(!p.samples.is_empty());
}

/// Agent-like load draws max_tokens per request: the report's first line says the draw, not the
/// mean as if it were fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_report_names_the_max_tokens_draw() {
    use tokenmeter::load::{AgentSpec, Arrivals, Dist};
    let fake = spawn(FakeConfig::default()).await;
    let spec = AgentSpec {
        think_ms: Dist::parse("10").unwrap(),
        prompt_words: Dist::parse("10").unwrap(),
        output_tokens: Dist::parse("20..300").unwrap(),
        ..AgentSpec::default()
    };
    let opts = LoadOptions::agents(
        fake.url.clone(),
        Arrivals::Agents { agents: 2 },
        spec,
        Duration::from_millis(300),
    );
    let report = run(opts, NoProgress).await.unwrap();
    let text = tokenmeter::load::table::render(&report);
    let first = text.lines().next().unwrap();
    assert!(
        first.contains("max_tokens drawn per request 20..300"),
        "{first}"
    );
    assert!(!first.contains("max_tokens 160"), "{first}");
}
