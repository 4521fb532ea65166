//! The burst sweep against a fake server with known per-token timing.

mod load_support;

use std::collections::HashSet;
use std::time::Duration;

use load_support::{spawn, FakeConfig, FAKE_MODEL};
use tokenmeter::load::prompts::prompt_for;
use tokenmeter::load::{run, LoadOptions, LoadReport, NoProgress, TokensFrom};

const TOKENS: u32 = 50;

/// Timing tests run one at a time: parallel tests in this binary would steal each other's CPU
/// and show up as server slowness.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn within(got: f64, want: f64, rel: f64) -> bool {
    (got - want).abs() <= want * rel
}

async fn sweep(
    cfg: FakeConfig,
    levels: &[usize],
    stream: bool,
) -> (LoadReport, load_support::Fake) {
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

fn check_sweep(report: &LoadReport, cfg: &FakeConfig, levels: &[usize], fake: &load_support::Fake) {
    let want = expected_rate(cfg);
    let walls = fake.state.walls.lock().unwrap().clone();
    // Arrival order is warm-up, then each level's batch in turn.
    let mut batch_start = 1;
    // When a check fails, this tells whether the machine made the fake itself late.
    let fake_late_ms = fake
        .state
        .max_first_event_late_us
        .load(std::sync::atomic::Ordering::SeqCst) as f64
        / 1e3;
    let burst = report.burst.as_ref().expect("burst");
    assert!(burst.warmup.ok, "warm-up failed: {:?}", burst.warmup.error);
    assert_eq!(burst.levels.len(), levels.len());
    for (l, &level) in burst.levels.iter().zip(levels) {
        assert_eq!(l.level, level);
        assert_eq!(l.figures.requests, level, "warm-up must not be in a level");
        assert_eq!(l.figures.failures, 0);
        let batch = &walls[batch_start..batch_start + level];
        batch_start += level;
        for r in &l.results {
            // Against the fake's own wall for this request (prompts are distinct within a batch).
            let prompt = prompt_for(r.slot);
            let fake_wall = batch
                .iter()
                .find(|(p, _)| *p == prompt)
                .and_then(|(_, w)| *w)
                .unwrap();
            let truth = f64::from(TOKENS) / (fake_wall / 1e3);
            let got = r.tok_s.expect("tok_s");
            assert!(
                within(got, truth, 0.05),
                "level {level}: {got:.1} vs server-side {truth:.1} tok/s"
            );
            // Against the configured schedule: looser, the machine may make the fake late.
            assert!(within(got, want, 0.15), "level {level}: {got:.1} vs scheduled {want:.1} tok/s (fake late {fake_late_ms} ms)");
            assert_eq!(r.completion_tokens, Some(u64::from(TOKENS)));
            assert_eq!(r.tokens_from, TokensFrom::Usage);
            // TTFT is the first event with choices: not the (immediate) response head, and
            // well before the tokens that follow it every `gap`.
            let ttft = r.ttft_ms.expect("ttft");
            let (want_ttft, gap) = (cfg.ttft.as_secs_f64() * 1e3, cfg.gap.as_secs_f64() * 1e3);
            assert!(
                ttft >= want_ttft - 0.5 && ttft < want_ttft + 2.0 * gap,
                "ttft {ttft:.1} ms vs {want_ttft} (fake late {fake_late_ms} ms)"
            );
        }
        let pr = l.figures.per_request_tok_s.expect("per-request");
        assert!(within(pr.avg, want, 0.15));
        // Aggregate is exactly tokens / batch wall …
        let tokens = u64::from(TOKENS) * level as u64;
        assert_eq!(l.figures.completion_tokens, tokens);
        let agg = l.aggregate_tok_s.expect("aggregate");
        assert!((agg - tokens as f64 / l.wall_s).abs() < 1e-9);
        // … and, all requests running together, close to level × the per-request rate.
        assert!(
            within(agg, want * level as f64, 0.15),
            "level {level}: aggregate {agg:.1}"
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
        nonstream_delay: Duration::from_millis(100),
        ..FakeConfig::default()
    };
    let (report, _fake) = sweep(cfg, &[1, 4], false).await;
    let want = f64::from(TOKENS) / 0.1;
    for l in &report.burst.as_ref().unwrap().levels {
        for r in &l.results {
            assert!(r.ttft_ms.is_none());
            assert_eq!(r.tokens_from, TokensFrom::Usage);
            assert_eq!(r.prompt_tokens, Some(12));
            assert!(within(r.tok_s.unwrap(), want, 0.05), "{:?}", r.tok_s);
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
