//! The human report: aligned Markdown-style tables, one section per concern.

use std::fmt::Write;

use crate::meter::capacity::CapacityRow;

use super::report::Report;

pub use super::grid::{grid, num, table, Grid};

/// "+113% for 4× users": the marginal gain of `row` over the previous row `prev_n`.
pub fn marginal_text(row: &CapacityRow, prev_n: Option<u32>) -> String {
    match (row.marginal_gain, prev_n) {
        (Some(g), Some(p)) if p > 0 => {
            let ratio = row.in_flight as f64 / p as f64;
            let r = if ratio.fract() == 0.0 {
                format!("{ratio:.0}")
            } else {
                format!("{ratio:.1}")
            };
            format!("{:+.0}% for {r}× users", g * 100.0)
        }
        _ => "—".to_string(),
    }
}

/// The capacity rows as table cells; a row with fewer than `min_s` steady seconds is marked
/// `(thin)` in its last cell (too little time to conclude from).
pub fn capacity_rows(rows: &[CapacityRow], min_s: u64) -> Vec<Vec<String>> {
    let mut prev = None;
    rows.iter()
        .map(|r| {
            let p = &r.per_request_tok_s;
            let t = &r.ttft_ms;
            let cells = vec![
                r.in_flight.to_string(),
                format!(
                    "{} ± {} tok/s",
                    num(Some(r.gen_tok_s.mean), 1),
                    num(r.gen_tok_s.stdev, 1)
                ),
                format!(
                    "{} / {} / {}",
                    num(p.min, 1),
                    num(Some(p.avg), 1),
                    num(p.max, 1)
                ),
                format!("{} / {} / {}", num(t.p50, 0), num(t.p90, 0), num(t.p99, 0)),
                r.scaling.map_or("—".into(), |s| format!("{s:.1}×")),
                marginal_text(r, prev),
                if r.seconds < min_s {
                    format!("{} (thin)", r.seconds)
                } else {
                    r.seconds.to_string()
                },
            ];
            prev = Some(r.in_flight);
            cells
        })
        .collect()
}

/// Headers of the capacity table.
pub const CAPACITY_HEADERS: [&str; 7] = [
    "Concurrency",
    "Aggregate (mean ± sd)",
    // The middle figure is each request's share of the aggregate, not the mean of the requests'
    // own rates: it can sit above the fastest request (their rates count their prefill too).
    "Per-request tok/s: min / aggregate ÷ N / max",
    "TTFT ms (p50/p90/p99)",
    "Scaling",
    "Marginal gain",
    "Steady s",
];

/// The production-traffic rows as table cells (thin rows show their time base, no rate).
pub fn production_rows(rows: &[crate::meter::levels::ProductionRow]) -> Vec<Vec<String>> {
    let mut prev = None;
    rows.iter()
        .map(|r| {
            let p = &r.per_request_tok_s;
            let t = &r.ttft_ms;
            let (agg, unguarded) = if r.thin {
                ("thin".to_string(), "thin".to_string())
            } else {
                (
                    format!("{} tok/s", num(r.gen_tok_s, 1)),
                    format!("{} tok/s", num(r.gen_tok_s_unguarded, 1)),
                )
            };
            let marginal = match (r.marginal_gain, prev) {
                (Some(g), Some(pn)) if pn > 0 => {
                    let ratio = r.in_flight as f64 / pn as f64;
                    let x = if ratio.fract() == 0.0 {
                        format!("{ratio:.0}")
                    } else {
                        format!("{ratio:.1}")
                    };
                    format!("{:+.0}% for {x}× users", g * 100.0)
                }
                _ => "—".to_string(),
            };
            if !r.thin {
                prev = Some(r.in_flight);
            }
            vec![
                r.in_flight.to_string(),
                agg,
                format!("{} / {} / {}", num(p.min, 1), num(p.avg, 1), num(p.max, 1)),
                format!("{} / {} / {}", num(t.p50, 0), num(t.p90, 0), num(t.p99, 0)),
                r.scaling.map_or("—".into(), |s| format!("{s:.1}×")),
                marginal,
                format!("{:.1}", r.seconds),
                format!("{:.1}", r.guard_s),
                unguarded,
            ]
        })
        .collect()
}

/// Which tokens the production curve placed as live and which it spread.
fn placement(p: &super::report::TokenPlacement) -> String {
    let mut s = format!(
        "{} requests' tokens placed by their token_curve, as live",
        p.token_curve
    );
    if p.spread > 0 {
        s += &format!(
            "; {} without token_curve spread over [TTFT, end], which reads low where arrivals are frequent",
            p.spread
        );
    }
    s
}

/// Headers of the production-traffic table.
pub const PRODUCTION_HEADERS: [&str; 9] = [
    "Concurrency",
    "Aggregate",
    // The middle figure is each request's share of the aggregate, not the mean of the requests'
    // own rates: it can sit above the fastest request (their rates count their prefill too).
    "Per-request tok/s: min / aggregate ÷ N / max",
    "TTFT ms (p50/p90/p99)",
    "Scaling",
    "Marginal gain",
    "Clean s",
    "Guard s",
    "Aggregate incl. guard",
];

