-- The definitions analyze applies to the access log (docs/measurement.md and
-- docs/analyze.md), as views over access_log. Times are Unix nanoseconds on the proxy's
-- timeline; milliseconds become nanoseconds rounded half away from zero, as analyze rounds.

-- Generation requests (chat and text completions) with their instants.
CREATE VIEW IF NOT EXISTS tm_generation AS
SELECT
    user, model, upstream, outcome, stream, cold_start, in_flight_at_start,
    prompt_tokens, completion_tokens, ttft_ms, e2e_ms, tok_s, token_curve,
    toInt64(ts_ns) AS start_ns,
    toInt64(ts_ns) + if(e2e_ms IS NULL, 0, toInt64(floor(e2e_ms * 1e6 + 0.5))) AS end_ns,
    if(ttft_ms IS NULL, NULL, toInt64(ts_ns) + toInt64(floor(ttft_ms * 1e6 + 0.5))) AS ttft_ns
FROM access_log
WHERE endsWith(path, '/chat/completions') OR endsWith(path, '/v1/completions');

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
-- in_flight_at_start.
CREATE VIEW IF NOT EXISTS tm_request_levels AS
WITH pieces AS
(
    SELECT
        rowNumberInAllBlocks() AS id, start_ns, end_ns, tok_s,
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
        / any(a.end_ns - a.start_ns) + 0.5)) AS level
FROM pieces AS a
INNER JOIN pieces AS b ON a.sec = b.sec
GROUP BY a.id
UNION ALL
SELECT 0 AS id, tok_s, in_flight_at_start AS level FROM tm_generation WHERE end_ns <= start_ns;

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

-- Segments: the stretches between consecutive changes of the in-flight level or of the guards
-- open, each with its level and whether any guard was open.
CREATE VIEW IF NOT EXISTS tm_production_segments AS
SELECT t AS from_ns, next_t AS to_ns, toUInt32(level) AS in_flight, guards > 0 AS guarded
FROM
(
    SELECT t,
        sum(dl) OVER (ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS level,
        sum(dg) OVER (ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS guards,
        leadInFrame(t) OVER (ORDER BY t ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING) AS next_t
    FROM
    (
        SELECT t, sum(dl) AS dl, sum(dg) AS dg
        FROM
        (
            SELECT start_ns AS t, 1 AS dl, 0 AS dg FROM tm_production_requests
            UNION ALL
            SELECT end_ns AS t, -1 AS dl, 0 AS dg FROM tm_production_requests
            UNION ALL
            SELECT start_ns AS t, 0 AS dl, 1 AS dg FROM tm_production_guards
            UNION ALL
            SELECT guard_end_ns AS t, 0 AS dl, -1 AS dg FROM tm_production_guards
        )
        GROUP BY t
    )
)
WHERE level > 0 AND next_t > t;

-- Each request's tokens as stretches made evenly over [from, to]: its token curve (the first
-- point's tokens since the arrival, up to the first token; each next point's since the previous
-- point, ms since arrival summed), and the tokens the curve does not hold over [rest_from, end].
-- Stretches end at most at the end; an empty one stands for its instant (the segment ending
-- there).
CREATE VIEW IF NOT EXISTS tm_production_pieces AS
SELECT least(from_ns, to_ns) AS from_ns, to_ns, tokens
FROM
(
    SELECT
        if(i = 1, start_ns, start_ns + toInt64(at_ms[i - 1]) * 1000000) AS from_ns,
        least(end_ns, if(i = 1, assumeNotNull(first_token_ns),
            start_ns + toInt64(at_ms[i]) * 1000000)) AS to_ns,
        toFloat64(n[i]) AS tokens
    FROM
    (
        SELECT start_ns, end_ns, first_token_ns,
            arrayCumSum(arrayFilter((v, j) -> j % 2 = 1, token_curve,
                arrayEnumerate(token_curve))) AS at_ms,
            arrayFilter((v, j) -> j % 2 = 0, token_curve, arrayEnumerate(token_curve)) AS n,
            arrayJoin(arrayEnumerate(n)) AS i
        FROM tm_production_requests
        WHERE notEmpty(token_curve)
    )
    UNION ALL
    SELECT rest_from_ns AS from_ns, end_ns AS to_ns, assumeNotNull(rest_tokens) AS tokens
    FROM tm_production_requests
    WHERE rest_tokens IS NOT NULL AND rest_tokens != 0
);

-- Time and tokens per level, clean and guarded: each stretch's tokens credited to the segments
-- it overlaps in proportion to the overlap (both cut into seconds to join on the second); an
-- empty stretch all to the segment ending at its instant.
CREATE VIEW IF NOT EXISTS tm_production_levels AS
WITH
    seg AS
    (
        SELECT in_flight, guarded, from_ns, to_ns,
            arrayJoin(range(intDiv(from_ns, 1000000000), intDiv(to_ns - 1, 1000000000) + 1)) AS sec
        FROM tm_production_segments
    ),
    pc AS
    (
        SELECT if(to_ns > from_ns, from_ns, to_ns - 1) AS a, to_ns AS b,
            tokens / (b - a) AS per_ns,
            arrayJoin(range(intDiv(a, 1000000000), intDiv(b - 1, 1000000000) + 1)) AS sec
        FROM tm_production_pieces
    ),
    credited AS
    (
        SELECT s.in_flight AS in_flight, s.guarded AS guarded,
            sum(p.per_ns * greatest(0,
                least(p.b, s.to_ns, (p.sec + 1) * 1000000000)
                - greatest(p.a, s.from_ns, p.sec * 1000000000))) AS tokens
        FROM pc AS p
        INNER JOIN seg AS s ON p.sec = s.sec
        GROUP BY in_flight, guarded
    ),
    timed AS
    (
        SELECT in_flight, guarded, sum(to_ns - from_ns) AS ns
        FROM tm_production_segments
        GROUP BY in_flight, guarded
    )
SELECT
    t.in_flight AS in_flight,
    sumIf(t.ns, NOT t.guarded) AS clean_ns,
    sumIf(t.ns, t.guarded) AS guard_ns,
    sumIf(coalesce(c.tokens, 0), NOT t.guarded) AS clean_tokens,
    sumIf(coalesce(c.tokens, 0), t.guarded) AS guard_tokens
FROM timed AS t
LEFT JOIN credited AS c ON c.in_flight = t.in_flight AND c.guarded = t.guarded
GROUP BY in_flight
SETTINGS join_use_nulls = 1;
