//! The cross-check over an access log, for `analyze`: the proxy's tokens (replayed from the
//! `request` lines) beside vLLM's counter (the `server_sample` lines) over the same intervals —
//! per steady window, per scrape interval, and over the whole log.

use std::fmt::Write as _;

use serde::Serialize;

use crate::clock::{format_rfc3339_micros, UnixNanos, NANOS_PER_SEC};
use crate::meter::replay::Timeline;

use crate::scrape::crosscheck::{pro_rata, ServerTrack, ServerWindow};
use crate::scrape::sample::ServerSample;

/// One compared interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CrossRow {
    /// Start of the window (or interval), RFC 3339.
    pub start: String,
    /// The same, Unix nanoseconds.
    pub start_ns: UnixNanos,
    /// Length, seconds: from the first to the last sample compared.
    pub seconds: f64,
    /// The in-flight level every second touched by the interval was steady at; `null` when not
    /// steady.
    pub n: Option<u32>,
    /// The comparison over the samples inside (see [`ServerWindow`]).
    pub server: ServerWindow,
}

/// The whole offline cross-check.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CrossReport {
    /// Disagreements beyond this percentage are flagged.
    pub threshold_pct: f64,
    /// `server_sample` lines read.
    pub samples: u64,
    /// Steady windows: from a sample to the first sample at least `window_s` later (minus half
    /// a second of scrape jitter), kept when every second they touch was steady at one N.
    pub steady_windows: Vec<CrossRow>,
    /// Consecutive scrape intervals.
    pub intervals: Vec<CrossRow>,
    /// From the first to the last sample.
    pub overall: Option<CrossRow>,
}

fn proxy_fn(tl: &Timeline) -> impl Fn(UnixNanos, UnixNanos) -> f64 + '_ {
    move |a, b| {
        let range = (a / NANOS_PER_SEC)..b.div_ceil(NANOS_PER_SEC);
        pro_rata(
            tl.seconds.range(range).map(|(s, x)| (*s, x.gen_tokens)),
            a,
            b,
        )
    }
}

/// The level every second of `[from, to)` was steady at, if all were steady at the same N.
fn steady_at(tl: &Timeline, from: u64, to: u64) -> Option<u32> {
    let mut level = None;
    for s in from..to {
        let l = tl.seconds.get(&s)?.steady_level()?;
        if level.is_some_and(|x| x != l) {
            return None;
        }
        level = Some(l);
    }
    level
}

/// Compares `tl` (replayed requests) with `samples` over steady windows of about `window_s`
/// seconds bounded by samples, each scrape interval, and the whole span of the samples. The
/// proxy side comes from replayed records, which spread each request's tokens evenly over its
/// decode time: exact over the whole log, smoothed over short intervals.
pub fn crosscheck_report(
    tl: &Timeline,
    samples: &[ServerSample],
    window_s: u64,
    threshold_pct: f64,
) -> CrossReport {
    let mut track = ServerTrack::new(threshold_pct);
    for s in samples {
        track.push(s.clone());
    }
    let proxy = proxy_fn(tl);
    let sorted: Vec<&ServerSample> = track.samples().collect();
    let steady =
        |a: UnixNanos, b: UnixNanos| steady_at(tl, a / NANOS_PER_SEC, b.div_ceil(NANOS_PER_SEC));
    // Windows run from one sample to the first sample at least `window_s` later (half a
    // second of slack for scrape jitter), so the server's interval is the window itself.
    let mut steady_windows = Vec::new();
    let span = (window_s.max(1) * NANOS_PER_SEC).saturating_sub(NANOS_PER_SEC / 2);
    let mut i = 0;
    while i < sorted.len() {
        let a = sorted[i].ts_ns;
        let Some(j) = (i + 1..sorted.len()).find(|&j| sorted[j].ts_ns.saturating_sub(a) >= span)
        else {
            break;
        };
        let b = sorted[j].ts_ns;
        if let Some(n) = steady(a, b) {
            steady_windows.push(CrossRow {
                start: format_rfc3339_micros(a),
                start_ns: a,
                seconds: (b - a) as f64 / NANOS_PER_SEC as f64,
                n: Some(n),
                server: track.window_with(a, b + 1, &proxy),
            });
        }
        i = j;
    }
    let row = |a: UnixNanos, b: UnixNanos| CrossRow {
        start: format_rfc3339_micros(a),
        start_ns: a,
        seconds: (b - a) as f64 / NANOS_PER_SEC as f64,
        n: steady(a, b),
        // `to` is exclusive: one nanosecond past the closing sample.
        server: track.window_with(a, b + 1, &proxy),
    };
    let intervals = sorted
        .windows(2)
        .filter(|w| w[1].ts_ns > w[0].ts_ns)
        .map(|w| row(w[0].ts_ns, w[1].ts_ns))
        .collect();
    let overall = match (sorted.first(), sorted.last()) {
        (Some(a), Some(b)) if b.ts_ns > a.ts_ns => Some(row(a.ts_ns, b.ts_ns)),
        _ => None,
    };
    CrossReport {
        threshold_pct,
        samples: samples.len() as u64,
        steady_windows,
        intervals,
        overall,
    }
}

