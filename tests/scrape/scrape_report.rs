//! The offline cross-check (`analyze`'s part) on a hand-made timeline with a known answer, and
//! on a real access log written by the proxy in front of the simulator.

use std::time::{Duration, Instant};

use crate::common::*;
use tokenmeter::analyze::crosscheck::{crosscheck_report, render_text};
use tokenmeter::clock::NANOS_PER_SEC;
use tokenmeter::meter::replay::Timeline;
use tokenmeter::record::RequestRecord;
use tokenmeter::scrape::{ServerSample, VllmValues};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const S: u64 = NANOS_PER_SEC;

fn sample(ts_ns: u64, gen: f64) -> ServerSample {
    ServerSample {
        ts_ns,
        values: VllmValues {
            running: Some(4.0),
            waiting: Some(0.0),
            generation_tokens_total: Some(gen),
            prompt_tokens_total: Some(0.0),
            kv_cache_usage: None,
            ttft: None,
            ..Default::default()
        },
        proxy_in_flight: Some(4),
        scrape_ms: 1.0,
    }
}

#[test]
fn known_timeline() {
    // Seconds 100..110 steady at 4 with 100 proxy tokens each; the server counts 100 tok/s in
    // the first half and 110 tok/s in the second.
    let mut tl = Timeline::default();
    for s in 100..110 {
        let b = tl.seconds.entry(s).or_default();
        b.gen_tokens = 100.0;
        b.observe_level(4, S);
    }
    // A second at another level breaks steadiness for every interval touching it.
    let mut shaky = tl.clone();
    shaky.seconds.get_mut(&103).unwrap().observe_level(5, 1);
    let samples = vec![
        sample(100 * S + S / 2, 0.0),
        sample(102 * S + S / 2, 200.0),
        sample(104 * S + S / 2, 400.0),
        sample(106 * S + S / 2, 620.0),
        sample(108 * S + S / 2, 840.0),
        sample(109 * S + S / 2, 950.0),
    ];
    // Windows of 4 s run sample to sample: [100.5, 104.5], [104.5, 108.5]; the last second
    // does not make a third.
    let r = crosscheck_report(&tl, &samples, 4, 5.0);
    assert_eq!(r.samples, 6);
    assert_eq!(r.steady_windows.len(), 2);
    let (a, b) = (&r.steady_windows[0], &r.steady_windows[1]);
    assert_eq!(
        (a.n, a.start_ns, a.seconds),
        (Some(4), 100 * S + S / 2, 4.0)
    );
    assert_eq!(a.server.interval_s, Some(4.0));
    assert_eq!(a.server.samples, 3);
    assert_eq!(a.server.gen_tok_s, Some(100.0));
    assert_eq!(a.server.proxy_gen_tok_s, Some(100.0));
    assert_eq!(a.server.disagreement_pct, Some(0.0));
    assert_eq!(a.server.disagreement, Some(false));
    assert_eq!(b.server.gen_tok_s, Some(110.0));
    let pct = b.server.disagreement_pct.unwrap();
    assert!((pct - 100.0 * (400.0 - 440.0) / 440.0).abs() < 1e-9);
    assert_eq!(b.server.disagreement, Some(true));
    assert_eq!(r.intervals.len(), 5);
    assert!(r.intervals.iter().all(|i| i.n == Some(4)));
    assert_eq!(r.intervals[2].server.gen_tok_s, Some(110.0));
    assert_eq!(r.intervals[2].server.proxy_gen_tok_s, Some(100.0));
    let o = r.overall.as_ref().unwrap();
    assert_eq!(o.server.interval_s, Some(9.0));
    assert_eq!(o.server.gen_tok_s, Some(950.0 / 9.0));
    assert_eq!(o.server.proxy_gen_tok_s, Some(100.0));
    let r2 = crosscheck_report(&shaky, &samples, 4, 5.0);
    assert_eq!(r2.steady_windows.len(), 1);
    assert_eq!(r2.intervals[1].n, None);
    let text = render_text(&r);
    assert!(
        text.contains("DISAGREE") && text.contains("-9.09"),
        "{text}"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["steady_windows"][0]["n"], 4);
}

