//! The burst sweep against the built-in simulator reproduces its per-request decode rates.

use std::time::Duration;

use tokenmeter::load::{run, LoadOptions, ProgressEvent};
use tokenmeter::sim::{spawn, SimConfig};

const TOKENS: u32 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_against_sim_reproduces_1000_over_step_time() {
    let cfg = SimConfig {
        // Every request generates exactly max_tokens; prefill is made negligible so the
        // per-request rate is the decode rate alone.
        stop_probability_per_token: 0.0,
        prefill_tok_s: 1e9,
        log_stats_interval_s: 0.0,
        ..SimConfig::default()
    };
    let (base, per_seq) = (cfg.step_base_ms, cfg.step_per_seq_ms);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim = spawn(cfg, listener).await.unwrap();
    let mut opts = LoadOptions::burst(format!("http://{}/v1", sim.addr()), &[1, 4, 8, 16]);
    opts.max_tokens = Some(TOKENS);
    opts.timeout = Duration::from_secs(20);
    // The sim's schedule slip (time lost when a loaded machine wakes it late) after the warm-up
    // and after each level: a level's slip delays every request of that level.
    let slips = std::sync::Mutex::new(Vec::new());
    let progress = |e: &ProgressEvent<'_>| {
        if matches!(e, ProgressEvent::Warmup(_) | ProgressEvent::LevelDone(_)) {
            slips.lock().unwrap().push(sim.step_lag().slip_ns);
        }
    };
    let report = run(opts, &progress).await.unwrap();
    let lag = sim.step_lag();
    let slips = slips.into_inner().unwrap();
    sim.shutdown().await;
    println!("{}", tokenmeter::load::table::render(&report));
    for (i, l) in report.burst.as_ref().unwrap().levels.iter().enumerate() {
        let step_ms = base + per_seq * l.level as f64;
        let slip_ms = (slips[i + 1] - slips[i]) as f64 / 1e6;
        // 1000/(12.2 + 2.1·N) tok/s, stretched by the sim's own slip if the machine caused any.
        let want = f64::from(TOKENS) * 1000.0 / (f64::from(TOKENS) * step_ms + slip_ms);
        assert_eq!(l.figures.failures, 0);
        assert_eq!(
            l.figures.completion_tokens,
            u64::from(TOKENS) * l.level as u64
        );
        let avg = l.figures.per_request_tok_s.unwrap().avg;
        // A request that arrives during a step waits for the next one: at most one step of
        // TOKENS, i.e. 1/30 = 3.3% slower, inside the 5%.
        assert!(
            (avg - want).abs() <= 0.05 * want,
            "level {}: per-request {avg:.1} vs {want:.1} tok/s (slip {slip_ms:.1} ms; {lag:?})",
            l.level
        );
        let agg = l.aggregate_tok_s.unwrap();
        assert!(
            (agg - want * l.level as f64).abs() <= 0.05 * want * l.level as f64,
            "level {}: aggregate {agg:.1}",
            l.level
        );
    }
}
