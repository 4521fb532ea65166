-- The definitions analyze applies to the access log (README "Measurement definitions" and
-- "tokenmeter analyze"), as views over access_log. Times are Unix nanoseconds on the proxy's
-- timeline; milliseconds become nanoseconds rounded half away from zero, as analyze rounds.

-- Generation requests (chat and text completions) with their instants.
CREATE VIEW IF NOT EXISTS tm_generation AS
SELECT
    user, model, upstream, outcome, stream, cold_start, in_flight_at_start,
    prompt_tokens, completion_tokens, ttft_ms, e2e_ms, tok_s,
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