/// Every section as (title, cells).
pub fn sections(r: &Report) -> Vec<(String, Grid)> {
    let s = &r.summary;
    let i = &r.inputs;
    let mut out = Vec::new();
    let outcomes = s
        .by_outcome
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ");
    let models = s
        .models
        .iter()
        .map(|m| format!("{} ({})", m.model, m.requests))
        .collect::<Vec<_>>()
        .join(", ");
    let mut bad = i.bad_lines.to_string();
    if !i.bad_positions.is_empty() {
        let _ = write!(bad, " (first at {})", i.bad_positions.join(", "));
    }
    let summary = vec![
        vec![
            "Period".into(),
            format!(
                "{} → {} ({} s)",
                s.first_arrival.as_deref().unwrap_or("—"),
                s.last_end.as_deref().unwrap_or("—"),
                num(s.duration_s, 1)
            ),
        ],
        vec![
            "Requests".into(),
            format!(
                "{} ({} generation): {outcomes}",
                s.requests, s.generation_requests
            ),
        ],
        vec![
            "Errors".into(),
            format!(
                "{} of the server (upstream_error, upstream_aborted, timeout, proxy_error); {} the client's own (client_error: its request refused)",
                s.errors, s.client_errors
            ),
        ],
        vec!["Users".into(), s.users.to_string()],
        vec!["Models".into(), models],
        vec![
            "Tokens".into(),
            format!(
                "prompt {}, completion {}",
                s.prompt_tokens, s.completion_tokens
            ),
        ],
        vec![
            "Lines".into(),
            format!(
                "{} read, {} requests, {} other, {} filtered out",
                i.lines, i.request_lines, i.other_lines, i.filtered_out
            ),
        ],
        vec!["Bad lines".into(), bad],
    ];
    let mut summary = summary;
    for e in &i.read_errors {
        summary.push(vec!["Read error".into(), e.clone()]);
    }
    out.extend(super::service_table::sections(&r.service_level));
    if let Some(t) = &r.sim_truth {
        out.push(super::service_table::against_truth(&r.service_level, t));
    }
    out.push(("Summary".into(), grid(&["", ""], &summary)));
    let t = &r.timeline;
    out.push((
        format!(
            "Steady windows (≥ {} s, mean |level − N| ≤ {} % of N; {} active s, {} steady s)",
            t.steady_min_s, t.steady_tolerance_pct, t.active_seconds, t.steady_seconds
        ),
        grid(&WINDOW_HEADERS, &window_rows(&t.steady_windows)),
    ));
    out.push((
        format!(
            "Strictly steady windows (≥ {} s, level constant; {} strictly steady s)",
            t.steady_min_s, t.steady_strict_seconds
        ),
        grid(&WINDOW_HEADERS, &window_rows(&t.steady_strict_windows)),
    ));
    out.push((
        "Capacity, steady-window curve (steady seconds only; the cross-check by the write-up's method)".into(),
        grid(
            &CAPACITY_HEADERS,
            &capacity_rows(&r.capacity, r.saturation.capacity_min_s),
        ),
    ));
    out.push((
        format!(
            "Capacity, production-traffic curve (the service level's: all clean time at each level, guard after each arrival until its first token; {})",
            placement(&r.capacity_production_tokens)
        ),
        grid(&PRODUCTION_HEADERS, &production_rows(&r.capacity_production)),
    ));
    for u in &r.upstreams {
        out.push((
            format!(
                "Capacity of upstream {} ({} requests; N is its own in-flight level)",
                u.upstream, u.requests
            ),
            grid(
                &CAPACITY_HEADERS,
                &capacity_rows(&u.capacity, r.saturation.capacity_min_s),
            ),
        ));
    }
    let knee = r.saturation.knee.as_ref();
    let sat: Vec<Vec<String>> = r
        .saturation
        .levels
        .iter()
        .map(|l| {
            let mark = if knee.is_some_and(|k| k.in_flight == l.in_flight) {
                "← knee"
            } else {
                ""
            };
            vec![
                l.in_flight.to_string(),
                l.requests.to_string(),
                num(l.ttft_ms.p50, 0),
                num(l.ttft_ms.p90, 0),
                num(l.ttft_ms.p99, 0),
                mark.into(),
            ]
        })
        .collect();
    let knee_title = match knee {
        Some(k) => format!(
            "Saturation (knee at {} in flight: TTFT p90 {:.0} ms > {} × {:.0} ms at {})",
            k.in_flight,
            k.ttft_p90_ms,
            r.saturation.knee_factor,
            k.baseline_ttft_p90_ms,
            k.baseline_in_flight
        ),
        None => format!("Saturation (no knee at {} ×)", r.saturation.knee_factor),
    };
    let knee_title = format!("{knee_title}; levels: {}", r.saturation.knee_basis);
    out.push((
        knee_title,
        grid(
            &[
                "In flight at arrival",
                "Requests",
                "TTFT p50",
                "p90",
                "p99",
                "Knee",
            ],
            &sat,
        ),
    ));
    let users: Vec<Vec<String>> = r
        .users
        .iter()
        .map(|u| {
            vec![
                u.user.clone(),
                u.requests.to_string(),
                u.completion_tokens.to_string(),
                format!(
                    "{} ({} – {})",
                    num(u.tok_s.mean, 1),
                    num(u.tok_s.min, 1),
                    num(u.tok_s.max, 1)
                ),
                format!("{} / {}", num(u.ttft_p50_ms, 0), num(u.ttft_p90_ms, 0)),
                u.share_pct.map_or("—".into(), |p| format!("{p:.1}%")),
            ]
        })
        .collect();
    out.push((
        "Per user".into(),
        grid(
            &[
                "User",
                "Requests",
                "Completion tokens",
                "tok/s mean (min – max)",
                "TTFT p50/p90 ms",
                "Share",
            ],
            &users,
        ),
    ));
    let apis: Vec<Vec<String>> = r
        .apis
        .iter()
        .map(|a| {
            vec![
                a.api.to_string(),
                a.requests.to_string(),
                a.errors.to_string(),
                a.prompt_tokens.to_string(),
                a.completion_tokens.to_string(),
                format!(
                    "{} ({} – {})",
                    num(a.tok_s.mean, 1),
                    num(a.tok_s.min, 1),
                    num(a.tok_s.max, 1)
                ),
                format!(
                    "{} / {} / {}",
                    num(a.ttft_ms.p50, 0),
                    num(a.ttft_ms.p90, 0),
                    num(a.ttft_ms.p99, 0)
                ),
                a.share_pct.map_or("—".into(), |p| format!("{p:.1}%")),
            ]
        })
        .collect();
    out.push((
        "Per API".into(),
        grid(
            &[
                "API",
                "Requests",
                "Errors",
                "Prompt tokens",
                "Completion tokens",
                "tok/s mean (min – max)",
                "TTFT p50/p90/p99 ms",
                "Share",
            ],
            &apis,
        ),
    ));
    let cold: Vec<Vec<String>> = r
        .cold_starts
        .listed
        .iter()
        .map(|c| {
            vec![
                c.ts.clone(),
                c.user.clone(),
                num(c.ttft_ms, 0),
                num(c.e2e_ms, 0),
            ]
        })
        .collect();
    out.push((
        format!(
            "Cold starts ({}; kept out of the curve's TTFT)",
            r.cold_starts.count
        ),
        grid(&["Arrival", "User", "TTFT ms", "E2E ms"], &cold),
    ));
    out.extend(super::sessions::sections(&r.sessions));
    if let Some(c) = &r.crosscheck {
        out.push((
            format!(
                "Proxy window vs server window ({} vLLM samples; flagged beyond {}%)",
                c.samples, c.threshold_pct
            ),
            grid(
                &[
                    "Start",
                    "N",
                    "Compared s",
                    "Proxy tok/s",
                    "Server tok/s",
                    "Difference %",
                    "Flag",
                ],
                &crosscheck_rows(c),
            ),
        ));
    }
    out
}

