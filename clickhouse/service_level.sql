-- Capacity at the service level (docs/service-level.md; `service_level` of /stats and
-- analyze --json) from the logs of any number of proxies. The objective's counts are in
-- tm_objective (views.sql): edit it to match the proxies' [slo].
--
-- 1. The per-level table (tm_service_levels).
SELECT
    in_flight, requests, met, thin, attainment_pct, attainment_ci_lo_pct, attainment_ci_hi_pct,
    missed_ttft, missed_pace, missed_ttft_pace, missed_e2e, missed_error, seconds,
    gen_tok_s, gen_tok_s_ci, per_request_tok_s, goodput_tok_s,
    model_per_request_tok_s, model_band_lo_tok_s, model_band_hi_tok_s
FROM tm_service_levels
ORDER BY in_flight;

-- 2. The headline: the highest non-thin N meeting the objective with every non-thin level below
-- it meeting it too; what binds at the first non-thin level that missed; "at least N (not
-- reached)" when none missed; "below N (levels below are thin)" when the lowest non-thin level
-- already misses (0 when that level is 1); else not known, with the reason.
WITH
    non_thin AS
    (
        SELECT in_flight, coalesce(meets, false) AS meets, binds
        FROM tm_service_levels
        WHERE NOT thin
    ),
    first AS
    (
        SELECT if(countIf(NOT meets) > 0, minIf(in_flight, NOT meets), NULL) AS miss_at,
            count() > 0 AS any_level
        FROM non_thin
    )
SELECT
    in_flight,
    first_miss IS NOT NULL AS reached,
    binds,
    first_miss,
    multiIf(
        first_miss IS NOT NULL AND in_flight IS NULL,
        concat('the lowest level with ', toString(min_requests), ' judged requests, ',
            toString(first_miss), ', already misses', char(59), ' the levels below it are thin'),
        in_flight IS NULL AND any_level, 'no level met the objective',
        in_flight IS NULL,
        concat('no level has ', toString(min_requests), ' judged requests yet (slo.min_requests)'),
        NULL) AS reason,
    multiIf(
        first_miss IS NOT NULL AND in_flight IS NOT NULL,
        concat(toString(in_flight), ' (', coalesce(binds, 'attainment'), ' binds at ',
            toString(first_miss), ')'),
        first_miss IS NOT NULL,
        concat('below ', toString(first_miss), ' (levels below are thin)'),
        in_flight IS NOT NULL, concat('at least ', toString(in_flight), ' (not reached)'),
        concat('not known yet: ', reason)) AS text
FROM
(
    SELECT
        any(f.miss_at) AS first_miss,
        any(f.any_level) AS any_level,
        if(countIf(n.meets AND (f.miss_at IS NULL OR n.in_flight < f.miss_at)) > 0,
            maxIf(n.in_flight, n.meets AND (f.miss_at IS NULL OR n.in_flight < f.miss_at)),
            NULL) AS best,
        if(first_miss IS NULL, NULL, anyIf(n.binds, n.in_flight = f.miss_at)) AS binds,
        if(first_miss IS NULL, best, if(best IS NOT NULL, best, if(first_miss = 1, 0, NULL)))
            AS in_flight,
        (SELECT min_requests FROM tm_objective) AS min_requests
    FROM non_thin AS n
    CROSS JOIN first AS f
);

-- 3. The decode-step model the table's model columns come from (tm_step_model).
SELECT a_ms, b_ms, levels, seconds, range_lo, range_hi, pace_capacity, reason
FROM tm_step_model;
