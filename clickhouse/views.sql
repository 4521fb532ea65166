-- The definitions analyze applies to the access log (docs/measurement.md and
-- docs/analyze.md), as views over access_log. Times are Unix nanoseconds on the proxy's
-- timeline; milliseconds become nanoseconds rounded half away from zero, as analyze rounds.

-- Generation requests (chat, text completions, Responses, Messages: the paths analyze reads as
-- generation, the query string left out) with their instants and service-level verdicts.
CREATE VIEW IF NOT EXISTS tm_generation AS
SELECT
    user, model, upstream, outcome, stream, cold_start, in_flight_at_start,
    prompt_tokens, completion_tokens, ttft_ms, e2e_ms, tok_s, token_curve, slo_ok, slo_miss,
    toInt64(ts_ns) AS start_ns,
    toInt64(ts_ns) + if(e2e_ms IS NULL, 0, toInt64(floor(e2e_ms * 1e6 + 0.5))) AS end_ns,
    if(ttft_ms IS NULL, NULL, toInt64(ts_ns) + toInt64(floor(ttft_ms * 1e6 + 0.5))) AS ttft_ns
FROM access_log
WHERE multiSearchAny(path, ['/chat/completions', '/v1/completions', '/v1/responses', '/v1/messages'])
    AND arrayExists(suffix -> endsWith(splitByChar('?', path)[1], suffix),
        ['/chat/completions', '/v1/completions', '/v1/responses', '/v1/messages']);

-- Tokens per second. Completion tokens are spread evenly over [TTFT, end] (over [arrival, end]
-- for a non-streamed request, or without a TTFT), in proportion to each second's overlap; prompt
-- tokens go to the TTFT's second, else the end's.
CREATE VIEW IF NOT EXISTS tm_token_seconds AS
SELECT sec, sum(gen) AS gen_tokens, sum(prompt) AS prompt_tokens
FROM
(
    SELECT
        arrayJoin(if(to_ns <= from_ns, [intDiv(from_ns, 1000000000)],
            range(intDiv(from_ns, 1000000000), intDiv(to_ns - 1, 1000000000) + 1))) AS sec,
        if(to_ns <= from_ns, tokens,
            tokens * (least(to_ns, (sec + 1) * 1000000000) - greatest(from_ns, sec * 1000000000))
                / (to_ns - from_ns)) AS gen,
        0. AS prompt
    FROM
    (
        SELECT
            toFloat64(assumeNotNull(completion_tokens)) AS tokens,
            end_ns AS to_ns,
            greatest(start_ns, least(end_ns,
                if(stream = false, start_ns, assumeNotNull(coalesce(ttft_ns, start_ns))))) AS from_ns
        FROM tm_generation
        WHERE completion_tokens > 0
    )
    UNION ALL
    SELECT
        intDiv(if(ttft_ns IS NULL, end_ns, least(assumeNotNull(ttft_ns), end_ns)), 1000000000) AS sec,
        0. AS gen,
        toFloat64(assumeNotNull(prompt_tokens)) AS prompt
    FROM tm_generation
    WHERE prompt_tokens > 0
)
GROUP BY sec;

-- Instants at which the in-flight level changes: starts (+1) and ends (-1) of requests of
-- non-zero length, netted per nanosecond (one request ending as the next begins changes nothing).
CREATE VIEW IF NOT EXISTS tm_level_instants AS
SELECT t, sum(delta) AS net
FROM
(
    SELECT start_ns AS t, 1 AS delta FROM tm_generation WHERE end_ns > start_ns
    UNION ALL
    SELECT end_ns AS t, -1 AS delta FROM tm_generation WHERE end_ns > start_ns
)
GROUP BY t
HAVING net != 0;

