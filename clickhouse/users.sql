-- analyze's per-user table: requests of any path; over generation requests: completion tokens,
-- per-request tok/s min/mean/max, TTFT p50/p90 (nearest rank, cold starts included) and the
-- share of all completion tokens. Ordered by tokens, then name.
WITH
    all_paths AS (SELECT user, count() AS requests FROM access_log GROUP BY user),
    gen AS
    (
        SELECT
            user,
            count() AS generation_requests,
            sum(coalesce(completion_tokens, 0)) AS completion_tokens,
            minIf(tok_s, tok_s IS NOT NULL) AS tok_s_min,
            avgIf(tok_s, tok_s IS NOT NULL) AS tok_s_mean,
            maxIf(tok_s, tok_s IS NOT NULL) AS tok_s_max,
            countIf(tok_s IS NOT NULL) AS rated,
            arraySort(groupArrayIf(assumeNotNull(ttft_ms), ttft_ms IS NOT NULL)) AS ttft
        FROM tm_generation
        GROUP BY user
    )
SELECT
    p.user AS user,
    p.requests AS requests,
    coalesce(g.generation_requests, 0) AS generation_requests,
    coalesce(g.completion_tokens, 0) AS completion_tokens,
    if(g.rated > 0, g.tok_s_min, NULL) AS tok_s_min,
    if(g.rated > 0, g.tok_s_mean, NULL) AS tok_s_mean,
    if(g.rated > 0, g.tok_s_max, NULL) AS tok_s_max,
    if(empty(g.ttft), NULL, g.ttft[toUInt64(greatest(1, ceil(0.5 * length(g.ttft))))]) AS ttft_p50_ms,
    if(empty(g.ttft), NULL, g.ttft[toUInt64(greatest(1, ceil(0.9 * length(g.ttft))))]) AS ttft_p90_ms,
    100 * coalesce(g.completion_tokens, 0) / nullIf(sum(coalesce(g.completion_tokens, 0)) OVER (), 0) AS share_pct
FROM all_paths AS p
LEFT JOIN gen AS g ON g.user = p.user
ORDER BY completion_tokens DESC, user ASC
SETTINGS join_use_nulls = 1;
