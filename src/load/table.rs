//! Human-readable markdown tables of a load report.

use std::fmt::Write;

use super::report::{AgentsReport, Arrivals};
use super::report::{BurstReport, LoadReport, RequestFigures, SustainedReport};
use super::stats::ProxyReport;
use super::summary::MinAvgMax;

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.digits$}"))
}

fn mam(s: Option<MinAvgMax>, digits: usize) -> String {
    s.map_or_else(
        || "n/a".into(),
        |s| format!("{:.d$} / {:.d$} / {:.d$}", s.min, s.avg, s.max, d = digits),
    )
}

/// "+113% for 4× users".
fn marginal(pct: Option<f64>, users: Option<f64>) -> String {
    match (pct, users) {
        (Some(p), Some(u)) => {
            let users = format!("{u:.3}");
            let users = users.trim_end_matches('0').trim_end_matches('.');
            format!("{p:+.0}% for {users}× users")
        }
        _ => "–".into(),
    }
}

/// The whole report as text for stdout.
pub fn render(r: &LoadReport) -> String {
    let mut out = String::new();
    // Agent-like load draws each request's max_tokens (and streaming) per request: the line
    // below says so instead of one fixed number.
    let (stream, max_tokens) = match &r.agents {
        Some(a) => (
            format!("{:.0}% streaming", a.spec.stream_share * 100.0),
            format!("max_tokens drawn per request {}", a.spec.output_tokens),
        ),
        None => (
            if r.stream {
                "streaming"
            } else {
                "non-streaming"
            }
            .to_string(),
            format!("max_tokens {}", r.max_tokens),
        ),
    };
    let _ = writeln!(
        out,
        "Target {} · model {} · {stream} · {max_tokens}{}",
        r.base_url,
        r.model,
        if r.ignore_eos { " · ignore_eos" } else { "" }
    );
    if let Some(b) = &r.burst {
        burst(&mut out, b);
    }
    if let Some(s) = &r.sustained {
        sustained(&mut out, s, r.proxy.as_ref());
    }
    if let Some(a) = &r.agents {
        agents(&mut out, a, r.proxy.as_ref());
    }
    out
}

fn burst(out: &mut String, b: &BurstReport) {
    let w = &b.warmup;
    let _ = writeln!(
        out,
        "\nWarm-up (discarded): {} in {:.0} ms, {} tok/s\n",
        if w.ok { "ok" } else { "failed" },
        w.e2e_ms,
        num(w.tok_s, 1)
    );
    let first = b.levels.first().map_or(1, |l| l.level);
    let _ = writeln!(
        out,
        "| Concurrency | Aggregate | Per-request tok/s (min/avg/max) | TTFT ms (min/avg/max) | Wall | Scaling vs {first} | Marginal gain | Failed |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for l in &b.levels {
        let _ = writeln!(
            out,
            "| {} | {} tok/s | {} | {} | {:.2} s | {} | {} | {}/{} |",
            l.level,
            num(l.aggregate_tok_s, 1),
            mam(l.figures.per_request_tok_s, 1),
            mam(l.figures.ttft_ms, 0),
            l.wall_s,
            l.scaling_vs_first
                .map_or_else(|| "n/a".into(), |s| format!("{s:.2}×")),
            marginal(l.marginal_gain_pct, l.users_ratio),
            l.figures.failures,
            l.figures.requests
        );
    }
    let _ = writeln!(
        out,
        "\nAggregate = completion tokens of ok requests / batch wall; per-request = completion tokens / that request's wall; \
         TTFT = send to first event with non-empty choices."
    );
    for l in &b.levels {
        notes(out, &format!("level {}", l.level), &l.figures);
        for f in l.results.iter().filter(|r| !r.ok) {
            let _ = writeln!(
                out,
                "  level {} slot {}: status {} — {}",
                l.level,
                f.slot,
                f.status.map_or_else(|| "none".into(), |s| s.to_string()),
                f.error.as_deref().unwrap_or("")
            );
        }
    }
}

fn notes(out: &mut String, what: &str, f: &RequestFigures) {
    if f.tokens_counted_from_events {
        let _ = writeln!(out, "  {what}: no usage from the server; tokens counted from streamed events (may undercount)");
    }
    if f.tokens_unknown {
        let _ = writeln!(
            out,
            "  {what}: some ok requests had no token count and are left out of the sums"
        );
    }
}

