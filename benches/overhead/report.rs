//! The human table and the target verdicts of the overhead harness.

use crate::Opts;
use serde_json::Value;

/// Current UTC time, RFC 3339.
pub fn now_utc() -> String {
    let f = time::format_description::well_known::Rfc3339;
    time::OffsetDateTime::now_utc()
        .format(&f)
        .unwrap_or_default()
}

/// `YYYY-MM-DD-HHMM` for the result file name.
pub fn file_stamp() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}-{:02}{:02}",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute()
    )
}

fn num(v: &Value, path: &[&str]) -> Option<f64> {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_f64)
}

fn cell(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.1}"))
}

/// Prints the tables and target verdicts to stdout.
pub fn print(all: &Value, o: &Opts) {
    let m = &all["meta"];
    println!(
        "\n{} UTC, commit {}, shape {}, load average before {} / after {}, open-files hard limit {}",
        m["date_utc"].as_str().unwrap_or("?"),
        m["git_head"].as_str().unwrap_or("?"),
        m["shape"].as_str().unwrap_or("?"),
        m["loadavg_before"].as_str().unwrap_or("?"),
        m["loadavg_after"].as_str().unwrap_or("?"),
        m["nofile_limit"]
    );
    println!("\n## Added latency vs direct (µs; TTFT: 1-event requests rank-paired per round; event delay: stamp-delay quantile differences)\n");
    println!("| conc | arm | TTFT p50 raw | +TTFT p50 | +TTFT p90 | +TTFT p99 | +event p50 | +event p99 | errors |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for c in &o.concurrency {
        let Some(l) = all.get("latency").and_then(|l| l.get(c.to_string())) else {
            continue;
        };
        for arm in crate::phases::ARMS {
            let Some(a) = l.get(arm) else { continue };
            println!(
                "| {c} | {arm} | {} | {} | {} | {} | {} | {} | {} |",
                cell(num(a, &["ttft_us_p50"])),
                cell(num(a, &["added_ttft_us", "p50"])),
                cell(num(a, &["added_ttft_us", "p90"])),
                cell(num(a, &["added_ttft_us", "p99"])),
                cell(num(a, &["added_event_delay_us", "p50"])),
                cell(num(a, &["added_event_delay_us", "p99"])),
                a["errors"]
            );
        }
    }
    print_peers(all);
    println!("\n## Proxy cost\n");
    println!("| arm | CPU µs/request | CPU µs/event | idle RSS KiB | RSS KiB/stream (per ramp step) | max streams, 0 errors |");
    println!("|---|---|---|---|---|---|");
    for arm in [
        "tokenmeter",
        "tokenmeter_nometer",
        "tokenmeter_before",
        "tokenmeter_before_nometer",
        "nginx",
        "direct",
    ] {
        let cpu = all.get("cpu").and_then(|c| c.get(arm));
        let ramp = all.get("ramp").and_then(|c| c.get(arm));
        if cpu.is_none() && ramp.is_none() {
            continue;
        }
        let per_stream = ramp
            .and_then(|r| r["steps"].as_array())
            .map(|s| {
                s.iter()
                    .map(|s| {
                        format!(
                            "{}@{}",
                            cell(s["rss_kib_per_stream"].as_f64()),
                            s["streams"]
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        println!(
            "| {arm} | {} | {} | {} | {} | {} |",
            cell(cpu.and_then(|c| c["cpu_us_per_request"].as_f64())),
            cell(cpu.and_then(|c| c["cpu_us_per_event"].as_f64())),
            ramp.map_or("-".into(), |r| r["rss_idle_kib"].to_string()),
            if arm == "direct" {
                "-".into()
            } else {
                per_stream
            },
            ramp.map_or("-".into(), |r| r["max_streams_zero_errors"].to_string()),
        );
    }
    println!("\n## Targets\n");
    for (name, verdict) in targets(all) {
        println!("- {name}: {verdict}");
    }
    println!();
}

/// The peers phase's table: per Python client and arm.
fn print_peers(all: &Value) {
    let Some(p) = all.get("peers") else { return };
    println!(
        "\n## Python peers: {} rounds of {} events, load at the end {} (µs; TTFT paired with the same client's direct request in the round; there = request start to the upstream's read of it, back = from there to the first event, raw client only)\n",
        p["rounds"], p["events_per_request"], p["loadavg_end"].as_str().unwrap_or("?")
    );
    println!("| client | arm | TTFT p50 raw | head p50 raw | +TTFT p50 | +TTFT p90 | +there p50 | +back p50 | +event p50 | +event p99 | first event with head | errors |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let Some(clients) = p["clients"].as_object() else {
        return;
    };
    for (client, arms) in clients {
        for arm in crate::phases::ARMS {
            let Some(a) = arms.get(arm) else { continue };
            println!(
                "| {client} | {arm} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                cell(num(a, &["ttft_us_p50"])),
                cell(num(a, &["head_us_p50"])),
                cell(num(a, &["added_ttft_us", "p50"])),
                cell(num(a, &["added_ttft_us", "p90"])),
                cell(num(a, &["added_way_there_us_p50"])),
                cell(num(a, &["added_way_back_us_p50"])),
                cell(num(a, &["added_event_delay_us", "p50"])),
                cell(num(a, &["added_event_delay_us", "p99"])),
                a["first_event_with_head"]
                    .as_f64()
                    .map_or("-".into(), |f| format!("{:.0}%", f * 100.0)),
                a["errors"]
            );
        }
    }
}

fn verdict(ok: Option<bool>, detail: String) -> String {
    match ok {
        Some(true) => format!("MET ({detail})"),
        Some(false) => format!("MISSED ({detail})"),
        None => format!("not measured ({detail})"),
    }
}

/// Every target of the issue with its verdict and the numbers behind it.
pub fn targets(all: &Value) -> Vec<(&'static str, String)> {
    let lat = |c: &str, arm: &str, k: &str| num(all, &["latency", c, arm, k, "p50"]);
    let cpu = |arm: &str| num(all, &["cpu", arm, "cpu_us_per_event"]);
    let mut v = Vec::new();
    peer_targets(all, &mut v);
    let (t, n) = (
        lat("1", "tokenmeter", "added_ttft_us"),
        lat("1", "nginx", "added_ttft_us"),
    );
    v.push((
        "added TTFT p50 at 1 stream ≤ nginx + 30 µs",
        verdict(
            t.zip(n).map(|(t, n)| t <= n + 30.0),
            format!("tokenmeter {} µs, nginx {} µs", cell(t), cell(n)),
        ),
    ));
    let (t, n) = (
        lat("16", "tokenmeter", "added_ttft_us"),
        lat("16", "nginx", "added_ttft_us"),
    );
    v.push((
        "added TTFT p50 at 16 streams ≤ nginx",
        verdict(
            t.zip(n).map(|(t, n)| t <= n),
            format!("tokenmeter {} µs, nginx {} µs", cell(t), cell(n)),
        ),
    ));
    for c in ["1", "16", "256"] {
        let (t, n) = (
            lat(c, "tokenmeter", "added_event_delay_us"),
            lat(c, "nginx", "added_event_delay_us"),
        );
        let name = match c {
            "1" => "added per-event delay p50 ≤ nginx + 10 µs (1 stream)",
            "16" => "added per-event delay p50 ≤ nginx + 10 µs (16 streams)",
            _ => "added per-event delay p50 ≤ nginx + 10 µs (256 streams)",
        };
        v.push((
            name,
            verdict(
                t.zip(n).map(|(t, n)| t <= n + 10.0),
                format!("tokenmeter {} µs, nginx {} µs", cell(t), cell(n)),
            ),
        ));
    }
    let (t, n, off) = (cpu("tokenmeter"), cpu("nginx"), cpu("tokenmeter_nometer"));
    v.push((
        "CPU per event ≤ 1.2 × nginx",
        verdict(
            t.zip(n).map(|(t, n)| t <= 1.2 * n),
            format!("tokenmeter {} µs, nginx {} µs", cell(t), cell(n)),
        ),
    ));
    v.push((
        "metering adds ≤ 2 µs CPU per event",
        verdict(
            t.zip(off).map(|(t, o)| t - o <= 2.0),
            format!("on {} µs, off {} µs", cell(t), cell(off)),
        ),
    ));
    let steps = all
        .get("ramp")
        .and_then(|r| r.get("tokenmeter"))
        .and_then(|r| r["steps"].as_array())
        .cloned()
        .unwrap_or_default();
    let worst = steps
        .iter()
        .filter_map(|s| s["rss_kib_per_stream"].as_f64())
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    v.push((
        "RSS ≤ 32 KiB per open stream",
        verdict(
            worst.map(|w| w <= 32.0),
            format!("worst step {} KiB", cell(worst)),
        ),
    ));
    let idle = num(all, &["ramp", "tokenmeter", "rss_idle_kib"]);
    v.push((
        "idle RSS ≤ 16 MiB",
        verdict(idle.map(|i| i <= 16384.0), format!("{} KiB", cell(idle))),
    ));
    let served = num(all, &["ramp", "tokenmeter", "max_streams_zero_errors"]);
    v.push((
        "10,000 concurrent streams, 0 errors",
        verdict(
            served.map(|s| s >= 10000.0),
            format!("{} streams", cell(served)),
        ),
    ));
    v
}

/// The peers phase's targets, per Python client: added TTFT p50 ≤ nginx + 30 µs, added per-event
/// delay p50 ≤ nginx + 10 µs.
fn peer_targets(all: &Value, v: &mut Vec<(&'static str, String)>) {
    let peer = |c: &str, arm: &str, k: &str| num(all, &["peers", "clients", c, arm, k, "p50"]);
    for (c, ttft_name, event_name) in [
        (
            "raw",
            "Python asyncio peers: added TTFT p50 ≤ nginx + 30 µs",
            "Python asyncio peers: added per-event delay p50 ≤ nginx + 10 µs",
        ),
        (
            "sdk",
            "openai SDK client: added TTFT p50 ≤ nginx + 30 µs",
            "openai SDK client: added per-event delay p50 ≤ nginx + 10 µs",
        ),
    ] {
        if all.get("peers").and_then(|p| p["clients"].get(c)).is_none() {
            continue;
        }
        for (name, key, slack) in [
            (ttft_name, "added_ttft_us", 30.0),
            (event_name, "added_event_delay_us", 10.0),
        ] {
            let (t, n) = (peer(c, "tokenmeter", key), peer(c, "nginx", key));
            v.push((
                name,
                verdict(
                    t.zip(n).map(|(t, n)| t <= n + slack),
                    format!("tokenmeter {} µs, nginx {} µs", cell(t), cell(n)),
                ),
            ));
        }
    }
}
