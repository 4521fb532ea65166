//! Turning the two passes into the [`Report`].

use crate::clock::{format_rfc3339_micros, NANOS_PER_SEC};
use crate::meter::capacity::{CapacityAccumulator, CapacityRow, RequestLevel};
use crate::meter::histogram::LogHistogram;
use crate::meter::levels::{production_rows, ProductionRow, RequestFiguresAt};
use crate::meter::replay::{ReplayTimeline, SteadyRun};
use crate::meter::summary::{MinMeanMax, Percentiles};
use crate::record::Outcome;

use super::collect::{LevelTokS, Pass1, Pass2};
use super::input::Source;
use super::report::*;
use super::AnalyzeOptions;

/// The cross-check over the steady runs, the proxy side read pro rata from the timeline.
fn crosscheck(tl: &ReplayTimeline, p: &Pass1, opts: &AnalyzeOptions) -> Option<CrossCheck> {
    use super::crosscheck::{pro_rata_over, rows_for_spans, SteadySpan};
    let subset = !opts.filter.users.is_empty() || !opts.filter.models.is_empty();
    if p.server_samples.is_empty() || subset {
        return None;
    }
    let spans: Vec<SteadySpan> = tl
        .steady_runs(opts.steady_min_s)
        .into_iter()
        .map(|r| SteadySpan {
            start_sec: r.start_sec,
            seconds: r.seconds,
            n: r.in_flight,
        })
        .collect();
    let seconds: Vec<(u64, f64)> = tl
        .seconds
        .iter()
        .map(|s| (s.sec, s.bucket.gen_tokens))
        .collect();
    let threshold = opts.disagreement_threshold_pct;
    let (steady_windows, overall) = rows_for_spans(
        &spans,
        &p.server_samples,
        pro_rata_over(&seconds),
        threshold,
    );
    Some(CrossCheck {
        threshold_pct: threshold,
        samples: p.server_samples.len() as u64,
        steady_windows,
        overall,
    })
}

/// Builds the report from pass 1, the finished timeline and pass 2.
pub fn build(
    sources: &[Source],
    p: Pass1,
    tl: &ReplayTimeline,
    pass2: &Pass2,
    opts: &AnalyzeOptions,
) -> Report {
    let level_tok_s = &pass2.level_tok_s;
    let names: Vec<String> = sources.iter().map(|s| s.name.clone()).collect();
    let bad_lines: u64 = p.counts.bad.values().sum();
    let inputs = Inputs {
        files: names.clone(),
        lines: p.counts.lines,
        request_lines: p.counts.request_lines,
        other_lines: p.counts.other_lines,
        filtered_out: p.counts.filtered_out,
        bad_lines,
        bad_by_reason: p.counts.bad.clone(),
        bad_positions: p
            .counts
            .bad_first
            .iter()
            .map(|&(i, line)| format!("{}:{line}", names[i]))
            .collect(),
        read_errors: p
            .counts
            .read_errors
            .iter()
            .map(|(i, e)| format!("{}: {e}", names[*i]))
            .collect(),
    };
    let crosscheck = crosscheck(tl, &p, opts);
    let summary = summary(&p, bad_lines);
    let timeline = timeline(tl, pass2, opts);
    let capacity = capacity(tl, level_tok_s, &p);
    let capacity_production = production(pass2, &p, opts.capacity_min_s as f64);
    let saturation = saturation(&p, opts, &capacity, &capacity_production);
    let service_level = crate::meter::service_level::service_level_view(
        &opts.slo,
        &pass2.verdicts,
        &pass2.level_sums,
    );
    let users = users(&p);
    let contexts = p
        .users
        .values()
        .flat_map(|u| u.contexts.iter().copied())
        .collect();
    let kv = super::kv::analyze_kv(
        contexts,
        &p.server_samples,
        service_level.capacity.in_flight,
    );
    let apis = apis(&p);
    let cold_starts = ColdStarts {
        count: p.cold_start_count,
        listed: p
            .cold_starts
            .iter()
            .map(|c| ColdStartRow {
                ts: format_rfc3339_micros(c.ts_ns),
                user: c.user.clone(),
                ttft_ms: c.ttft_ms,
                e2e_ms: c.e2e_ms,
            })
            .collect(),
    };
    Report {
        report: "tokenmeter-analyze",
        version: REPORT_VERSION,
        inputs,
        summary,
        timeline,
        capacity,
        capacity_production,
        service_level,
        capacity_production_tokens: p.placement,
        saturation,
        users,
        apis,
        cold_starts,
        crosscheck,
        kv,
        sessions: p.sessions.finish(),
        upstreams: Vec::new(),
        sim_truth: None,
    }
}

