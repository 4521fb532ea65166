//! vLLM's KV-cache configuration and pressure series, read from a scrape: the cache's size
//! (`vllm:cache_config_info`'s labels) and the preemption counter. Each is `None` when the
//! exposition does not carry it (older or newer vLLM releases, another server).

pub use super::prom_text::kv::*;