fn sustained(out: &mut String, s: &SustainedReport, proxy: Option<&ProxyReport>) {
    let f = &s.figures;
    let _ = writeln!(
        out,
        "\nSustained: {} in flight for {:.1} s (wall {:.2} s){}\n",
        s.concurrency,
        s.duration_s,
        s.wall_s,
        s.stopped_early
            .as_ref()
            .map_or_else(String::new, |w| format!(" — STOPPED EARLY: {w}"))
    );
    let mut rows = client_rows(s.client_aggregate_tok_s, f);
    rows.insert(
        1,
        (
            "Client aggregate incl. cancelled requests' streamed events",
            format!("{} tok/s", num(s.client_aggregate_incl_partial_tok_s, 1)),
        ),
    );
    rows.push((
        "Completed ok / failed / cancelled at deadline",
        format!(
            "{} / {} / {}",
            f.requests - f.failures,
            f.failures,
            s.cancelled_at_deadline
        ),
    ));
    rows.push(("Max in flight (client)", s.max_in_flight.to_string()));
    client_table(out, "Figure", &rows, "sustained", f);
    if let Some(p) = proxy {
        proxy_windows(out, p, s.client_aggregate_tok_s, s.max_in_flight);
    }
}

/// The rows both client tables start with: the aggregate, per-request tok/s, TTFT and wall.
fn client_rows(aggregate: Option<f64>, f: &RequestFigures) -> Vec<(&'static str, String)> {
    vec![
        (
            "Client aggregate (completed tokens / wall)",
            format!("{} tok/s", num(aggregate, 1)),
        ),
        (
            "Per-request tok/s (min/avg/max)",
            mam(f.per_request_tok_s, 1),
        ),
        ("TTFT ms (min/avg/max)", mam(f.ttft_ms, 0)),
        ("Request wall ms (min/avg/max)", mam(f.e2e_ms, 0)),
    ]
}

/// A two-column table of `rows` under `header`, then the notes on the run's figures.
fn client_table(
    out: &mut String,
    header: &str,
    rows: &[(&str, String)],
    kind: &str,
    f: &RequestFigures,
) {
    let _ = writeln!(out, "| {header} | Value |\n|---|---|");
    for (k, v) in rows {
        let _ = writeln!(out, "| {k} | {v} |");
    }
    notes(out, kind, f);
}

fn agents(out: &mut String, a: &AgentsReport, proxy: Option<&ProxyReport>) {
    let f = &a.figures;
    let how = match a.arrivals {
        Arrivals::Agents { agents } => format!("{agents} agents, think {} ms", a.spec.think_ms),
        Arrivals::Poisson { rate_per_s, .. } => format!("Poisson arrivals, {rate_per_s} /s"),
    };
    let apis = if a.spec.apis.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = a.spec.apis.iter().map(|a| a.as_str()).collect();
        format!("; APIs in turn: {}", names.join(", "))
    };
    let _ = writeln!(
        out,
        "\nAgent-like load: {how}{apis}; prompts {} words, max_tokens {}, {:.0}% streaming; {:.1} s (wall {:.2} s)\n",
        a.spec.prompt_words,
        a.spec.output_tokens,
        a.spec.stream_share * 100.0,
        a.duration_s,
        a.wall_s
    );
    let mut rows = client_rows(a.client_aggregate_tok_s, f);
    rows.push((
        "Completed ok / failed / cancelled at deadline / skipped",
        format!(
            "{} / {} / {} / {}",
            f.requests - f.failures,
            f.failures,
            a.cancelled_at_deadline,
            a.skipped
        ),
    ));
    rows.push(("Max in flight (client)", a.max_in_flight.to_string()));
    let t = &a.sessions;
    if t.sessions > 0 {
        let cached = t
            .cached_tokens
            .map_or_else(|| "not reported".to_string(), |c| c.to_string());
        rows.push((
            "Sessions / turns / calls; cached tokens reported",
            format!("{} / {} / {}; {cached}", t.sessions, t.turns, t.calls),
        ));
    }
    client_table(out, "Client figure", &rows, "agents", f);
    if let Some(p) = proxy {
        proxy_windows(out, p, a.client_aggregate_tok_s, a.max_in_flight);
    }
}

/// The highest level the proxy saw during the run (its windows' max in flight), else the
/// client's own peak.
fn run_peak(p: &ProxyReport, client_peak: usize) -> u32 {
    p.samples
        .iter()
        .filter_map(|s| s.window_10s.as_ref()?.in_flight?.max)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
        .map_or(client_peak as u32, |v| v.round() as u32)
}

