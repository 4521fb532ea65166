-- analyze's per-second timeline: generated and prompt tokens attributed to each second, and the
-- level where the second was strictly steady (analyze's `steady_strict`: the level > 0 and no
-- change inside the second, the seconds the capacity table rests on; NULL otherwise).
SELECT
    t.sec AS sec,
    t.gen_tokens AS gen_tokens,
    t.prompt_tokens AS prompt_tokens,
    s.in_flight AS steady_in_flight
FROM tm_token_seconds AS t
LEFT JOIN tm_steady_seconds AS s ON s.sec = t.sec
ORDER BY sec
SETTINGS join_use_nulls = 1;
