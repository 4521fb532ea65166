-- The tokenmeter access-log line (schemas/record.schema.json, "schema": 1) as a ClickHouse table.
-- One row per finished request. Nullable columns are the fields the proxy writes as null when
-- unknown; analyze's definitions read them as "unknown", never as zero. `token_curve` (an array
-- cannot be Nullable) is empty where the line has null (no token before the end) or no such
-- field (written before it). `slo_ok` and `slo_miss` are the request's verdict against the proxy's
-- [slo] (docs/service-level.md); null when not judged, and on lines written before the fields.
-- A table made before them takes them with
--   ALTER TABLE access_log ADD COLUMN slo_ok Nullable(Bool),
--       ADD COLUMN slo_miss LowCardinality(Nullable(String));
CREATE TABLE IF NOT EXISTS access_log
(
    type               LowCardinality(String),
    schema             UInt32,
    ts                 DateTime64(6, 'UTC'),
    ts_ns              UInt64,
    request_id         String,
    upstream           LowCardinality(Nullable(String)),
    user               String,
    user_source        LowCardinality(String),
    model              LowCardinality(Nullable(String)),
    method             LowCardinality(String),
    path               String,
    status             Nullable(UInt16),
    stream             Nullable(Bool),
    outcome            LowCardinality(String),
    prompt_tokens      Nullable(UInt64),
    completion_tokens  Nullable(UInt64),
    tokens_source      LowCardinality(String),
    n                  Nullable(UInt32),
    first_byte_ms      Nullable(Float64),
    ttft_ms            Nullable(Float64),
    e2e_ms             Nullable(Float64),
    tpot_ms            Nullable(Float64),
    itl_max_ms         Nullable(Float64),
    tok_s              Nullable(Float64),
    decode_tok_s       Nullable(Float64),
    in_flight_at_start UInt32,
    cold_start         Bool,
    finish_reason      LowCardinality(Nullable(String)),
    bytes_in           UInt64,
    bytes_out          UInt64,
    error              Nullable(String),
    server_queue_ms    Nullable(Float64),
    server_ttft_ms     Nullable(Float64),
    server_mean_itl_ms Nullable(Float64),
    token_curve        Array(UInt32),
    slo_ok             Nullable(Bool),
    slo_miss           LowCardinality(Nullable(String))
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (ts_ns, request_id);
