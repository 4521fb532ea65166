//! Deterministic synthetic access logs for tests, benches and timing runs.

use std::io::{self, Write};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::clock::{format_rfc3339_micros, UnixNanos, NANOS_PER_SEC};
use crate::record::{DerivedRates, Outcome, RequestRecord};

/// 2026-11-29T18:00:00Z, a whole second.
pub const T0: UnixNanos = 1_795_975_200 * NANOS_PER_SEC;

/// A successful generation record with rates derived from the given figures.
pub fn record(
    start: UnixNanos,
    e2e_ms: f64,
    ttft_ms: Option<f64>,
    completion: u64,
    stream: bool,
    user: &str,
) -> RequestRecord {
    let rates = DerivedRates::compute(ttft_ms, Some(e2e_ms), Some(completion));
    // The fields a record needs for analyze; the rest as an empty line has them.
    RequestRecord {
        ts: format_rfc3339_micros(start),
        ts_ns: start,
        request_id: format!("req-{start}"),
        user: user.into(),
        model: Some("tiny-llama".into()),
        method: "POST".into(),
        status: Some(200),
        stream: Some(stream),
        prompt_tokens: Some(12),
        completion_tokens: Some(completion),
        first_byte_ms: ttft_ms,
        ttft_ms,
        e2e_ms: Some(e2e_ms),
        tpot_ms: rates.tpot_ms,
        tok_s: rates.tok_s,
        decode_tok_s: rates.decode_tok_s,
        in_flight_at_start: 1,
        finish_reason: Some("length".into()),
        bytes_in: 200,
        bytes_out: 4000,
        ..super::parse::scratch_record()
    }
}

/// Three back-to-back steady phases from [`T0`], all non-streamed (tokens spread evenly over each
/// life, so every second of a phase gets the same count):
/// 120 s at N = 1 (70 tok/s: four 30 s requests of 2100 tokens; the first a cold start with a
/// 5 s TTFT), 120 s at N = 4 (150 tok/s: 4 lanes of four 30 s requests of 1125 tokens) and 120 s
/// at N = 16 (350 tok/s: 16 requests of 120 s and 2625 tokens). TTFT is 100 ms x the arrival
/// level; users are `lane-<i>`.
pub fn steady_phases() -> Vec<RequestRecord> {
    let mut out = Vec::new();
    let phases: [(u64, u32, u64, u64); 3] =
        [(0, 1, 30, 2100), (120, 4, 30, 1125), (240, 16, 120, 2625)];
    for (phase_start, n, len_s, tokens) in phases {
        for k in 0..(120 / len_s) {
            for lane in 0..n {
                let start = T0 + (phase_start + k * len_s) * NANOS_PER_SEC;
                // The first wave arrives one by one; later ones replace a finished request.
                let level = if k == 0 { lane + 1 } else { n };
                let cold = phase_start == 0 && k == 0;
                let ttft = if cold { 5000.0 } else { 100.0 * level as f64 };
                let user = format!("lane-{lane}");
                let mut r = record(start, len_s as f64 * 1e3, Some(ttft), tokens, false, &user);
                r.in_flight_at_start = level;
                r.cold_start = cold;
                out.push(r);
            }
        }
    }
    out
}

/// Writes `lines` pseudo-random but deterministic (seeded) lines starting at [`T0`]: segments of
/// 60-300 s, each with a concurrency N in 1..=32 held by N lanes of back-to-back streamed requests
/// (2-20 s, TTFT growing with N, decode at 1000 / (12 + 2 N) tok/s), 20 users, 2% errors, and
/// one `server_sample` line in 500. Lines come lane by lane, not in time order. Returns the bytes
/// written.
pub fn write_load_log(out: &mut impl Write, lines: usize, seed: u64) -> io::Result<u64> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut written = 0u64;
    let mut segment_start = T0;
    let mut count = 0usize;
    let mut first = true;
    while count < lines {
        let seg_len = rng.gen_range(60..=300) * NANOS_PER_SEC;
        let n: u32 = rng.gen_range(1..=32);
        let per_request_tok_s = 1000.0 / (12.0 + 2.0 * n as f64);
        for lane in 0..n {
            let mut t = segment_start + rng.gen_range(0..NANOS_PER_SEC / 2);
            while t < segment_start + seg_len && count < lines {
                count += 1;
                if count % 500 == 0 {
                    let line = format!(
                        "{{\"type\":\"server_sample\",\"schema\":1,\"ts_ns\":{t},\"running\":{n}}}\n"
                    );
                    out.write_all(line.as_bytes())?;
                    written += line.len() as u64;
                    continue;
                }
                let e2e = rng.gen_range(2_000.0..20_000.0);
                let ttft = rng.gen_range(30.0..(60.0 + 15.0 * n as f64));
                let tokens = (((e2e - ttft) / 1e3) * per_request_tok_s) as u64 + 1;
                let user = format!("user-{}", (lane * 7 + rng.gen_range(0..3)) % 20);
                let mut r = record(t, e2e, Some(ttft), tokens, true, &user);
                r.in_flight_at_start = n;
                r.cold_start = std::mem::take(&mut first);
                if rng.gen_ratio(1, 50) {
                    r.outcome = Outcome::UpstreamError;
                    r.status = Some(500);
                    r.completion_tokens = None;
                    r.tok_s = None;
                }
                let line = r.to_json_line();
                out.write_all(&line)?;
                written += line.len() as u64;
                t += (e2e * 1e6) as u64;
            }
        }
        segment_start += seg_len + 5 * NANOS_PER_SEC;
    }
    Ok(written)
}