fn cell(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.prec$}"))
}

fn flag(w: &ServerWindow) -> &'static str {
    match w.disagreement {
        Some(true) => "DISAGREE",
        Some(false) => "ok",
        None => "-",
    }
}

/// The report as text tables: "proxy window vs server window".
pub fn render_text(r: &CrossReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Cross-check against vLLM's own accounting ({} samples, flag beyond {}%)",
        r.samples, r.threshold_pct
    );
    let table = |out: &mut String, title: &str, rows: &[CrossRow]| {
        let _ = writeln!(out, "\n{title}");
        let _ = writeln!(
            out,
            "{:<28} {:>5} {:>7} {:>14} {:>15} {:>8}  flag",
            "start", "N", "secs", "proxy tok/s", "server tok/s", "diff %"
        );
        for row in rows {
            let s = &row.server;
            let _ = writeln!(
                out,
                "{:<28} {:>5} {:>7} {:>14} {:>15} {:>8}  {}",
                row.start,
                row.n.map_or("-".into(), |n| n.to_string()),
                cell(s.interval_s, 1),
                cell(s.proxy_gen_tok_s, 1),
                cell(s.gen_tok_s, 1),
                s.disagreement_pct
                    .map_or("-".into(), |p| format!("{p:+.2}")),
                flag(s)
            );
        }
    };
    table(
        &mut out,
        "Steady windows (proxy window vs server window, same interval):",
        &r.steady_windows,
    );
    table(&mut out, "Scrape intervals:", &r.intervals);
    if let Some(o) = &r.overall {
        table(
            &mut out,
            "Overall (first to last sample):",
            std::slice::from_ref(o),
        );
    }
    out
}

/// A steady window found elsewhere (e.g. `analyze`'s maximal steady runs): whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SteadySpan {
    /// First second (Unix seconds).
    pub start_sec: u64,
    /// Length, seconds.
    pub seconds: u64,
    /// The level it was steady at.
    pub n: u32,
}

/// For each steady span, vLLM's count over the samples inside `[start, start + seconds)` beside
/// the proxy's over the same `[t_first, t_last]`, read through `proxy(t0, t1)` (tokens
/// attributed to that interval); plus the overall row from the first to the last sample.
pub fn rows_for_spans(
    spans: &[SteadySpan],
    samples: &[ServerSample],
    proxy: impl Fn(UnixNanos, UnixNanos) -> f64,
    threshold_pct: f64,
) -> (Vec<CrossRow>, Option<CrossRow>) {
    let mut track = ServerTrack::new(threshold_pct);
    for s in samples {
        track.push(s.clone());
    }
    let rows = spans
        .iter()
        .map(|sp| {
            let from = sp.start_sec.saturating_mul(NANOS_PER_SEC);
            let to = sp
                .start_sec
                .saturating_add(sp.seconds)
                .saturating_mul(NANOS_PER_SEC);
            CrossRow {
                start: format_rfc3339_micros(from),
                start_ns: from,
                seconds: sp.seconds as f64,
                n: Some(sp.n),
                server: track.window_with(from, to, &proxy),
            }
        })
        .collect();
    let first = track.samples().next().map(|s| s.ts_ns);
    let last = track.samples().last().map(|s| s.ts_ns);
    let overall = match (first, last) {
        (Some(a), Some(b)) if b > a => Some(CrossRow {
            start: format_rfc3339_micros(a),
            start_ns: a,
            seconds: (b - a) as f64 / NANOS_PER_SEC as f64,
            n: None,
            server: track.window_with(a, b + 1, &proxy),
        }),
        _ => None,
    };
    (rows, overall)
}

/// `proxy(t0, t1)` for [`rows_for_spans`] over per-second token sums `(second, tokens)`, sorted.
pub fn pro_rata_over(seconds: &[(u64, f64)]) -> impl Fn(UnixNanos, UnixNanos) -> f64 + '_ {
    move |a, b| {
        let lo = seconds.partition_point(|(s, _)| *s < a / NANOS_PER_SEC);
        let hi = seconds.partition_point(|(s, _)| *s < b.div_ceil(NANOS_PER_SEC));
        pro_rata(seconds[lo..hi].iter().copied(), a, b)
    }
}
