//! Scratch experiment: which per-request token timeline reproduces the live attribution.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{env_u64, stats_now};
use tokenmeter::clock::UnixNanos;
use tokenmeter::load::{Arrivals, LoadOptions, NoProgress};
use tokenmeter::meter::levels::{GuardConfig, LevelAttribution, LevelSums};
use tokenmeter::observe::Observer;
use tokenmeter::record::RequestRecord;
use tokenmeter::sim::SimConfig;

#[derive(Default)]
struct Rec(Mutex<Vec<serde_json::Value>>);

impl Observer for Rec {
    fn started(&self, id: u64, now: UnixNanos, _: &Arc<str>, _: Option<&Arc<str>>) {
        self.0
            .lock()
            .unwrap()
            .push(serde_json::json!({"k":"s","id":id,"t":now}));
    }
    fn tokens(&self, id: u64, now: UnixNanos, n: u64) {
        self.0
            .lock()
            .unwrap()
            .push(serde_json::json!({"k":"t","id":id,"t":now,"n":n}));
    }
    fn finished(&self, id: u64, now: UnixNanos, r: &Arc<RequestRecord>, metered: bool) {
        if metered {
            self.0.lock().unwrap().push(serde_json::json!({"k":"f","id":id,"t":now,
                "ts":r.ts_ns,"ttft":r.ttft_ms,"e2e":r.e2e_ms,"c":r.completion_tokens,"stream":r.stream,"curve":r.token_curve,"path":r.path}));
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Req {
    start: u64,
    end: u64,
    ttft: Option<u64>,
    completion: Option<u64>,
    stream: Option<bool>,
    events: Vec<(u64, u64)>,
    curve: Vec<u32>,
    path: String,
}

/// (piece from, to, tokens) per request under a variant.
type Pieces = Vec<(u64, u64, f64)>;

fn replay(reqs: &[Req], pieces: &dyn Fn(&Req) -> Pieces) -> BTreeMap<u32, LevelSums> {
    // Events: (time, kind, idx) kind 0 = end, 1 = first token, 2 = start (ends before starts).
    let mut evs = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        if r.end <= r.start {
            continue;
        }
        evs.push((r.start, 2u8, i));
        evs.push((r.end, 0, i));
        if let Some(ft) = r.events.first().map(|e| e.0) {
            if ft < r.end {
                evs.push((ft, 1, i));
            }
        }
    }
    evs.sort();
    let mut a = LevelAttribution::new(GuardConfig::default(), evs[0].0);
    let mut keys = HashMap::new();
    for (t, k, i) in evs {
        match k {
            2 => {
                keys.insert(i, a.arrive(t));
            }
            1 => a.first_token(t, keys[&i]),
            _ => {
                a.advance(t);
                for (f, to, n) in pieces(&reqs[i]) {
                    a.tokens(f, to, n);
                }
                a.depart(t, keys[&i]);
            }
        }
    }
    a.advance(u64::MAX / 2);
    a.finalize_before(u64::MAX);
    a.sums().clone()
}

fn first(r: &Req) -> Option<u64> {
    r.events.first().map(|e| e.0)
}

fn rest(r: &Req, seen: u64) -> Option<(u64, u64, f64)> {
    let total = r.completion? as f64;
    let left = total - seen as f64;
    if left == 0.0 {
        return None;
    }
    let from = match first(r) {
        Some(_) => r.ttft.unwrap_or(r.start).max(r.start),
        None => r.start + 1_000_000_000,
    };
    Some((from.min(r.end), r.end, left))
}

fn live(r: &Req) -> Pieces {
    let mut out = Vec::new();
    let mut prev = r.start;
    let mut seen = 0;
    for &(t, n) in &r.events {
        out.push((prev, t, n as f64));
        prev = t;
        seen += n;
    }
    out.extend(rest(r, seen));
    out
}

fn today(r: &Req) -> Pieces {
    let from = if first(r).is_some() {
        r.ttft.unwrap_or(r.start)
    } else {
        r.start + 1_000_000_000
    }
    .clamp(r.start, r.end);
    r.completion
        .map(|c| vec![(from, r.end, c as f64)])
        .unwrap_or_default()
}

fn buckets(r: &Req, b: u64) -> (Pieces, Vec<u64>) {
    let mut out = Vec::new();
    let Some(&(ft, n0)) = r.events.first() else {
        return (live(r), vec![]);
    };
    out.push((r.start, ft, n0 as f64));
    let mut counts: Vec<u64> = Vec::new();
    let mut seen = n0;
    for &(t, n) in &r.events[1..] {
        let k = ((t - ft).saturating_sub(1) / b) as usize;
        if counts.len() <= k {
            counts.resize(k + 1, 0);
        }
        counts[k] += n;
        seen += n;
    }
    for (k, &c) in counts.iter().enumerate() {
        if c > 0 {
            let f = ft + k as u64 * b;
            out.push((f, (f + b).min(r.end), c as f64));
        }
    }
    out.extend(rest(r, seen));
    (out, counts)
}

fn shifted(r: &Req, b: u64) -> Pieces {
    let (p, counts) = buckets(r, b);
    if counts.is_empty() {
        return p;
    }
    let ft = r.events[0].0;
    let mut out = vec![p[0]];
    let mut seen = r.events[0].1;
    for (k, &c) in counts.iter().enumerate() {
        if c > 0 {
            let g = b / c;
            let f = (ft + k as u64 * b).saturating_sub(g / 2).max(ft);
            out.push((f, (ft + (k as u64 + 1) * b - g / 2).min(r.end), c as f64));
            seen += c;
        }
    }
    out.extend(rest(r, seen));
    out
}

fn digits_len(v: &[u64]) -> usize {
    v.iter().map(|&c| if c < 10 { 1 } else { 4 }).sum::<usize>() + 2
}

fn json_len(v: &[u64]) -> usize {
    serde_json::to_string(v).unwrap().len()
}

/// Swing-door polyline through the cumulative curve (knots at event points), tolerance `eps`.
fn polyline(r: &Req, eps: f64) -> (Pieces, usize) {
    let Some(&(ft, n0)) = r.events.first() else {
        return (live(r), 0);
    };
    let mut out = vec![(r.start, ft, n0 as f64)];
    // Points (t, cum) after the first event.
    let mut pts = vec![(ft, 0.0f64)];
    let mut cum = 0.0;
    for &(t, n) in &r.events[1..] {
        cum += n as f64;
        pts.push((t, cum));
    }
    let mut knots = vec![pts[0]];
    let mut i = 1;
    while i < pts.len() {
        let a = *knots.last().unwrap();
        // extend as far as all points between fit within eps of the chord
        let mut j = i;
        let mut best = i;
        while j < pts.len() {
            let b = pts[j];
            let ok = pts[i..j].iter().all(|p| {
                let x = if b.0 == a.0 {
                    b.1
                } else {
                    a.1 + (b.1 - a.1) * (p.0 - a.0) as f64 / (b.0 - a.0) as f64
                };
                // compare with the live curve's value at p (the event point itself)
                (x - p.1).abs() <= eps
            });
            if !ok {
                break;
            }
            best = j;
            j += 1;
        }
        knots.push(pts[best]);
        i = best + 1;
    }
    let mut seen = n0;
    for w in knots.windows(2) {
        let n = w[1].1 - w[0].1;
        if n > 0.0 {
            out.push((w[0].0, w[1].0, n));
        }
        seen += n as u64;
    }
    out.extend(rest(r, seen));
    (out, knots.len() - 1)
}

fn poly_bytes(r: &Req, eps: f64) -> usize {
    let (p, _) = polyline(r, eps);
    if r.events.is_empty() {
        return 0;
    }
    let mut v = Vec::new();
    let mut prev = r.events[0].0;
    for &(f, t, n) in &p[1..] {
        if f < r.events[0].0 || t > r.events.last().unwrap().0 {
            continue;
        }
        let _ = f;
        v.push((t - prev + 500_000) / 1_000_000);
        v.push(n as u64);
        prev = t;
    }
    json_len(&v)
}

fn from_curve(r: &Req) -> Pieces {
    if r.curve.is_empty() {
        return live(r);
    }
    let mut out: Pieces = tokenmeter::token_curve::pieces(r.start, &r.curve)
        .map(|p| (p.from, p.to, p.tokens))
        .collect();
    out.extend(rest(r, tokenmeter::token_curve::total(&r.curve)));
    out
}

fn load_reqs(path: &std::path::Path) -> (Vec<Req>, serde_json::Value) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let live: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    let mut open: HashMap<u64, Req> = HashMap::new();
    let mut done = Vec::new();
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let id = v["id"].as_u64().unwrap();
        let t = v["t"].as_u64().unwrap();
        match v["k"].as_str().unwrap() {
            "s" => {
                open.insert(
                    id,
                    Req {
                        start: t,
                        ..Default::default()
                    },
                );
            }
            "t" => {
                if let Some(r) = open.get_mut(&id) {
                    r.events.push((t, v["n"].as_u64().unwrap()));
                }
            }
            _ => {
                if let Some(mut r) = open.remove(&id) {
                    r.end = t;
                    let ts = v["ts"].as_u64().unwrap();
                    r.ttft = v["ttft"].as_f64().map(|ms| ts + (ms * 1e6).round() as u64);
                    r.completion = v["c"].as_u64();
                    r.stream = v["stream"].as_bool();
                    r.curve = serde_json::from_value(v["curve"].clone()).unwrap_or_default();
                    r.path = v["path"].as_str().unwrap_or("").to_string();
                    done.push(r);
                }
            }
        }
    }
    (done, live)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "scratch"]
