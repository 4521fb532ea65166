-- analyze's capacity table (docs/capacity.md, "Capacity curve"): per level N with at least one steady
-- second, the steady seconds' generated tokens (mean, sample stdev), each request's share, the
-- min/max tok/s of requests whose life level rounds to N, TTFT percentiles (nearest rank) of
-- requests that arrived at N (cold starts excluded), scaling vs N = 1 and the marginal gain.
WITH
    seconds AS
    (
        SELECT s.in_flight AS in_flight, count() AS seconds,
               avg(coalesce(t.gen_tokens, 0)) AS gen_mean,
               if(count() > 1, stddevSamp(coalesce(t.gen_tokens, 0)), NULL) AS gen_stdev
        FROM tm_steady_seconds AS s
        LEFT JOIN tm_token_seconds AS t ON t.sec = s.sec
        GROUP BY in_flight
        SETTINGS join_use_nulls = 1
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
    s.gen_mean AS gen_tok_s_mean,
    s.gen_stdev AS gen_tok_s_stdev,
    l.tok_s_min AS per_request_tok_s_min,
    s.gen_mean / s.in_flight AS per_request_tok_s_avg,
    l.tok_s_max AS per_request_tok_s_max,
    if(empty(a.v), NULL, a.v[toUInt64(greatest(1, ceil(0.50 * length(a.v))))]) AS ttft_p50_ms,
    if(empty(a.v), NULL, a.v[toUInt64(greatest(1, ceil(0.90 * length(a.v))))]) AS ttft_p90_ms,
    if(empty(a.v), NULL, a.v[toUInt64(greatest(1, ceil(0.99 * length(a.v))))]) AS ttft_p99_ms,
    s.gen_mean / nullIf(anyIf(s.gen_mean, s.in_flight = 1) OVER (), 0) AS scaling,
    s.gen_mean / nullIf(lagInFrame(toNullable(s.gen_mean)) OVER (ORDER BY s.in_flight
        ROWS BETWEEN 1 PRECEDING AND CURRENT ROW), 0) - 1 AS marginal_gain
FROM seconds AS s
LEFT JOIN levels AS l ON l.in_flight = s.in_flight
LEFT JOIN arrivals AS a ON a.in_flight = s.in_flight
ORDER BY in_flight
SETTINGS join_use_nulls = 1;
