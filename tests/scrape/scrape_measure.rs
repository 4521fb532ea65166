//! The 10 s-scrape measurement (ignored by default: two runs of about 75 s): 16 streams through
//! the proxy, then 16 through it plus 8 straight to the simulator. Prints, every 10 s, the live
//! 20 s window (two samples: one 10 s scrape interval), the live 60 s window, and the offline
//! report over the access log. Run with
//! `cargo test --test scrape -- --ignored --nocapture scrape_measure::`.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::scrape_support::*;

/// One run of the 10 s measurement: 16 streams through the proxy (plus `bypass` straight to the
/// simulator) for about 70 s, scraping every 10 s. Prints the live 20 s window every 10 s (it
/// holds two samples, so each row is one 10 s scrape interval), the live 60 s window, and the
/// offline report over the access log.
async fn measured_run(bypass: usize) -> Vec<serde_json::Value> {
    let sim = sim().await;
    let p = TestProxy::start(&format!("http://{}", sim.addr()), |c| {
        c.upstream_metrics_url = Some("auto".into());
        c.metrics_scrape_interval_s = 10.0;
        c.meter.windows_s = vec![20, 60];
    })
    .await;
    let started = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(80);
    let mut tasks = hold_streams(p.addr, 16, "through", deadline, started.clone());
    tasks.extend(hold_streams(
        sim.addr(),
        bypass,
        "bypass",
        deadline,
        started.clone(),
    ));
    wait_for(&started, 16 + bypass as u64).await;
    println!(
        "\n{} streams through the proxy, {bypass} straight to the simulator; scrape every 10 s",
        16
    );
    println!(
        "{:<10} {:>12} {:>13} {:>9} {:>8} {:>8} {:>8}",
        "window", "proxy tok/s", "server tok/s", "diff %", "flag", "running", "proxy N"
    );
    let mut rows = Vec::new();
    let mut sixty = serde_json::Value::Null;
    for i in 0..7 {
        sleep_seconds(9, 150).await;
        let snap = stats_now(p.handle.as_ref().unwrap().meter()).await;
        let v = serde_json::to_value(&snap).unwrap();
        let s = v["windows"]["20s"]["server"].clone();
        println!(
            "{:<10} {:>7} {:>12.1} {:>13.1} {:>9} {:>8} {:>8} {:>8}",
            format!("#{i} ({:.1}s)", s["interval_s"].as_f64().unwrap_or(0.0)),
            v["windows"]["20s"]["steady"],
            s["proxy_gen_tok_s"].as_f64().unwrap_or(f64::NAN),
            s["gen_tok_s"].as_f64().unwrap_or(f64::NAN),
            s["disagreement_pct"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:+.3}")),
            s["disagreement"],
            s["running"]["max"],
            s["proxy_in_flight"],
        );
        rows.push(serde_json::json!({"steady": v["windows"]["20s"]["steady"], "server": s}));
        sixty = v["windows"]["60s"]["server"].clone();
    }
    println!(
        "live 60 s window: proxy {:.1} tok/s, server {:.1} tok/s, diff {:+.3}%, flag {}",
        sixty["proxy_gen_tok_s"].as_f64().unwrap_or(f64::NAN),
        sixty["gen_tok_s"].as_f64().unwrap_or(f64::NAN),
        sixty["disagreement_pct"].as_f64().unwrap_or(f64::NAN),
        sixty["disagreement"]
    );
    for t in tasks {
        t.abort();
    }
    let lines = p.finish().await;
    let records: Vec<tokenmeter::record::RequestRecord> = lines
        .iter()
        .filter(|l| l["type"] == "request")
        .map(|l| serde_json::from_value(l.clone()).unwrap())
        .collect();
    let samples: Vec<_> = lines
        .iter()
        .filter_map(tokenmeter::scrape::ServerSample::from_json)
        .collect();
    let tl = tokenmeter::meter::replay::Timeline::from_records(&records);
    let report = tokenmeter::analyze::crosscheck::crosscheck_report(&tl, &samples, 10, 5.0);
    println!(
        "offline, from the access log (request lines replayed):\n{}",
        tokenmeter::analyze::crosscheck::render_text(&report)
    );
    // The same log through `tokenmeter analyze`: its steady windows beside the server.
    let dir = TempDir::new("xcheck-measure");
    let path = dir.0.join("access.jsonl");
    let mut text = String::new();
    for l in &lines {
        text.push_str(&l.to_string());
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap();
    let r = tokenmeter::analyze::analyze(&[path], &Default::default()).unwrap();
    let rendered = tokenmeter::analyze::tables::render(&r);
    let section = rendered
        .split("## ")
        .filter(|s| s.starts_with("Steady windows") || s.starts_with("Proxy window vs server"))
        .collect::<Vec<_>>()
        .join("## ");
    println!("tokenmeter analyze on the same log:\n## {section}");
    sim.shutdown().await;
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "two 75 s runs with 10 s scrapes"]
async fn measured_ten_second_scrapes_through_and_bypassing() {
    let rows = measured_run(0).await;
    let steady: Vec<_> = rows.iter().filter(|r| r["steady"] == true).collect();
    assert!(steady.len() >= 5);
    for r in steady {
        let pct = r["server"]["disagreement_pct"].as_f64().unwrap();
        assert!(pct.abs() < 1.0, "{r}");
    }
    let rows = measured_run(8).await;
    assert!(rows
        .iter()
        .filter(|r| r["steady"] == true)
        .all(|r| r["server"]["disagreement"] == true));
}