fn summary(p: &Pass1, bad_lines: u64) -> Summary {
    let mut models: Vec<ModelCount> = p
        .models
        .iter()
        .map(|(m, &n)| ModelCount {
            model: m.clone(),
            requests: n,
        })
        .collect();
    if p.no_model > 0 {
        models.push(ModelCount {
            model: "(none)".into(),
            requests: p.no_model,
        });
    }
    models.sort_by(|a, b| b.requests.cmp(&a.requests).then(a.model.cmp(&b.model)));
    let by_outcome = Outcome::ALL
        .iter()
        .zip(p.by_outcome)
        .filter(|(_, n)| *n > 0)
        .map(|(o, n)| (o.as_str().to_string(), n))
        .collect();
    let errors = Outcome::ALL
        .iter()
        .zip(p.by_outcome)
        .filter(|(o, _)| o.is_error())
        .map(|(_, n)| n)
        .sum();
    let client_errors = Outcome::ALL
        .iter()
        .zip(p.by_outcome)
        .filter(|(o, _)| **o == Outcome::ClientError)
        .map(|(_, n)| n)
        .sum();
    Summary {
        first_arrival: p.first_arrival.map(format_rfc3339_micros),
        last_end: p.last_end.map(format_rfc3339_micros),
        duration_s: p
            .first_arrival
            .zip(p.last_end)
            .map(|(a, b)| b.saturating_sub(a) as f64 / NANOS_PER_SEC as f64),
        requests: p.by_outcome.iter().sum(),
        generation_requests: p.generation_requests,
        by_outcome,
        errors,
        client_errors,
        users: p.users.len() as u64,
        models,
        prompt_tokens: p.prompt_tokens,
        completion_tokens: p.completion_tokens,
        bad_lines,
    }
}

fn timeline(tl: &ReplayTimeline, pass2: &Pass2, opts: &AnalyzeOptions) -> TimelineReport {
    let tolerance = opts.steady_tolerance_pct;
    let tolerant = |sec: u64| {
        pass2
            .second_mixes
            .get(&sec)
            .and_then(|m| m.steady_level(tolerance))
    };
    // Active: some request was in flight during the second, or tokens were attributed to it (a
    // second that only saw requests end on its first instant is idle).
    let series: Vec<SecondRow> = tl
        .seconds
        .iter()
        .filter(|s| {
            let b = &s.bucket;
            b.in_flight_max > 0 || b.gen_tokens != 0.0 || b.prompt_tokens != 0.0
        })
        .map(|s| {
            let (min, max, mean) = s.bucket.in_flight_complete();
            SecondRow {
                t: s.sec,
                gen_tokens: s.bucket.gen_tokens,
                prompt_tokens: s.bucket.prompt_tokens,
                in_flight_mean: mean,
                in_flight_min: min,
                in_flight_max: max,
                steady: tolerant(s.sec).is_some(),
                steady_strict: s.bucket.steady_level().is_some(),
                started: s.bucket.requests_started,
                finished: s.bucket.requests_finished,
            }
        })
        .collect();
    let windows = |runs: Vec<SteadyRun>| -> Vec<SteadyWindow> {
        runs.into_iter()
            .map(|r| SteadyWindow {
                start: format_rfc3339_micros(r.start_sec * NANOS_PER_SEC),
                seconds: r.seconds,
                in_flight: r.in_flight,
                in_flight_mean: r.in_flight_area / r.seconds as f64,
                gen_tok_s: r.gen_tokens / r.seconds as f64,
            })
            .collect()
    };
    TimelineReport {
        active_seconds: series.len() as u64,
        steady_seconds: series.iter().filter(|s| s.steady).count() as u64,
        steady_tolerance_pct: tolerance,
        steady_strict_seconds: series.iter().filter(|s| s.steady_strict).count() as u64,
        steady_min_s: opts.steady_min_s,
        steady_windows: windows(tl.runs_by(opts.steady_min_s, |s| tolerant(s.sec))),
        steady_strict_windows: windows(tl.steady_runs(opts.steady_min_s)),
        per_second: opts.per_second.then(|| series.clone()),
        series,
    }
}

/// The shared curve: steady seconds from the timeline, per-request min/max from pass 2, and TTFT
/// by arrival level with cold starts excluded (the curve's own definition, gathered in pass 1).
fn capacity(tl: &ReplayTimeline, level_tok_s: &LevelTokS, p: &Pass1) -> Vec<CapacityRow> {
    let mut acc = CapacityAccumulator::new();
    tl.add_seconds_to(&mut acc);
    for (&level, &(min, max)) in level_tok_s {
        for v in [min, max] {
            acc.add_request(&RequestLevel {
                level,
                tok_s: Some(v),
                ttft_ms: None,
                in_flight_at_start: 0,
                cold_start: false,
            });
        }
    }
    let empty = LogHistogram::new();
    let mut rows = acc.rows();
    for row in &mut rows {
        let h = p
            .arrivals
            .get(&row.in_flight)
            .map_or(&empty, |a| &a.ttft_ms);
        row.ttft_ms = Percentiles::of(h);
    }
    rows
}

