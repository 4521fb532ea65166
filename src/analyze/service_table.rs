//! The report's first section: capacity at the service level, and the per-level table it rests on.

use crate::meter::service_level::{ServiceLevelRow, ServiceLevelView};

use super::grid::{grid, num, Grid};

const HEADERS: [&str; 11] = [
    "N",
    "judged",
    "met",
    "attainment % [95 % CI]",
    "missed ttft / pace / both / e2e / error",
    "clean s",
    "aggregate tok/s ± 95 %",
    "per-request tok/s",
    "model per-request tok/s [95 % band]",
    "goodput tok/s",
    "thin",
];

/// The section's title: the headline, what binds, the objective and which curve it is.
pub fn title(v: &ServiceLevelView) -> String {
    format!(
        "Capacity at the service level: {} (production-traffic curve; objective: {})",
        v.capacity.text, v.objective_text
    )
}

fn interval(ci: Option<[f64; 2]>, decimals: usize) -> String {
    match ci {
        Some([lo, hi]) => format!(
            "[{} – {}]",
            num(Some(lo), decimals),
            num(Some(hi), decimals)
        ),
        None => "—".into(),
    }
}

fn row(r: &ServiceLevelRow) -> Vec<String> {
    let m = &r.missed;
    vec![
        r.in_flight.to_string(),
        r.requests.to_string(),
        r.met.to_string(),
        match r.attainment_pct {
            Some(a) => format!("{} {}", num(Some(a), 1), interval(r.attainment_ci_pct, 1)),
            None => "—".into(),
        },
        format!(
            "{} / {} / {} / {} / {}",
            m.ttft, m.pace, m.ttft_pace, m.e2e, m.error
        ),
        num(Some(r.seconds), 1),
        match (r.gen_tok_s, r.gen_tok_s_ci) {
            (Some(g), Some(ci)) => format!("{} ± {}", num(Some(g), 1), num(Some(ci), 1)),
            (g, _) => num(g, 1),
        },
        num(r.per_request_tok_s, 1),
        match r.model_per_request_tok_s {
            Some(p) => format!("{} {}", num(Some(p), 1), interval(r.model_band_tok_s, 1)),
            None => "—".into(),
        },
        num(r.goodput_tok_s, 1),
        if r.thin { "thin" } else { "" }.into(),
    ]
}

/// The per-level table, then the decode-step model it is compared with.
pub fn sections(v: &ServiceLevelView) -> Vec<(String, Grid)> {
    let rows: Vec<Vec<String>> = v.levels.iter().map(row).collect();
    let model_rows = match &v.model {
        Some(m) => vec![
            vec![
                "decode step τ(N)".into(),
                format!("{:.2} + {:.3} × N ms", m.a_ms, m.b_ms),
            ],
            vec![
                "fitted to".into(),
                format!(
                    "{} levels, {:.0} clean s, N {}–{} (outside: extrapolated)",
                    m.levels, m.seconds, m.range[0], m.range[1]
                ),
            ],
            vec![
                "its pace limit".into(),
                m.pace_capacity.map_or_else(
                    || "below 1 in flight".to_string(),
                    |n| format!("{n} in flight"),
                ),
            ],
        ],
        None => vec![vec![
            "none".into(),
            v.model_reason.clone().unwrap_or_default(),
        ]],
    };
    vec![
        (title(v), grid(&HEADERS, &rows)),
        (
            "Decode-step model (per-request pace = 1000 / τ(N) tok/s)".into(),
            grid(&["", ""], &model_rows),
        ),
    ]
}

/// The log's verdicts per level beside the simulator's own (`--sim-truth`): judged, met and
/// attainment in each, and the difference in points.
pub fn against_truth(log: &ServiceLevelView, t: &super::report::SimTruth) -> (String, Grid) {
    fn by_level(v: &ServiceLevelView) -> std::collections::BTreeMap<u32, &ServiceLevelRow> {
        v.levels
            .iter()
            .filter(|r| r.requests > 0)
            .map(|r| (r.in_flight, r))
            .collect()
    }
    let (mine, truth) = (by_level(log), by_level(&t.service_level));
    let levels: std::collections::BTreeSet<u32> =
        mine.keys().chain(truth.keys()).copied().collect();
    let cells = |r: Option<&&ServiceLevelRow>| match r {
        Some(r) => format!(
            "{} / {}{} {}",
            r.requests,
            r.met,
            if r.thin { " (thin)" } else { "" },
            num(r.attainment_pct, 1)
        ),
        None => "—".into(),
    };
    let rows: Vec<Vec<String>> = levels
        .iter()
        .map(|n| {
            let (m, s) = (mine.get(n), truth.get(n));
            let diff = match (
                m.and_then(|r| r.attainment_pct),
                s.and_then(|r| r.attainment_pct),
            ) {
                (Some(a), Some(b)) => format!("{:+.1}", a - b),
                _ => "—".into(),
            };
            vec![n.to_string(), cells(m), cells(s), diff]
        })
        .collect();
    (
        format!(
            "Against the simulator's truth ({} requests in {}): this log {}; the simulator's own \
             account {}",
            t.requests, t.file, log.capacity.text, t.service_level.capacity.text
        ),
        grid(
            &[
                "N",
                "this log: judged / met, attainment %",
                "simulator: judged / met, attainment %",
                "difference, points",
            ],
            &rows,
        ),
    )
}