async fn offline_variants() {
    let path = std::path::PathBuf::from(
        std::env::var("DIAG_FILE").unwrap_or("/tmp/offline_diag.jsonl".into()),
    );
    if !path.exists() {
        let secs = env_u64("DIAG_S", 150);
        let sim = crate::common::start_sim(SimConfig {
            resync_lag_ms: 100.0,
            ..SimConfig::default()
        })
        .await;
        let rec = Arc::new(Rec::default());
        let config = tokenmeter::config::ServeConfig {
            listen: "127.0.0.1:0".into(),
            upstream: format!("http://{}", sim.addr()),
            ..Default::default()
        };
        let proxy = tokenmeter::app::spawn(config, vec![rec.clone() as Arc<dyn Observer>])
            .await
            .unwrap();
        let opts = LoadOptions::agents(
            format!("http://{}", proxy.addr()),
            Arrivals::Agents {
                agents: env_u64("DIAG_AGENTS", 16) as usize,
            },
            tokenmeter::demo::demo_agents(),
            Duration::from_secs(secs),
        );
        tokenmeter::load::run(opts, NoProgress).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let live = stats_now(proxy.meter()).await.capacity_production;
        proxy.shutdown().await;
        sim.shutdown().await;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        writeln!(f, "{}", serde_json::to_string(&live).unwrap()).unwrap();
        let mut evs = rec.0.lock().unwrap().clone();
        evs.sort_by_key(|e| e["t"].as_u64().unwrap());
        for e in evs {
            writeln!(f, "{e}").unwrap();
        }
    }
    let (reqs, live_rows) = load_reqs(&path);
    let streamed = reqs.iter().filter(|r| !r.events.is_empty()).count();
    println!(
        "{} requests, {} with events, mean events {:.1}",
        reqs.len(),
        streamed,
        reqs.iter().map(|r| r.events.len()).sum::<usize>() as f64 / streamed as f64
    );
    let base = replay(&reqs, &live);
    let rate = |s: &LevelSums| s.clean_tokens / (s.clean_ns as f64 / 1e9);
    let mut variants: Vec<(String, BTreeMap<u32, LevelSums>, f64)> = Vec::new();
    variants.push(("today".into(), replay(&reqs, &today), 0.0));
    variants.push(("curve".into(), replay(&reqs, &from_curve), 0.0));
    for r in &reqs {
        if r.events.is_empty() && r.curve.is_empty() {
            continue;
        }
        let seen: u64 = r.events.iter().map(|e| e.1).sum();
        let ct = tokenmeter::token_curve::total(&r.curve);
        let p0 = tokenmeter::token_curve::first_point(r.start, &r.curve);
        let f = r.events.first().map(|e| e.0);
        let dp0 = match (p0, f) {
            (Some(a), Some(b)) => a as i64 - b as i64,
            _ => i64::MAX,
        };
        let dttft = match (r.ttft, f) {
            (Some(a), Some(b)) => a as i64 - b as i64,
            _ => i64::MAX,
        };
        if seen != ct || dp0.abs() > 600_000 || dttft.abs() > 1_000_000 {
            println!(
                "{} events {} seen {seen} curve {ct} completion {:?} p0-first {dp0} ttft-first {dttft} stream {:?}",
                r.path,
                r.events.len(),
                r.completion,
                r.stream
            );
        }
    }
    for b in [] as [u64; 0] {
        let bn = b * 1_000_000;
        let bytes: usize = reqs
            .iter()
            .filter(|r| !r.events.is_empty())
            .map(|r| json_len(&buckets(r, bn).1))
            .sum();
        variants.push((
            format!("b{b}ms"),
            replay(&reqs, &|r| buckets(r, bn).0),
            bytes as f64 / reqs.len() as f64,
        ));
    }
    for b in [] as [u64; 0] {
        let bn = b * 1_000_000;
        let bytes: usize = reqs
            .iter()
            .filter(|r| !r.events.is_empty())
            .map(|r| digits_len(&buckets(r, bn).1))
            .sum();
        variants.push((
            format!("shift{b}ms"),
            replay(&reqs, &|r| shifted(r, bn)),
            bytes as f64 / reqs.len() as f64,
        ));
    }
    for eps in [0.1f64] {
        let knots: usize = reqs.iter().map(|r| poly_bytes(r, eps)).sum();
        variants.push((
            format!("poly{eps}"),
            replay(&reqs, &|r| polyline(r, eps).0),
            knots as f64 / reqs.len() as f64,
        ));
    }
    print!("| N | live s | live tok/s | replay tok/s |");
    for v in &variants {
        print!(" {} ({:.1}) |", v.0, v.2);
    }
    println!();
    for (&n, s) in &base {
        let secs = s.clean_ns as f64 / 1e9;
        if secs < 0.3 {
            continue;
        }
        let lv = live_rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["in_flight"] == n)
            .map(|r| {
                println!("live N={n}: seconds {} guard {} tokens {}; replay seconds {} guard {} tokens {} guard tokens {}", r["seconds"], r["guard_s"], r["tokens"], s.clean_ns as f64 / 1e9, s.guard_ns as f64 / 1e9, s.clean_tokens, s.guard_tokens);
                r["tokens"].as_f64().unwrap() / r["seconds"].as_f64().unwrap()
            });
        print!(
            "| {n} | {secs:.1} | {} | {:.2} |",
            lv.map_or("-".into(), |g| format!("{g:.2}")),
            rate(s)
        );
        for v in &variants {
            let d = v.1.get(&n).map_or(f64::NAN, |x| (rate(x) / rate(s) - 1.0) * 100.0);
            print!(" {d:+.2} |");
        }
        println!();
    }
}
