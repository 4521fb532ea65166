-- Loads access-log files (plain or .gz, by extension) into access_log. Lines of other types
-- (server_sample) and of other schema versions are left out, as analyze skips them.
-- {path} is a glob the server may read (user_files_path), e.g. 'logs/access.jsonl*'.
INSERT INTO access_log
SELECT *
FROM file('{path}', 'JSONEachRow',
    'type String, schema UInt32, ts DateTime64(6, \'UTC\'), ts_ns UInt64, request_id String,
     upstream Nullable(String), user String, user_source String, model Nullable(String),
     method String, path String, status Nullable(UInt16), stream Nullable(Bool), outcome String,
     prompt_tokens Nullable(UInt64), completion_tokens Nullable(UInt64), tokens_source String,
     n Nullable(UInt32), first_byte_ms Nullable(Float64), ttft_ms Nullable(Float64),
     e2e_ms Nullable(Float64), tpot_ms Nullable(Float64), itl_max_ms Nullable(Float64),
     tok_s Nullable(Float64), decode_tok_s Nullable(Float64), in_flight_at_start UInt32,
     cold_start Bool, finish_reason Nullable(String), bytes_in UInt64, bytes_out UInt64,
     error Nullable(String), server_queue_ms Nullable(Float64), server_ttft_ms Nullable(Float64),
     server_mean_itl_ms Nullable(Float64), token_curve Array(UInt32), slo_ok Nullable(Bool),
     slo_miss Nullable(String)')
WHERE type = 'request' AND schema = 1
SETTINGS input_format_skip_unknown_fields = 1, input_format_allow_errors_num = 1000000,
    date_time_input_format = 'best_effort';