-- Seconds with a change strictly inside them (a change on a second's first instant is not).
CREATE VIEW IF NOT EXISTS tm_busy_seconds AS
SELECT DISTINCT intDiv(t, 1000000000) AS sec FROM tm_level_instants WHERE t % 1000000000 != 0;

-- Net level change carried into each second (from the first second that starts after it).
CREATE VIEW IF NOT EXISTS tm_level_changes AS
SELECT from_sec, sum(net) AS delta
FROM
(
    SELECT if(t % 1000000000 = 0, intDiv(t, 1000000000), intDiv(t, 1000000000) + 1) AS from_sec, net
    FROM tm_level_instants
)
GROUP BY from_sec;

-- Steady seconds: the level N carried into the second is > 0 and nothing changed inside it.
CREATE VIEW IF NOT EXISTS tm_steady_seconds AS
SELECT sec, in_flight
FROM
(
    SELECT arrayJoin(range(from_sec, next_sec)) AS sec, toUInt32(level) AS in_flight
    FROM
    (
        SELECT
            from_sec,
            sum(delta) OVER (ORDER BY from_sec ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS level,
            leadInFrame(from_sec) OVER (ORDER BY from_sec ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING) AS next_sec
        FROM tm_level_changes
    )
    WHERE level > 0 AND next_sec > from_sec
)
WHERE sec NOT IN (SELECT sec FROM tm_busy_seconds);

-- Each request's time-weighted mean in-flight level over its life, rounded: the overlap of its
-- [arrival, end) with every request's (itself included) / its length. Requests are cut into the
-- seconds they cover so the join is on equal seconds. A zero-length request takes its
-- in_flight_at_start. With its tok/s, verdict and output tokens (the service level counts each
-- verdict at this level).
CREATE VIEW IF NOT EXISTS tm_request_levels AS
WITH pieces AS
(
    SELECT
        rowNumberInAllBlocks() AS id, start_ns, end_ns, tok_s, slo_ok, slo_miss, completion_tokens,
        arrayJoin(range(intDiv(start_ns, 1000000000), intDiv(end_ns - 1, 1000000000) + 1)) AS sec
    FROM tm_generation
    WHERE end_ns > start_ns
)
SELECT
    a.id AS id,
    any(a.tok_s) AS tok_s,
    toUInt32(floor(sum(greatest(0,
        least(a.end_ns, b.end_ns, (a.sec + 1) * 1000000000)
        - greatest(a.start_ns, b.start_ns, a.sec * 1000000000)))
        / any(a.end_ns - a.start_ns) + 0.5)) AS level,
    any(a.slo_ok) AS slo_ok,
    any(a.slo_miss) AS slo_miss,
    any(a.completion_tokens) AS completion_tokens
FROM pieces AS a
INNER JOIN pieces AS b ON a.sec = b.sec
GROUP BY a.id
UNION ALL
SELECT 0 AS id, tok_s, in_flight_at_start AS level, slo_ok, slo_miss, completion_tokens
FROM tm_generation WHERE end_ns <= start_ns;

-- The production-traffic curve (docs/capacity.md, "Production-traffic curve"), as analyze replays the live
-- meter's level attribution. Each generation request of non-zero length with: its first token
-- (the TTFT; a line with a token curve but no TTFT has the curve's first point; at most the
-- end), whether its guard closes there, and where the tokens its curve does not hold are spread
-- from (the TTFT, or the arrival for a non-streamed request; without a first token, the arrival
-- + the guard's 1 s cap, as live).
CREATE VIEW IF NOT EXISTS tm_production_requests AS
SELECT
    start_ns, end_ns, ttft_ns, token_curve, completion_tokens,
    first_token_ns,
    first_token_ns IS NOT NULL AND first_token_ns <= end_ns AS has_first_token,
    greatest(start_ns, least(end_ns,
        if(first_token_ns IS NULL, start_ns + 1000000000,
            if(stream = false, start_ns, assumeNotNull(coalesce(ttft_ns, start_ns))))))
        AS rest_from_ns,
    toFloat64(completion_tokens)
        - toFloat64(arraySum(arrayFilter((v, i) -> i % 2 = 0, token_curve,
            arrayEnumerate(token_curve)))) AS rest_tokens
FROM
(
    SELECT *,
        if(empty(token_curve), ttft_ns,
            least(coalesce(ttft_ns, start_ns + toInt64(token_curve[1]) * 1000000), end_ns))
            AS first_token_ns
    FROM tm_generation
)
WHERE end_ns > start_ns;

-- Each request's guard, from its arrival: until its first token when one came (a first token
-- after the cap makes the time since the cap guarded after all), else until the cap or its end.
-- The cap is 1 s, or twice the longest of the last 64 first-token delays before the arrival when
-- that is longer (first tokens ordered by time, then by arrival).
CREATE VIEW IF NOT EXISTS tm_production_guards AS
WITH firsts AS
(
    SELECT 0 AS k, assumeNotNull(first_token_ns) AS ft,
        max(assumeNotNull(first_token_ns) - start_ns) OVER (ORDER BY ft, start_ns
            ROWS BETWEEN 63 PRECEDING AND CURRENT ROW) AS recent_max
    FROM tm_production_requests
    WHERE has_first_token
)
SELECT start_ns, assumeNotNull(first_token_ns) AS guard_end_ns
FROM tm_production_requests
WHERE has_first_token
UNION ALL
SELECT r.start_ns,
    least(r.end_ns, r.start_ns + greatest(1000000000, 2 * f.recent_max)) AS guard_end_ns
FROM (SELECT 0 AS k, start_ns, end_ns FROM tm_production_requests WHERE NOT has_first_token) AS r
ASOF LEFT JOIN firsts AS f ON r.k = f.k AND r.start_ns >= f.ft;

-- Segments: the stretches between consecutive changes of the in-flight level, of the guards open
-- or of the requests awaiting a first token, each with its level, whether any guard was open, and
-- `seen`: the requests in flight past their first token (the level minus those awaiting one; a
-- request without a first token awaits it until its end), whose tokens are placed where they
-- were made.
CREATE VIEW IF NOT EXISTS tm_production_segments AS
SELECT t AS from_ns, next_t AS to_ns, toUInt32(level) AS in_flight, guards > 0 AS guarded,
    toUInt32(greatest(0, level - awaiting)) AS seen
FROM
(
    SELECT t,
        sum(dl) OVER (ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS level,
        sum(dg) OVER (ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS guards,
        sum(da) OVER (ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS awaiting,
        leadInFrame(t) OVER (ORDER BY t ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING) AS next_t
    FROM
    (
        SELECT t, sum(dl) AS dl, sum(dg) AS dg, sum(da) AS da
        FROM
        (
            SELECT start_ns AS t, 1 AS dl, 0 AS dg, 1 AS da FROM tm_production_requests
            UNION ALL
            SELECT end_ns AS t, -1 AS dl, 0 AS dg, 0 AS da FROM tm_production_requests
            UNION ALL
            SELECT if(has_first_token, greatest(start_ns, assumeNotNull(first_token_ns)), end_ns)
                AS t, 0 AS dl, 0 AS dg, -1 AS da
            FROM tm_production_requests
            UNION ALL
            SELECT start_ns AS t, 0 AS dl, 1 AS dg, 0 AS da FROM tm_production_guards
            UNION ALL
            SELECT guard_end_ns AS t, 0 AS dl, -1 AS dg, 0 AS da FROM tm_production_guards
        )
        GROUP BY t
    )
)
WHERE level > 0 AND next_t > t;

-- Each request's tokens as stretches made evenly over [from, to]: its token curve (the first
-- point's tokens since the arrival, up to the first token; each next point's since the previous
-- point, ms since arrival summed), and the tokens the curve does not hold over [rest_from, end].
-- Stretches end at most at the end; an empty one stands for its instant (the segment ending
-- there). `seen`: the request had a first token (its tokens count in the streamed pace).
CREATE VIEW IF NOT EXISTS tm_production_pieces AS
SELECT least(from_ns, to_ns) AS from_ns, to_ns, tokens, seen
FROM
(
    SELECT
        if(i = 1, start_ns, start_ns + toInt64(at_ms[i - 1]) * 1000000) AS from_ns,
        least(end_ns, if(i = 1, assumeNotNull(first_token_ns),
            start_ns + toInt64(at_ms[i]) * 1000000)) AS to_ns,
        toFloat64(n[i]) AS tokens,
        has_first_token AS seen
    FROM
    (
        SELECT start_ns, end_ns, first_token_ns, has_first_token,
            arrayCumSum(arrayFilter((v, j) -> j % 2 = 1, token_curve,
                arrayEnumerate(token_curve))) AS at_ms,
            arrayFilter((v, j) -> j % 2 = 0, token_curve, arrayEnumerate(token_curve)) AS n,
            arrayJoin(arrayEnumerate(n)) AS i
        FROM tm_production_requests
        WHERE notEmpty(token_curve)
    )
    UNION ALL
    SELECT rest_from_ns AS from_ns, end_ns AS to_ns, assumeNotNull(rest_tokens) AS tokens,
        has_first_token AS seen
    FROM tm_production_requests
    WHERE rest_tokens IS NOT NULL AND rest_tokens != 0
);

-- Tokens credited to each segment (by its start): each stretch's tokens in proportion to its
-- overlap with the segment (both cut into seconds to join on the second); an empty stretch all to
-- the segment ending at its instant. `seen_tokens`: those of requests past a first token.
CREATE VIEW IF NOT EXISTS tm_production_segment_tokens AS
WITH
    seg AS
    (
        SELECT from_ns, to_ns,
            arrayJoin(range(intDiv(from_ns, 1000000000), intDiv(to_ns - 1, 1000000000) + 1)) AS sec
        FROM tm_production_segments
    ),
    pc AS
    (
        SELECT if(to_ns > from_ns, from_ns, to_ns - 1) AS a, to_ns AS b, seen,
            tokens / (b - a) AS per_ns,
            arrayJoin(range(intDiv(a, 1000000000), intDiv(b - 1, 1000000000) + 1)) AS sec
        FROM tm_production_pieces
    )
SELECT from_ns, sum(credit) AS tokens, sum(if(seen, credit, 0)) AS seen_tokens
FROM
(
    SELECT s.from_ns AS from_ns, p.seen AS seen,
        p.per_ns * greatest(0,
            least(p.b, s.to_ns, (p.sec + 1) * 1000000000)
            - greatest(p.a, s.from_ns, p.sec * 1000000000)) AS credit
    FROM pc AS p
    INNER JOIN seg AS s ON p.sec = s.sec
)
GROUP BY from_ns;

-- Time and tokens per level, clean and guarded; over the clean time also the streamed
-- sequences' sequence-seconds (clean time × `seen`) and tokens, and the clean segments in time
-- order (start, ns, sequence-seconds, tokens, seen tokens), which the rate's interval batches.
CREATE VIEW IF NOT EXISTS tm_production_levels AS
SELECT
    in_flight,
    sumIf(ns, NOT guarded) AS clean_ns,
    sumIf(ns, guarded) AS guard_ns,
    sumIf(seg_tokens, NOT guarded) AS clean_tokens,
    sumIf(seg_tokens, guarded) AS guard_tokens,
    sumIf(seg_seq_s, NOT guarded) AS seen_seq_s,
    sumIf(seg_seen_tokens, NOT guarded) AS seen_tokens,
    arraySort(x -> x.1, groupArrayIf((from_ns, toFloat64(ns), seg_seq_s, seg_tokens,
        seg_seen_tokens), NOT guarded)) AS clean_segments
FROM
(
    SELECT s.in_flight AS in_flight, s.guarded AS guarded, s.from_ns AS from_ns,
        s.to_ns - s.from_ns AS ns,
        toFloat64(ns) * s.seen / 1e9 AS seg_seq_s,
        coalesce(c.tokens, 0) AS seg_tokens,
        coalesce(c.seen_tokens, 0) AS seg_seen_tokens
    FROM tm_production_segments AS s
    LEFT JOIN tm_production_segment_tokens AS c ON c.from_ns = s.from_ns
    SETTINGS join_use_nulls = 1
)
GROUP BY in_flight;

-- The per-request pace per level (docs/service-level.md, "Per in-flight level"; analyze's
-- LevelSums::pace): the streamed sequences' tokens over their sequence-seconds of clean time,
-- when they had 0.5 s of them; else every clean token / clean s / N. Its 95 % interval: the
-- clean segments in time order cut into batches that close once they hold 1 s (arrayFold),
-- the ratio estimator's SE² = Σ(tᵢ − R·sᵢ)² / (n(n−1)·s̄²), × 1.96; null with fewer than 2
-- batches.
CREATE VIEW IF NOT EXISTS tm_production_paces AS
SELECT in_flight, clean_ns, guard_ns, clean_tokens, guard_tokens, seen_seq_s, seen_tokens,
    seen_seq_s >= 0.5 AND seen_seq_s > 0 AS streamed,
    if(streamed, seen_tokens / seen_seq_s,
        if(clean_ns > 0 AND in_flight > 0, clean_tokens / (clean_ns / 1e9) / in_flight, NULL))
        AS pace,
    -- (open ns, open weight, open tokens, n, Σs, Σt, Σs², Σt², Σts) over the batches
    arrayFold((acc, x) -> if(acc.1 + x.1 >= 1e9,
            (0., 0., 0., acc.4 + 1, acc.5 + (acc.2 + x.2), acc.6 + (acc.3 + x.3),
                acc.7 + (acc.2 + x.2) * (acc.2 + x.2), acc.8 + (acc.3 + x.3) * (acc.3 + x.3),
                acc.9 + (acc.3 + x.3) * (acc.2 + x.2)),
            (acc.1 + x.1, acc.2 + x.2, acc.3 + x.3, acc.4, acc.5, acc.6, acc.7, acc.8, acc.9)),
        arrayMap(x -> (assumeNotNull(x.2), assumeNotNull(if(streamed, x.3, x.2 / 1e9)),
            assumeNotNull(if(streamed, x.5, x.4))), clean_segments),
        (0., 0., 0., 0., 0., 0., 0., 0., 0.)) AS b,
    b.4 AS batches,
    if(b.4 < 2 OR b.5 <= 0, NULL,
        1.96 * sqrt(greatest(0., b.8 - 2 * (b.6 / b.5) * b.9 + (b.6 / b.5) * (b.6 / b.5) * b.7)
            / (b.4 * (b.4 - 1) * (b.5 / b.4) * (b.5 / b.4)))
        / if(streamed, 1, in_flight)) AS pace_ci
FROM tm_production_levels;

-- The objective the service-level views judge levels by: the [slo] table of the proxies' config
-- (docs/service-level.md). Each line already carries its verdict (slo_ok, slo_miss) against the
-- bounds its proxy had; these say how many judged requests make a level non-thin
-- (slo.min_requests), the share that must meet the bounds (slo.attainment_pct), and the pace
-- bound the decode-step model's limit is read against (slo.max_tpot_ms). Edit to match.
CREATE VIEW IF NOT EXISTS tm_objective AS
SELECT 95. AS attainment_pct, toUInt64(20) AS min_requests, 40. AS max_tpot_ms;

-- The decode-step model (docs/service-level.md, "The decode-step model"): τ_N = 1000 / pace_N ms
-- at every level with 0.5 s of clean time, fitted to a + b·N by least squares weighted by clean
-- seconds; with its covariance ((XᵀWX)⁻¹ × the weighted residual variance), the levels it rests
-- on and its pace limit (the highest N with τ(N) ≤ max_tpot_ms). One row; `a_ms` null with
-- `reason` when there is no fit.
CREATE VIEW IF NOT EXISTS tm_step_model AS
WITH
    points AS
    (
        SELECT toFloat64(in_flight) AS x, 1000 / pace AS y, clean_ns / 1e9 AS w
        FROM tm_production_paces
        WHERE in_flight > 0 AND clean_ns / 1e9 >= 0.5 AND pace > 0
    ),
    sums AS
    (
        SELECT count() AS k, sum(w) AS sw, sum(w * x) AS sx, sum(w * y) AS sy,
            sum(w * x * x) AS sxx, sum(w * x * y) AS sxy, min(x) AS lo, max(x) AS hi,
            sw * sxx - sx * sx AS det,
            (sw * sxy - sx * sy) / det AS b,
            (sy - b * sx) / sw AS a
        FROM points
    ),
    fit AS
    (
        SELECT any(s.k) AS k, any(s.sw) AS sw, any(s.sx) AS sx, any(s.sxx) AS sxx,
            any(s.det) AS det, any(s.a) AS a, any(s.b) AS b, any(s.lo) AS lo, any(s.hi) AS hi,
            sum(p.w * (p.y - s.a - s.b * p.x) * (p.y - s.a - s.b * p.x)) AS rss
        FROM points AS p
        CROSS JOIN sums AS s
    )
SELECT
    k < 3 OR abs(det) < 2.220446049250313e-16 AS none,
    if(k < 3, concat(toString(k), ' level(s) with 0.5 s of clean time', char(59), ' the fit needs 3'),
        if(none, 'the levels do not spread', NULL)) AS reason,
    if(none, NULL, a) AS a_ms,
    if(none, NULL, b) AS b_ms,
    k AS levels,
    sw AS seconds,
    toUInt32(lo) AS range_lo,
    toUInt32(hi) AS range_hi,
    rss / (k - 2) AS sigma2,
    if(none, NULL, sigma2 * sxx / det) AS cov_aa,
    if(none, NULL, -sigma2 * sx / det) AS cov_ab,
    if(none, NULL, sigma2 * sw / det) AS cov_bb,
    if(none OR b <= 0 OR floor(((SELECT max_tpot_ms FROM tm_objective) - a) / b) < 1, NULL,
        toUInt32(least(floor(((SELECT max_tpot_ms FROM tm_objective) - a) / b), 4294967295)))
        AS pace_capacity
FROM fit;

-- The service-level table (docs/service-level.md, "Per in-flight level"; `service_level.levels`
-- of /stats and analyze --json): per level N with judged requests or clean time, the verdicts
-- of the requests whose rounded mean level over their life is N (judged: slo_ok not null; a
-- miss logged without its kind counts as an error), attainment with its Wilson 95 % interval,
-- misses by kind, clean seconds, the per-request pace (null under 0.5 clean s) and the aggregate
-- (pace × N) with their intervals, goodput (aggregate × met output tokens / judged output
-- tokens), thin (fewer than min_requests judged), and the model's pace at N with its band.
CREATE VIEW IF NOT EXISTS tm_service_levels AS
WITH
    verdicts AS
    (
        SELECT level AS in_flight, count() AS requests, countIf(ok) AS met,
            countIf(miss = 'ttft') AS missed_ttft, countIf(miss = 'pace') AS missed_pace,
            countIf(miss = 'ttft_pace') AS missed_ttft_pace, countIf(miss = 'e2e') AS missed_e2e,
            countIf(miss = 'error') AS missed_error,
            sum(tokens) AS judged_tokens, sumIf(tokens, ok) AS met_tokens
        FROM
        (
            SELECT level, assumeNotNull(slo_ok) AS ok,
                if(ok, '', coalesce(slo_miss, 'error')) AS miss,
                toFloat64(coalesce(completion_tokens, 0)) AS tokens
            FROM tm_request_levels
            WHERE slo_ok IS NOT NULL AND level > 0
        )
        GROUP BY level
    ),
    paces AS
    (
        SELECT in_flight, clean_ns / 1e9 AS seconds,
            if(seconds >= 0.5, pace, NULL) AS per_request, if(seconds >= 0.5, pace_ci, NULL) AS ci
        FROM tm_production_paces
        WHERE clean_ns > 0 AND in_flight > 0
    ),
    levels AS
    (
        SELECT DISTINCT in_flight FROM
        (SELECT in_flight FROM verdicts UNION ALL SELECT in_flight FROM paces)
    )
SELECT
    l.in_flight AS in_flight,
    coalesce(v.requests, 0) AS requests,
    coalesce(v.met, 0) AS met,
    requests < o.min_requests AS thin,
    if(requests > 0, met * 100 / requests, NULL) AS attainment_pct,
    -- Wilson score interval, z = 1.96
    met / requests AS p_hat,
    (p_hat + 1.96 * 1.96 / (2 * requests)) / (1 + 1.96 * 1.96 / requests) AS centre,
    1.96 * sqrt(p_hat * (1 - p_hat) / requests + 1.96 * 1.96 / (4 * requests * requests))
        / (1 + 1.96 * 1.96 / requests) AS half,
    if(requests > 0, greatest(0, (centre - half) * 100), NULL) AS attainment_ci_lo_pct,
    if(requests > 0, least(100, (centre + half) * 100), NULL) AS attainment_ci_hi_pct,
    coalesce(v.missed_ttft, 0) AS missed_ttft,
    coalesce(v.missed_pace, 0) AS missed_pace,
    coalesce(v.missed_ttft_pace, 0) AS missed_ttft_pace,
    coalesce(v.missed_e2e, 0) AS missed_e2e,
    coalesce(v.missed_error, 0) AS missed_error,
    coalesce(p.seconds, 0) AS seconds,
    p.per_request * l.in_flight AS gen_tok_s,
    p.ci * l.in_flight AS gen_tok_s_ci,
    p.per_request AS per_request_tok_s,
    if(v.judged_tokens > 0, gen_tok_s * v.met_tokens / v.judged_tokens, NULL) AS goodput_tok_s,
    -- the model at N and its 95 % band: 1000 / (τ(N) ± 1.96·σ_τ(N))
    m.a_ms + m.b_ms * l.in_flight AS tau,
    1.96 * sqrt(greatest(0, m.cov_aa + 2 * l.in_flight * m.cov_ab
        + l.in_flight * l.in_flight * m.cov_bb)) AS d,
    1000 / tau AS model_per_request_tok_s,
    1000 / (tau + d) AS model_band_lo_tok_s,
    if(tau - d > 0, 1000 / (tau - d), NULL) AS model_band_hi_tok_s,
    attainment_pct >= o.attainment_pct AS meets,
    -- what binds, were the level to miss: the kind behind most misses (ttft_pace counts for
    -- both; a tie goes to the later of ttft, pace, e2e, error)
    [('ttft', missed_ttft + missed_ttft_pace), ('pace', missed_pace + missed_ttft_pace),
        ('e2e', missed_e2e), ('error', missed_error)] AS kinds,
    arrayMax(x -> x.2, kinds) AS most,
    if(most = 0, NULL, arrayReverse(arrayFilter(x -> x.2 = most, kinds))[1].1) AS binds
FROM levels AS l
LEFT JOIN verdicts AS v ON v.in_flight = l.in_flight
LEFT JOIN paces AS p ON p.in_flight = l.in_flight
CROSS JOIN tm_step_model AS m
CROSS JOIN tm_objective AS o
ORDER BY in_flight
SETTINGS join_use_nulls = 1;
