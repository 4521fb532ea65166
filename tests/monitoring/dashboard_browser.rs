//! The dashboard page in a real browser: headless Chromium loads it from `admin_listen` while
//! streams and 1,000 one-shot users pass the proxy, and the rendered DOM must show what `/stats`
//! said in the very snapshot the page drew (the page marks the snapshot's `uptime_s` on `<body>`;
//! a relay between the browser and the proxy keeps every `/stats` answer it passed on).
//!
//! Needs Chromium (`.ci/run` installs the Debian package): `cargo test --release --test
//! dashboard_browser -- --ignored --nocapture`. With `TOKENMETER_SCREENSHOT=path` the screenshot
//! is copied there (the picture in docs/monitoring.md is of the demo instead; how it was taken is
//! written below it).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::monitoring_support::*;
use axum::http::{header, Uri};
use axum::response::IntoResponse;
use serde_json::Value;

/// The `/stats` and `/stats/timeline` documents passed on, in order.
type Seen = Arc<Mutex<(Vec<Value>, Vec<Value>)>>;

/// Serves everything from `admin`, keeping each `/stats` document it passes on.
async fn relay(admin: SocketAddr, seen: Seen) -> SocketAddr {
    let app = axum::Router::new().fallback(move |uri: Uri| {
        let seen = seen.clone();
        async move {
            let path = uri
                .path_and_query()
                .map(axum::http::uri::PathAndQuery::as_str)
                .unwrap_or("/");
            let (status, body) = get(admin, path).await;
            let kind = if uri.path() == "/" {
                "text/html; charset=utf-8"
            } else {
                "application/json"
            };
            if status == 200 {
                let mut seen = seen.lock().unwrap();
                match uri.path() {
                    "/stats" => seen.0.push(serde_json::from_str(&body).unwrap()),
                    "/stats/timeline" => seen.1.push(serde_json::from_str(&body).unwrap()),
                    _ => {}
                }
            }
            (
                axum::http::StatusCode::from_u16(status).unwrap(),
                [(header::CONTENT_TYPE, kind)],
                body,
            )
                .into_response()
        }
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

fn decode(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

/// The text of the element whose start tag holds `attr` (its direct text up to the next tag).
fn text_at(dom: &str, attr: &str) -> String {
    let at = dom
        .find(attr)
        .unwrap_or_else(|| panic!("{attr} not in the page"));
    let start = at + dom[at..].find('>').unwrap() + 1;
    let end = start + dom[start..].find('<').unwrap();
    decode(&dom[start..end])
}

/// The value of attribute `name` on `<body>`.
fn body_attr(dom: &str, name: &str) -> String {
    let b = dom.find("<body").unwrap();
    let tag = &dom[b..b + dom[b..].find('>').unwrap()];
    let at = tag
        .find(&format!("{name}=\""))
        .unwrap_or_else(|| panic!("<body> has no {name}: {tag}"));
    let v = &tag[at + name.len() + 2..];
    decode(&v[..v.find('"').unwrap()])
}

/// Cells of the table rows inside the element with `id`, skipping hidden rows.
fn rows(dom: &str, id: &str) -> Vec<Vec<String>> {
    let at = dom.find(&format!("id=\"{id}\"")).unwrap();
    let tbody = at + dom[at..].find("<tbody>").unwrap();
    let end = tbody + dom[tbody..].find("</tbody>").unwrap();
    let mut out = Vec::new();
    for tr in dom[tbody..end].split("<tr").skip(1) {
        let open = &tr[..tr.find('>').unwrap()];
        if open.contains(" hidden") {
            continue;
        }
        let cells = tr
            .split("<td")
            .skip(1)
            .map(|td| {
                let s = td.find('>').unwrap() + 1;
                decode(&td[s..td.find("</td>").unwrap()])
            })
            .collect();
        out.push(cells);
    }
    out
}

/// `shown` is `value` rounded to `dp` decimals (either rounding of a tie), or "–" for null.
#[track_caller]
fn agrees(what: &str, shown: &str, value: &Value, dp: i32) {
    match value.as_f64() {
        None => assert_eq!(shown, "–", "{what}: /stats has null"),
        Some(v) => {
            let t = shown.trim_end_matches(" %").trim_end_matches('×');
            let x: f64 = t
                .parse()
                .unwrap_or_else(|_| panic!("{what}: {shown:?} is not a number (want {v})"));
            let tol = 0.5 * 10f64.powi(-dp) + 1e-9 * v.abs().max(1.0);
            assert!((x - v).abs() <= tol, "{what}: page {shown}, /stats {v}");
        }
    }
}

fn dump_dom(url: &str, budget_ms: u64) -> String {
    let profile = Scratch::new("chromium-dom");
    let out = chromium(&profile.0)
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium; run by .ci/run"]
async fn the_page_shows_what_stats_said_in_the_snapshot_it_drew() {
    let rig = Rig::start().await;
    let seen: Seen = Arc::default();
    let relay = relay(rig.admin, seen.clone()).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    // 1,000 users with one short request each fill the live view; then three levels for the
    // capacity curve: 2 streams, 4 from 12 s on, 8 from 24 s on.
    rig.one_shot_users(1000).await;
    let plan: Vec<(Duration, u32)> = (0..8u32)
        .map(|i| {
            let phase = if i < 2 {
                0
            } else if i < 4 {
                12
            } else {
                24
            };
            (Duration::from_secs(phase), 300 + 40 * i)
        })
        .collect();
    let streams = rig.hold_streams(&plan, deadline);
    // Let the windows, the capacity curve and the scrape samples fill.
    tokio::time::sleep(Duration::from_secs(40)).await;

    let url = format!("http://{relay}/");
    let dom = tokio::task::spawn_blocking(move || dump_dom(&url, 6000))
        .await
        .unwrap();
    let updates: u32 = body_attr(&dom, "data-updates").parse().unwrap();
    assert!(updates >= 3, "the page polled only {updates} times in 6 s");
    let uptime = body_attr(&dom, "data-uptime-s");
    let window = body_attr(&dom, "data-window");
    assert_eq!(window, "60s");
    let update_ms: f64 = body_attr(&dom, "data-update-ms").parse().unwrap();
    // The page polls /stats and /stats/timeline together, one poll after the other: the
    // timeline it drew is the one passed on with the snapshot.
    let (snap, timeline) = {
        let seen = seen.lock().unwrap();
        let want: f64 = uptime.parse().unwrap();
        let k = seen
            .0
            .iter()
            .position(|s| s["uptime_s"].as_f64() == Some(want))
            .unwrap_or_else(|| panic!("no /stats answer with uptime_s {uptime} passed the relay"));
        (seen.0[k].clone(), seen.1[k].clone())
    };
    let w = &snap["windows"][&window];

    // Tiles.
    agrees(
        "gen tok/s",
        &text_at(&dom, "id=\"gen_tok_s\""),
        &w["gen_tok_s"],
        1,
    );
    assert!(w["gen_tok_s"].as_f64().unwrap() > 0.0);
    agrees(
        "prompt tok/s",
        &text_at(&dom, "id=\"prompt_tok_s\""),
        &w["prompt_tok_s"],
        1,
    );
    agrees(
        "in flight",
        &text_at(&dom, "id=\"in_flight\""),
        &snap["in_flight"],
        0,
    );
    agrees(
        "in flight mean",
        &text_at(&dom, "id=\"in_flight_mean\""),
        &w["in_flight"]["mean"],
        2,
    );
    agrees(
        "finished",
        &text_at(&dom, "id=\"requests_finished\""),
        &w["requests_finished"],
        0,
    );
    agrees(
        "started",
        &text_at(&dom, "id=\"requests_started\""),
        &w["requests_started"],
        0,
    );
    agrees("errors", &text_at(&dom, "id=\"errors\""), &w["errors"], 0);
    agrees(
        "errors total",
        &text_at(&dom, "id=\"errors_total\""),
        &snap["totals"]["errors"],
        0,
    );

    // Percentiles.
    let pct = rows(&dom, "pct");
    for (key, label) in [("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "e2e")] {
        let r = pct
            .iter()
            .find(|r| r[0].starts_with(label))
            .unwrap_or_else(|| panic!("no row for {key}"));
        for (i, p) in ["p50", "p90", "p99"].iter().enumerate() {
            agrees(&format!("{key} {p}"), &r[i + 1], &w[key][p], 1);
        }
    }

    // Users: 1,012 in the live view, the top 20 by tok/s shown, in order.
    let users = snap["users"].as_object().unwrap();
    assert_eq!(users.len(), 1008, "1,000 one-shot users and 8 agents");
    assert!(text_at(&dom, "id=\"users_sub\"").starts_with(&format!("{} users", users.len())));
    let mut ranked: Vec<(&String, f64)> = users
        .iter()
        .map(|(k, u)| {
            (
                k,
                u["windows"][&window]["gen_tok_s"].as_f64().unwrap_or(-1.0),
            )
        })
        .collect();
    ranked.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap().then(a.0.cmp(b.0)));
    let table = rows(&dom, "users");
    assert_eq!(table.len(), 20, "one page of 20 rows, not 1,000");
    let agg = w["gen_tok_s"].as_f64().unwrap();
    for (i, r) in table.iter().enumerate() {
        assert_eq!(&r[1], ranked[i].0, "row {i}");
        let uw = &users[ranked[i].0]["windows"][&window];
        agrees("user tok/s", &r[2], &uw["gen_tok_s"], 1);
        let share = uw["gen_tok_s"].as_f64().map(|v| 100.0 * v / agg);
        agrees("share", &r[3], &serde_json::json!(share), 1);
        agrees("user requests", &r[4], &uw["requests_finished"], 0);
        agrees("user ttft p50", &r[5], &uw["ttft_ms"]["p50"], 1);
        agrees("user ttft p90", &r[6], &uw["ttft_ms"]["p90"], 1);
        agrees("user in flight", &r[7], &users[ranked[i].0]["in_flight"], 0);
    }

    // Agent sessions: /stats' top sessions by wait, in its order, then the rest summed.
    let sess = &snap["sessions"];
    let top = sess["top"].as_array().unwrap();
    let folded = sess["other"]["sessions"].as_u64().unwrap();
    let table = rows(&dom, "sessions");
    assert_eq!(table.len(), top.len() + usize::from(folded > 0));
    assert!(text_at(&dom, "id=\"sessions_sub\"").starts_with(&format!("{} active", sess["active"])));
    for (r, t) in table.iter().zip(top) {
        assert_eq!(r[0], t["session"].as_str().unwrap());
        agrees("session calls", &r[2], &t["calls"], 0);
        let wait_s = t["wait_ms"].as_f64().unwrap() / 1e3;
        agrees("session wait s", &r[4], &serde_json::json!(wait_s), 2);
        agrees("session slowest", &r[10], &t["slowest_wait_ms"], 0);
    }
    if folded > 0 {
        assert_eq!(table[top.len()][0], format!("other ({folded} sessions)"));
    }

    // The capacity curve.
    let cap = snap["capacity"].as_array().unwrap();
    assert!(!cap.is_empty(), "no steady second in the curve");
    let table = rows(&dom, "capacity");
    assert_eq!(table.len(), cap.len());
    for (r, c) in table.iter().zip(cap) {
        agrees("N", &r[0], &c["in_flight"], 0);
        agrees("seconds", &r[1], &c["seconds"], 0);
        agrees("cap tok/s", &r[2], &c["gen_tok_s"]["mean"], 1);
        agrees("cap stdev", &r[3], &c["gen_tok_s"]["stdev"], 1);
        agrees("per request", &r[4], &c["per_request_tok_s"]["avg"], 1);
        agrees("cap ttft p50", &r[5], &c["ttft_ms"]["p50"], 1);
        agrees("cap ttft p90", &r[6], &c["ttft_ms"]["p90"], 1);
    }

    // The capacity at the service level: the top tile is /stats' headline, "≥ N" while not
    // reached, and the per-level table is its rows (thin ones marked).
    let sl = &snap["service_level"];
    let c = &sl["capacity"];
    let headline = match c["in_flight"].as_u64() {
        None => "–".to_string(),
        Some(n) if c["reached"].as_bool().unwrap() => n.to_string(),
        Some(n) => format!("≥ {n}"),
    };
    assert_eq!(text_at(&dom, "id=\"sl_capacity\""), headline);
    assert_eq!(
        body_attr(&dom, "data-capacity"),
        c["in_flight"]
            .as_u64()
            .map_or(String::new(), |n| n.to_string())
    );
    // The 1,000 one-shot users arrive together (a level near 100 misses on time, the levels
    // below it are thin): no answer, and the tile's note gives /stats' own reason.
    if c["in_flight"].is_null() {
        assert_eq!(text_at(&dom, "id=\"sl_note\""), c["text"].as_str().unwrap());
    }
    let levels = sl["levels"].as_array().unwrap();
    let table = rows(&dom, "service_level");
    assert_eq!(table.len(), levels.len());
    for (r, l) in table.iter().zip(levels) {
        let n = l["in_flight"].as_u64().unwrap();
        let thin = l["thin"].as_bool().unwrap();
        assert_eq!(
            r[0],
            if thin {
                format!("{n} (thin)")
            } else {
                n.to_string()
            }
        );
        agrees("judged", &r[1], &l["requests"], 0);
        agrees("attainment", &r[2], &l["attainment_pct"], 1);
        agrees("clean s", &r[5], &l["seconds"], 1);
        agrees("per-request", &r[7], &l["per_request_tok_s"], 1);
        agrees("goodput", &r[9], &l["goodput_tok_s"], 1);
    }

    // The cross-check against the simulator's counters, and the log counters.
    let sv = &w["server"];
    let server = rows(&dom, "server");
    agrees("server tok/s", &server[0][1], &sv["gen_tok_s"], 1);
    agrees("proxy tok/s", &server[1][1], &sv["proxy_gen_tok_s"], 1);
    agrees("difference", &server[2][1], &sv["disagreement_pct"], 2);
    assert!(
        sv["gen_tok_s"].as_f64().unwrap() > 0.0,
        "the cross-check has data"
    );
    // The KV table, the headroom and the saturation state: /stats' kv and the window's
    // saturation as they are.
    let kv = &snap["kv"];
    let want = kv["table"].as_array().unwrap();
    let table = rows(&dom, "kv_table");
    assert_eq!(table.len(), want.len());
    for (r, k) in table.iter().zip(want) {
        assert_eq!(r[0], k["percentile"].as_str().unwrap());
        agrees("kv context", &r[1], &k["context_tokens"], 0);
        agrees("kv sequences", &r[2], &k["kv_sequences"], 0);
        agrees("kv service level", &r[3], &k["service_level_in_flight"], 0);
        agrees("kv max_num_seqs", &r[4], &k["max_num_seqs"], 0);
        let binds = k["binds_first"]
            .as_str()
            .map_or("–".into(), |b| b.replace('_', " "));
        assert_eq!(r[5], binds);
    }
    assert!(
        want[1]["kv_sequences"].as_u64() > Some(0),
        "the table read the simulator's cache: {kv}"
    );
    let headroom = rows(&dom, "kv_headroom");
    let kv_cell = |label: &str| {
        headroom
            .iter()
            .find(|r| r[0].starts_with(label))
            .unwrap_or_else(|| panic!("no {label} row"))[1]
            .clone()
    };
    let h = &kv["headroom"];
    agrees(
        "sequences p90",
        &kv_cell("sequences of the p90"),
        &h["sequences_p90"],
        0,
    );
    assert!(h["sequences_p90"].as_u64() > Some(0), "{h}");
    match (
        h["seconds_to_full"].as_f64(),
        h["growth_blocks_per_s"].is_null(),
    ) {
        (Some(_), _) => agrees(
            "to full",
            &kv_cell("seconds to full"),
            &h["seconds_to_full"],
            1,
        ),
        (None, false) => assert_eq!(kv_cell("seconds to full"), "not filling"),
        (None, true) => assert_eq!(kv_cell("seconds to full"), "–"),
    }
    agrees("growth", &kv_cell("growth"), &h["growth_blocks_per_s"], 2);
    agrees(
        "blocks",
        &kv_cell("blocks held by the proxy"),
        &kv["estimate"]["blocks"],
        0,
    );
    agrees(
        "server blocks",
        &kv_cell("blocks in use by vLLM"),
        &kv["estimate"]["server_blocks"],
        1,
    );
    let sat = &w["saturation"];
    assert_eq!(
        text_at(&dom, "id=\"saturation\""),
        sat["state"].as_str().unwrap_or("unknown")
    );
    assert_eq!(sat["source"], "scrape", "{sat}");
    // The timeline's band: the seconds whose state was queueing or preempting.
    let saturated = timeline["saturation"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v.as_u64() >= Some(1))
        .count();
    let band = dom.find("data-saturated-seconds=\"").map(|i| {
        let v = &dom[i + 24..];
        v[..v.find('"').unwrap()].to_string()
    });
    assert_eq!(band, Some(saturated.to_string()), "the timeline's band");
    println!("saturation: window {window} {sat}; timeline band {saturated} s; kv {kv}");

    let health = rows(&dom, "health");
    let cell = |label: &str| {
        health
            .iter()
            .find(|r| r[0].starts_with(label))
            .unwrap_or_else(|| panic!("no {label} row"))[1]
            .clone()
    };
    agrees(
        "written",
        &cell("access log: lines written"),
        &snap["access_log"]["written"],
        0,
    );
    agrees(
        "dropped",
        &cell("access log: dropped"),
        &snap["access_log"]["dropped"],
        0,
    );
    agrees(
        "failed",
        &cell("access log: lost"),
        &snap["access_log"]["failed"],
        0,
    );
    agrees(
        "ok",
        &cell("outcome ok"),
        &snap["totals"]["outcomes"]["ok"],
        0,
    );

    // The figures of the closing note: the page's update (fetch + draw) and /stats at this size.
    let mut full = Vec::new();
    let mut one = Vec::new();
    let mut sizes = (0, 0);
    for _ in 0..10 {
        let t = Instant::now();
        let (_, b) = get(rig.admin, "/stats").await;
        full.push(t.elapsed().as_secs_f64() * 1e3);
        sizes.0 = b.len();
        let t = Instant::now();
        let (_, b) = get(rig.admin, "/stats?window=60s").await;
        one.push(t.elapsed().as_secs_f64() * 1e3);
        sizes.1 = b.len();
    }
    full.sort_by(f64::total_cmp);
    one.sort_by(f64::total_cmp);
    println!(
        "{} users: page update (fetch + draw, virtual-time run) {update_ms:.1} ms; GET /stats \
         p50 {:.1} ms max {:.1} ms ({} KB); GET /stats?window=60s (what the page polls) p50 {:.1} ms \
         max {:.1} ms ({} KB)",
        users.len(),
        full[5],
        full[9],
        sizes.0 / 1024,
        one[5],
        one[9],
        sizes.1 / 1024
    );

    // The screenshot.
    let shot_dir = Scratch::new("shot");
    let shot = shot_dir.0.join("dashboard.png");
    let url = format!("http://{relay}/");
    let shot2 = shot.clone();
    let out = tokio::task::spawn_blocking(move || {
        let profile = Scratch::new("chromium-shot");
        chromium(&profile.0)
            .args(["--window-size=1400,2250", "--virtual-time-budget=3000"])
            .arg(format!("--screenshot={}", shot2.display()))
            .arg(url)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 50_000,
        "{} bytes",
        png.len()
    );
    if let Ok(to) = std::env::var("TOKENMETER_SCREENSHOT") {
        std::fs::write(&to, &png).unwrap();
        println!("screenshot written to {to}");
    }
    for s in streams {
        s.abort();
    }
}