/// The proxy's production-traffic capacity table, as `/stats` holds it after the run. It covers
/// everything the proxy saw since it started (earlier runs, other clients), which the title
/// says; levels above this run's peak cannot be this run's and are left out.
fn proxy_capacity(out: &mut String, p: &ProxyReport, peak: u32) {
    let Some(rows) = &p.capacity_production else {
        return;
    };
    let above = rows.iter().filter(|r| r.in_flight > peak).count();
    let _ = writeln!(
        out,
        "\nProxy capacity from production traffic (/stats capacity_production): everything the proxy \
         has seen since it started, not only this run; levels up to this run's peak of {peak} in flight{}:\n\n\
         | Concurrency | Aggregate tok/s | Aggregate ÷ N tok/s | TTFT ms p50/p90 | Clean s |\n|---|---|---|---|---|",
        if above > 0 {
            format!(" ({above} higher levels from other traffic left out)")
        } else {
            String::new()
        }
    );
    for r in rows.iter().filter(|r| r.in_flight <= peak) {
        let agg = if r.thin {
            "thin".to_string()
        } else {
            num(r.gen_tok_s, 1)
        };
        let _ = writeln!(
            out,
            "| {} | {agg} | {} | {} / {} | {:.1} |",
            r.in_flight,
            if r.thin {
                "thin".to_string()
            } else {
                num(r.per_request_tok_s.avg, 1)
            },
            num(r.ttft_ms.p50, 0),
            num(r.ttft_ms.p90, 0),
            r.seconds
        );
    }
}

fn proxy_windows(
    out: &mut String,
    p: &ProxyReport,
    client_aggregate: Option<f64>,
    client_peak: usize,
) {
    let _ = writeln!(out, "\n{}", p.note);
    if !p.detected {
        return;
    }
    let _ = writeln!(out, "\n| t (s) | Proxy 10 s window gen tok/s | Steady | In flight min/max/mean |\n|---|---|---|---|");
    for smp in &p.samples {
        let w = smp.window_10s.as_ref();
        let inf = w.and_then(|w| w.in_flight);
        let _ = writeln!(
            out,
            "| {:.1} | {} | {} | {} / {} / {} |",
            smp.t_s,
            num(w.and_then(|w| w.gen_tok_s), 1),
            w.and_then(|w| w.steady)
                .map_or("n/a", |b| if b { "yes" } else { "no" }),
            num(inf.and_then(|i| i.min), 0),
            num(inf.and_then(|i| i.max), 0),
            num(inf.and_then(|i| i.mean), 1),
        );
    }
    match &p.steady_10s {
        Some(st) => {
            let _ = writeln!(
                out,
                "\nProxy steady 10 s windows: {} tok/s avg over {} (spread {}%) — client aggregate {} tok/s. \
                 The steady windows are the stable number.",
                num(Some(st.gen_tok_s.avg), 1),
                st.gen_tok_s.n,
                num(st.spread_pct, 1),
                num(client_aggregate, 1)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "\nProxy reported no steady 10 s window during the run."
            );
        }
    }
    proxy_capacity(out, p, run_peak(p, client_peak));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_production_table_says_whose_it_is_and_keeps_the_runs_levels() {
        use super::super::stats::{ProxyCapacityRow, ProxyPerRequest, ProxyTtft};
        let row = |n: u32| ProxyCapacityRow {
            in_flight: n,
            seconds: 20.0,
            thin: false,
            gen_tok_s: Some(10.0 * f64::from(n)),
            per_request_tok_s: ProxyPerRequest { avg: Some(10.0) },
            ttft_ms: ProxyTtft::default(),
        };
        let p = ProxyReport {
            detected: true,
            note: String::new(),
            samples: Vec::new(),
            steady_10s: None,
            capacity_production: Some((1..=16).map(row).collect()),
        };
        let mut out = String::new();
        proxy_capacity(&mut out, &p, run_peak(&p, 8));
        assert!(out.contains("not only this run"), "{out}");
        assert!(
            out.contains("(8 higher levels from other traffic left out)"),
            "{out}"
        );
        assert!(
            out.contains("| 8 | 80.0 |") && !out.contains("| 9 |"),
            "{out}"
        );
    }

    #[test]
    fn marginal_reads_like_the_write_up() {
        assert_eq!(marginal(Some(113.2), Some(4.0)), "+113% for 4× users");
        assert_eq!(marginal(Some(-3.0), Some(2.0)), "-3% for 2× users");
        assert_eq!(marginal(Some(10.0), Some(1.5)), "+10% for 1.5× users");
        assert_eq!(marginal(Some(1.0), Some(10.0)), "+1% for 10× users");
        assert_eq!(marginal(None, Some(2.0)), "–");
    }
}