/// Writes `requests` pseudo-random but deterministic (seeded) agent-like request lines from [`T0`],
/// spread round-robin over `outs` (one log per proxy, each in its own order of finish): 12 agents
/// that think 0.2-3 s between turns; 70 % streamed with a first token after 0.05-1.5 s (one in 20
/// after up to 4 s, so the guard's cap grows), 20-300 tokens one or a few per event at 25-45 ms
/// with one gap in 20 stalled 150-400 ms (another request's prefill), and the token curve the
/// proxy logs, left out of one streamed line in 10 (a line written before it); the others
/// non-streamed; 2 % errors without a usage. Each line carries its verdict against `slo`
/// (`slo_ok`, `slo_miss`), as the proxy judges it. Returns the bytes written.
pub fn write_agents_logs(
    outs: &mut [&mut dyn Write],
    requests: usize,
    seed: u64,
    slo: &crate::slo::SloConfig,
) -> io::Result<u64> {
    const MS: u64 = 1_000_000;
    const AGENTS: u64 = 12;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut next: Vec<UnixNanos> = (0..AGENTS)
        .map(|_| T0 + rng.gen_range(0..2_000) * MS)
        .collect();
    let mut per_out: Vec<Vec<(UnixNanos, RequestRecord)>> =
        outs.iter().map(|_| Vec::new()).collect();
    for i in 0..requests {
        // The agent whose turn comes first.
        let (lane, &start) = next
            .iter()
            .enumerate()
            .min_by_key(|(_, t)| **t)
            .unwrap_or((0, &T0));
        let stream = rng.gen_bool(0.7);
        let ttft_ms = if rng.gen_ratio(1, 20) {
            rng.gen_range(1_500..4_000)
        } else {
            rng.gen_range(50..1_500)
        };
        let tokens: u64 = rng.gen_range(20..300);
        let mut curve = crate::token_curve::TokenCurveBuilder::new(start);
        let first = start + ttft_ms * MS + rng.gen_range(0..MS);
        let mut t = first;
        let mut sent = 0;
        while sent < tokens {
            let n = (tokens - sent).min(if rng.gen_ratio(1, 10) { 3 } else { 1 });
            curve.push(t, n);
            sent += n;
            let stall = if rng.gen_ratio(1, 20) {
                rng.gen_range(150..400)
            } else {
                0
            };
            t += (rng.gen_range(25..45) + stall) * MS + rng.gen_range(0..MS);
        }
        let end = t + 2 * MS;
        let e2e_ms = (end - start) as f64 / 1e6;
        let mut r = record(
            start,
            e2e_ms,
            stream.then_some((first - start) as f64 / 1e6),
            tokens,
            stream,
            &format!("agent-{lane}"),
        );
        r.request_id = format!("req-{i}");
        r.token_curve = curve.finish().filter(|_| stream && !rng.gen_ratio(1, 10));
        if rng.gen_ratio(1, 50) {
            r.outcome = Outcome::UpstreamError;
            r.status = Some(500);
            r.completion_tokens = None;
            r.tok_s = None;
        }
        r.judge(slo);
        next[lane] = end + rng.gen_range(200..3_000) * MS;
        let k = i % per_out.len().max(1);
        if let Some(v) = per_out.get_mut(k) {
            v.push((end, r));
        }
    }
    let mut written = 0;
    for (out, mut recs) in outs.iter_mut().zip(per_out) {
        recs.sort_by_key(|(end, _)| *end);
        for (_, r) in recs {
            let line = r.to_json_line();
            out.write_all(&line)?;
            written += line.len() as u64;
        }
    }
    Ok(written)
}
