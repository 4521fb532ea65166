//! One scrape of vLLM's `/metrics`, and its access-log line (`"type": "server_sample"`).

use serde_json::json;

use crate::clock::{format_rfc3339_micros, UnixNanos};

use super::prom_text::VllmValues;

/// Version of the `server_sample` log line (see `schemas/server_sample.schema.json`).
pub const SERVER_SAMPLE_SCHEMA: u32 = 1;

/// One successful scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSample {
    /// When the sample describes the server: the midpoint between sending the scrape request and
    /// receiving the whole response (`Clock::global().now()` on both sides), Unix nanoseconds.
    pub ts_ns: UnixNanos,
    /// The kept vLLM series.
    pub values: VllmValues,
    /// Generation requests in flight through this proxy when the scrape was sent.
    pub proxy_in_flight: Option<u64>,
    /// Duration of the scrape (request sent → body read), ms.
    pub scrape_ms: f64,
}

impl ServerSample {
    /// The access-log line, newline-terminated. Unknown values are `null`. `ttft_buckets` lists
    /// `[le, cumulative count]` for the finite bounds (the `+Inf` bucket equals `ttft_count`).
    pub fn to_json_line(&self) -> Vec<u8> {
        let v = &self.values;
        let ttft = v.ttft.as_ref();
        let line = json!({
            "type": "server_sample",
            "schema": SERVER_SAMPLE_SCHEMA,
            "ts": format_rfc3339_micros(self.ts_ns),
            "ts_ns": self.ts_ns,
            "running": v.running,
            "waiting": v.waiting,
            "generation_tokens_total": v.generation_tokens_total,
            "prompt_tokens_total": v.prompt_tokens_total,
            "kv_cache_usage": v.kv_cache_usage,
            "ttft_count": ttft.map(|h| h.count),
            "ttft_sum_s": ttft.map(|h| h.sum),
            "ttft_buckets": ttft.map(|h| h.buckets.iter().map(|(le, c)| [*le, *c]).collect::<Vec<_>>()),
            "num_gpu_blocks": v.kv.num_gpu_blocks,
            "block_size": v.kv.block_size,
            "kv_cache_size_tokens": v.kv.kv_cache_size_tokens,
            "enable_prefix_caching": v.kv.enable_prefix_caching,
            "preemptions_total": v.kv.preemptions_total,
            "proxy_in_flight": self.proxy_in_flight,
            "scrape_ms": self.scrape_ms,
        });
        let mut out = serde_json::to_vec(&line).unwrap_or_default();
        out.push(b'\n');
        out
    }
}

impl ServerSample {
    /// Reads a `server_sample` access-log line back; `None` for other lines or a malformed one.
    pub fn from_json(v: &serde_json::Value) -> Option<ServerSample> {
        if v.get("type")?.as_str()? != "server_sample" {
            return None;
        }
        let num = |k: &str| v.get(k).and_then(serde_json::Value::as_f64);
        let ttft = match (num("ttft_count"), num("ttft_sum_s")) {
            (Some(count), Some(sum)) => Some(super::HistogramValues {
                buckets: v
                    .get("ttft_buckets")
                    .and_then(|b| b.as_array())
                    .map(|b| {
                        b.iter()
                            .filter_map(|p| Some((p.get(0)?.as_f64()?, p.get(1)?.as_f64()?)))
                            .collect()
                    })
                    .unwrap_or_default(),
                sum,
                count,
            }),
            _ => None,
        };
        Some(ServerSample {
            ts_ns: v.get("ts_ns")?.as_u64()?,
            values: VllmValues {
                running: num("running"),
                waiting: num("waiting"),
                generation_tokens_total: num("generation_tokens_total"),
                prompt_tokens_total: num("prompt_tokens_total"),
                kv_cache_usage: num("kv_cache_usage"),
                ttft,
                kv: super::KvValues {
                    num_gpu_blocks: v.get("num_gpu_blocks").and_then(serde_json::Value::as_u64),
                    block_size: v.get("block_size").and_then(serde_json::Value::as_u64),
                    kv_cache_size_tokens: v
                        .get("kv_cache_size_tokens")
                        .and_then(serde_json::Value::as_u64),
                    enable_prefix_caching: v
                        .get("enable_prefix_caching")
                        .and_then(serde_json::Value::as_bool),
                    preemptions_total: num("preemptions_total"),
                },
            },
            proxy_in_flight: v.get("proxy_in_flight").and_then(serde_json::Value::as_u64),
            scrape_ms: num("scrape_ms").unwrap_or(0.0),
        })
    }
}