#[test]
fn no_samples_no_rows() {
    let r = crosscheck_report(&Timeline::default(), &[], 10, 5.0);
    assert!(r.steady_windows.is_empty() && r.intervals.is_empty() && r.overall.is_none());
    assert!(render_text(&r).contains("0 samples"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_log_agrees_with_itself() {
    let sim_cfg = tokenmeter::sim::SimConfig {
        stop_probability_per_token: 0.0,
        ..Default::default()
    };
    let sim = crate::common::start_sim(sim_cfg).await;
    let p = TestProxy::start(&format!("http://{}", sim.addr()), |c| {
        c.upstream_metrics_url = Some("auto".into());
        c.metrics_scrape_interval_s = 1.0;
    })
    .await;
    // Proxy seconds are compared pro rata, so keep the traffic out of the seconds holding the
    // first and the last sample: start after the first sample's second has passed.
    let first = wait_log(&p, |l| l.iter().any(|x| x["type"] == "server_sample")).await;
    let first_ts = first
        .iter()
        .find_map(ServerSample::from_json)
        .unwrap()
        .ts_ns;
    let target = (first_ts / S + 1) * S + S / 20;
    let wait = target.saturating_sub(tokenmeter::clock::Clock::global().now());
    tokio::time::sleep(Duration::from_nanos(wait)).await;
    // Eight requests of 60 tokens each, started together.
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let addr = p.addr;
            tokio::spawn(async move {
                let body = format!(r#"{{"model":"sim-model","messages":[{{"role":"user","content":"r {i}"}}],"max_tokens":60,"stream":true}}"#);
                let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
                c.write_all(&post("/v1/chat/completions", &body, &[])).await.unwrap();
                let mut buf = Vec::new();
                let _ = c.read_to_end(&mut buf).await;
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // Then a sample in a later second than every request's end.
    let lines = wait_log(&p, |lines| {
        let ends: Vec<u64> = lines
            .iter()
            .filter(|l| l["type"] == "request")
            .map(|l| l["ts_ns"].as_u64().unwrap() + (l["e2e_ms"].as_f64().unwrap() * 1e6) as u64)
            .collect();
        let last_end = ends.iter().max().copied().unwrap_or(u64::MAX);
        ends.len() == 8
            && lines
                .iter()
                .filter_map(ServerSample::from_json)
                .any(|x| x.ts_ns / S > last_end / S)
    })
    .await;
    p.stop().await;
    let records: Vec<RequestRecord> = lines
        .iter()
        .filter(|l| l["type"] == "request")
        .map(|l| serde_json::from_value(l.clone()).unwrap())
        .collect();
    let samples: Vec<ServerSample> = lines.iter().filter_map(ServerSample::from_json).collect();
    assert_eq!(records.len(), 8);
    assert!(samples.len() >= 3);
    let tl = Timeline::from_records(&records);
    let r = crosscheck_report(&tl, &samples, 1, 5.0);
    let o = r.overall.as_ref().unwrap();
    // Every token happened between the first and the last sample: both sides count 480.
    let secs = o.server.interval_s.unwrap();
    assert!(
        (o.server.gen_tok_s.unwrap() * secs - 480.0).abs() < 1e-6,
        "{o:?}"
    );
    assert!(
        (o.server.proxy_gen_tok_s.unwrap() * secs - 480.0).abs() < 1e-6,
        "{o:?}"
    );
    assert_eq!(o.server.disagreement, Some(false));
    sim.shutdown().await;
}

/// Polls the access log until `done` holds (at most 10 s).
async fn wait_log(
    p: &TestProxy,
    done: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&p.log_path).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if done(&lines) {
            return lines;
        }
        assert!(Instant::now() < deadline, "log never got there: {text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn rows_for_externally_found_spans() {
    use tokenmeter::analyze::crosscheck::{pro_rata_over, rows_for_spans, SteadySpan};
    // 100 proxy tokens a second over seconds 100..110; the server counts 105 a second.
    let seconds: Vec<(u64, f64)> = (100..110).map(|s| (s, 100.0)).collect();
    let samples: Vec<ServerSample> = (0..10)
        .map(|i| sample(100 * S + S / 2 + i * S, 105.0 * i as f64))
        .collect();
    let spans = [
        SteadySpan {
            start_sec: 100,
            seconds: 5,
            n: 4,
        },
        SteadySpan {
            start_sec: 105,
            seconds: 1,
            n: 3,
        },
    ];
    let (rows, overall) = rows_for_spans(&spans, &samples, pro_rata_over(&seconds), 5.0);
    assert_eq!(rows.len(), 2);
    // Samples at 100.5 .. 104.5 inside the first span: a 4 s interval.
    assert_eq!(rows[0].server.interval_s, Some(4.0));
    assert_eq!(rows[0].server.gen_tok_s, Some(105.0));
    assert_eq!(rows[0].server.proxy_gen_tok_s, Some(100.0));
    assert_eq!(rows[0].server.disagreement, Some(false));
    assert_eq!((rows[0].n, rows[0].seconds), (Some(4), 5.0));
    // One sample inside a 1 s span: no rate.
    assert_eq!(rows[1].server.samples, 1);
    assert_eq!(rows[1].server.gen_tok_s, None);
    let o = overall.unwrap();
    assert_eq!(o.server.interval_s, Some(9.0));
    assert_eq!(o.server.gen_tok_s, Some(105.0));
    // [100.5, 109.5]: half of 100, 101..108, half of 109 = 900 tokens.
    assert_eq!(o.server.proxy_gen_tok_s, Some(100.0));
}