/// The production-traffic curve: the live meter's level attribution replayed in pass 2, with the
/// per-request figures of the steady curve's sources.
fn production(pass2: &Pass2, p: &Pass1, min_s: f64) -> Vec<ProductionRow> {
    let empty = LogHistogram::new();
    production_rows(&pass2.level_sums, min_s, |n| {
        let extremes = pass2.level_tok_s.get(&n);
        RequestFiguresAt {
            tok_s_min: extremes.map(|e| e.0),
            tok_s_max: extremes.map(|e| e.1),
            ttft_ms: Percentiles::of(p.arrivals.get(&n).map_or(&empty, |a| &a.ttft_ms)),
        }
    })
}

/// The levels the knee may be found at: those of the steady curve with at least `min_s` seconds
/// when there are two or more; else the non-thin levels of the production curve when there are
/// two or more; else every arrival level (the basis is reported).
fn knee_levels(
    capacity: &[CapacityRow],
    production: &[ProductionRow],
    min_s: u64,
) -> (&'static str, Option<Vec<u32>>) {
    let steady: Vec<u32> = capacity
        .iter()
        .filter(|r| r.seconds >= min_s)
        .map(|r| r.in_flight)
        .collect();
    if steady.len() >= 2 {
        return ("steady", Some(steady));
    }
    let prod: Vec<u32> = production
        .iter()
        .filter(|r| !r.thin)
        .map(|r| r.in_flight)
        .collect();
    if prod.len() >= 2 {
        return ("production", Some(prod));
    }
    ("arrivals", None)
}

fn saturation(
    p: &Pass1,
    opts: &AnalyzeOptions,
    capacity: &[CapacityRow],
    production: &[ProductionRow],
) -> Saturation {
    let knee_factor = opts.knee_factor;
    let levels: Vec<SaturationLevel> = p
        .arrivals
        .iter()
        .map(|(&n, a)| SaturationLevel {
            in_flight: n,
            requests: a.requests,
            ttft_ms: Percentiles::of(&a.ttft_ms),
        })
        .collect();
    let (basis, allowed) = knee_levels(capacity, production, opts.capacity_min_s);
    let eligible: Vec<&SaturationLevel> = levels
        .iter()
        .filter(|l| allowed.as_ref().is_none_or(|a| a.contains(&l.in_flight)))
        .collect();
    let base = eligible
        .iter()
        .find_map(|l| l.ttft_ms.p90.map(|v| (l.in_flight, v)));
    let knee = base.and_then(|(bn, bv)| {
        eligible.iter().find_map(|l| match l.ttft_ms.p90 {
            Some(v) if l.in_flight > bn && v > knee_factor * bv => Some(Knee {
                in_flight: l.in_flight,
                ttft_p90_ms: v,
                baseline_in_flight: bn,
                baseline_ttft_p90_ms: bv,
            }),
            _ => None,
        })
    });
    Saturation {
        knee_factor,
        knee_basis: basis,
        capacity_min_s: opts.capacity_min_s,
        levels,
        knee,
    }
}

fn apis(p: &Pass1) -> Vec<ApiRow> {
    let total: u64 = p.apis.values().map(|a| a.completion_tokens).sum();
    p.apis
        .iter()
        .map(|(api, a)| {
            let some = a.tok_s.count > 0;
            ApiRow {
                api: api.as_str(),
                requests: a.requests,
                errors: a.errors,
                prompt_tokens: a.prompt_tokens,
                completion_tokens: a.completion_tokens,
                tok_s: MinMeanMax {
                    min: some.then_some(a.tok_s.min),
                    mean: a.tok_s.mean(),
                    max: some.then_some(a.tok_s.max),
                },
                ttft_ms: Percentiles::of(&a.ttft_ms),
                share_pct: (total > 0).then(|| 100.0 * a.completion_tokens as f64 / total as f64),
            }
        })
        .collect()
}

fn users(p: &Pass1) -> Vec<UserRow> {
    let total: u64 = p.users.values().map(|u| u.completion_tokens).sum();
    let mut rows: Vec<UserRow> = p
        .users
        .iter()
        .map(|(name, u)| {
            let some = u.tok_s.count > 0;
            UserRow {
                user: name.clone(),
                requests: u.requests,
                generation_requests: u.generation_requests,
                completion_tokens: u.completion_tokens,
                tok_s: MinMeanMax {
                    min: some.then_some(u.tok_s.min),
                    mean: u.tok_s.mean(),
                    max: some.then_some(u.tok_s.max),
                },
                ttft_p50_ms: u.ttft_ms.percentile(0.5),
                ttft_p90_ms: u.ttft_ms.percentile(0.9),
                share_pct: (total > 0).then(|| 100.0 * u.completion_tokens as f64 / total as f64),
                contexts: {
                    let mut v = u.contexts.clone();
                    let max = v.iter().copied().max();
                    crate::meter::kv::ContextView::of(&mut v, max)
                },
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        b.completion_tokens
            .cmp(&a.completion_tokens)
            .then(a.user.cmp(&b.user))
    });
    rows
}
