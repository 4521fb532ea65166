//! `tokenmeter load --api`: every generation API against the built-in simulator, whose token
//! counts are exact. Each request's tokens come from its API's own usage, TTFT from its first output
//! event, and the run's tokens equal what the simulator generated.

use std::time::Duration;

use tokenmeter::load::{run, Api, LoadOptions, TokensFrom};
use tokenmeter::sim::{spawn, SimConfig};

const TOKENS: u32 = 12;

async fn sweep(api: Api, stream: bool) {
    let cfg = SimConfig {
        stop_probability_per_token: 0.0,
        log_stats_interval_s: 0.0,
        step_base_ms: 2.0,
        step_per_seq_ms: 0.1,
        ..SimConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim = spawn(cfg, listener).await.unwrap();
    let mut opts = LoadOptions::burst(format!("http://{}", sim.addr()), &[1, 3]);
    opts.api = api;
    opts.stream = stream;
    opts.max_tokens = Some(TOKENS);
    opts.api_key = Some(tokenmeter::load::ApiKey("k".into()));
    opts.timeout = Duration::from_secs(20);
    let report = run(opts, tokenmeter::load::NoProgress).await.unwrap();
    let generated = sim.counters().generation_tokens_total;
    sim.shutdown().await;
    assert_eq!(report.api, api);
    let burst = report.burst.unwrap();
    let mut all = vec![&burst.warmup];
    all.extend(burst.levels.iter().flat_map(|l| l.results.iter()));
    for r in &all {
        assert!(r.ok, "{api:?}: {:?}", r.error);
        assert_eq!(r.tokens_from, TokensFrom::Usage, "{api:?}");
        assert_eq!(r.completion_tokens, Some(u64::from(TOKENS)), "{api:?}");
        assert!(r.prompt_tokens.is_some_and(|p| p > 0), "{api:?}");
        match r.ttft_ms {
            Some(t) => assert!(
                stream && t > 0.0 && t < r.e2e_ms,
                "{api:?}: {t} vs {}",
                r.e2e_ms
            ),
            None => assert!(!stream, "{api:?}: no TTFT"),
        }
        if stream {
            // One output event per token: the simulator's text deltas are never merged.
            assert_eq!(r.content_events, u64::from(TOKENS), "{api:?}");
        }
    }
    assert_eq!(
        generated,
        u64::from(TOKENS) * 5,
        "{api:?}: 1 warm-up + 1 + 3"
    );
}

#[tokio::test]
async fn every_api_streamed() {
    for api in [Api::Chat, Api::Completions, Api::Responses, Api::Messages] {
        sweep(api, true).await;
    }
}

#[tokio::test]
async fn every_api_not_streamed() {
    for api in [Api::Chat, Api::Completions, Api::Responses, Api::Messages] {
        sweep(api, false).await;
    }
}
