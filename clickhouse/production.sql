-- analyze's production-traffic curve (docs/capacity.md, "Production-traffic curve", `capacity_production`
-- in `analyze --json` and `/stats`): per level N with time at it, the clean and guarded seconds
-- (tm_production_levels), the clean tokens, the aggregate rate (the per-request pace of
-- tm_production_paces × N: the service-level table's, docs/service-level.md), every token over
-- all the time at N, and the figures of the capacity table's sources: min/max tok/s of
-- requests whose life level rounds to N, TTFT percentiles (nearest rank) of requests that arrived
-- at N (cold starts excluded). Levels under 10 clean seconds (analyze's --capacity-min-s) are
-- thin: no rates. Scaling is against a non-thin N = 1, the marginal gain against the previous
-- non-thin row.
WITH
    sums AS
    (
        SELECT in_flight, clean_ns / 1e9 AS seconds, guard_ns / 1e9 AS guard_s,
            clean_tokens AS tokens, guard_tokens,
            seconds < 10 OR seconds <= 0 AS thin,
            if(thin, NULL, pace * in_flight) AS gen_tok_s,
            if(thin, NULL, (clean_tokens + guard_tokens) / (seconds + guard_s))
                AS gen_tok_s_unguarded
        FROM tm_production_paces
        WHERE clean_ns + guard_ns > 0
    ),
    levels AS
    (
        SELECT level AS in_flight, min(tok_s) AS tok_s_min, max(tok_s) AS tok_s_max
        FROM tm_request_levels
        WHERE tok_s IS NOT NULL AND isFinite(tok_s) AND level > 0
        GROUP BY level
    ),
    arrivals AS
    (
        SELECT in_flight_at_start AS in_flight, arraySort(groupArray(assumeNotNull(ttft_ms))) AS v
        FROM tm_generation
        WHERE ttft_ms IS NOT NULL AND NOT cold_start AND in_flight_at_start > 0
        GROUP BY in_flight_at_start
    )
SELECT
    s.in_flight AS in_flight,
    s.seconds AS seconds,
    s.guard_s AS guard_s,
    s.thin AS thin,
    s.tokens AS tokens,
    s.gen_tok_s AS gen_tok_s,
    s.gen_tok_s_unguarded AS gen_tok_s_unguarded,
    l.tok_s_min AS per_request_tok_s_min,
    s.gen_tok_s / s.in_flight AS per_request_tok_s_avg,
    l.tok_s_max AS per_request_tok_s_max,
    if(empty(a.v), NULL, a.v[toUInt64(greatest(1, ceil(0.50 * length(a.v))))]) AS ttft_p50_ms,
    if(empty(a.v), NULL, a.v[toUInt64(greatest(1, ceil(0.90 * length(a.v))))]) AS ttft_p90_ms,
    if(empty(a.v), NULL, a.v[toUInt64(greatest(1, ceil(0.99 * length(a.v))))]) AS ttft_p99_ms,
    s.gen_tok_s / nullIf(anyIf(s.gen_tok_s, s.in_flight = 1) OVER (), 0) AS scaling,
    s.gen_tok_s / nullIf(anyLast(s.gen_tok_s) OVER (ORDER BY s.in_flight
        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) - 1 AS marginal_gain
FROM sums AS s
LEFT JOIN levels AS l ON l.in_flight = s.in_flight
LEFT JOIN arrivals AS a ON a.in_flight = s.in_flight
ORDER BY in_flight
SETTINGS join_use_nulls = 1;

-- How the curve placed the generation requests' tokens (`capacity_production_tokens`): by their
-- token curve (as live), spread evenly over [TTFT, end] (lines without a curve but with a TTFT:
-- written before the field, the curve reads low where arrivals are frequent), or after the
-- guard's cap (no token before the end, as live).
SELECT
    countIf(has_curve) AS token_curve,
    countIf(NOT has_curve AND has_ttft) AS spread,
    countIf(NOT has_curve AND NOT has_ttft) AS no_first_token
FROM (SELECT notEmpty(token_curve) AS has_curve, ttft_ms IS NOT NULL AS has_ttft FROM tm_generation);