/// Columns of the steady-window tables.
const WINDOW_HEADERS: [&str; 5] = [
    "Start",
    "Length s",
    "Running N",
    "Mean in flight",
    "Gen tok/s",
];

/// Steady windows as cells.
fn window_rows(windows: &[super::report::SteadyWindow]) -> Vec<Vec<String>> {
    windows
        .iter()
        .map(|w| {
            vec![
                w.start.clone(),
                w.seconds.to_string(),
                w.in_flight.to_string(),
                format!("{:.2}", w.in_flight_mean),
                format!("{:.1}", w.gen_tok_s),
            ]
        })
        .collect()
}

/// The cross-check rows as cells: each steady window, then the overall row (N `all`).
fn crosscheck_rows(c: &super::report::CrossCheck) -> Vec<Vec<String>> {
    c.steady_windows
        .iter()
        .chain(c.overall.as_ref())
        .map(|row| {
            let s = &row.server;
            let flag = match s.disagreement {
                Some(true) => "DISAGREE",
                Some(false) => "ok",
                None => "—",
            };
            vec![
                row.start.clone(),
                row.n.map_or("all".into(), |n| n.to_string()),
                num(s.interval_s, 1),
                num(s.proxy_gen_tok_s, 1),
                num(s.gen_tok_s, 1),
                s.disagreement_pct
                    .map_or("—".into(), |p| format!("{p:+.2}")),
                flag.into(),
            ]
        })
        .collect()
}

/// The whole human report.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    for (title, g) in sections(r) {
        let _ = writeln!(out, "## {title}\n\n{}", table(&g.headers, &g.rows));
    }
    out
}
