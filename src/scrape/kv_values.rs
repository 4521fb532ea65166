//! vLLM's KV-cache configuration and pressure series, read from a scrape: the cache's size
//! (`vllm:cache_config_info`'s labels) and the preemption counter. Each is `None` when the
//! exposition does not carry it (older or newer vLLM releases, another server).

use super::prom_text::PromText;
use crate::exposition::vllm;

/// vLLM's info gauge whose labels carry the cache configuration (value 1).
pub const CACHE_CONFIG_INFO: &str = vllm::CACHE_CONFIG_INFO.name;
/// vLLM's counter of preemptions (a running sequence evicted for want of a KV block).
pub const NUM_PREEMPTIONS_TOTAL: &str = vllm::NUM_PREEMPTIONS_TOTAL.name;

/// The KV-cache series kept per scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvValues {
    /// `num_gpu_blocks` of `cache_config_info`, summed over engines (each engine has its own
    /// cache).
    pub num_gpu_blocks: Option<u64>,
    /// `block_size` of `cache_config_info`, tokens per block (the first engine's).
    pub block_size: Option<u64>,
    /// `kv_cache_size_tokens` of `cache_config_info`, summed over engines: the cache in tokens,
    /// used where blocks are absent.
    pub kv_cache_size_tokens: Option<u64>,
    /// `enable_prefix_caching` of `cache_config_info` (the first engine's).
    pub enable_prefix_caching: Option<bool>,
    /// `vllm:num_preemptions_total`, summed over label sets (a counter).
    pub preemptions_total: Option<f64>,
}

fn label_u64(labels: &[(String, String)], key: &str) -> Option<u64> {
    let v = labels.iter().find(|(k, _)| k == key)?.1.as_str();
    // vLLM writes some integers as floats ("512.0"); "None" means unset.
    v.parse::<u64>().ok().or_else(|| {
        v.parse::<f64>()
            .ok()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(|f| f as u64)
    })
}

fn add(acc: &mut Option<u64>, v: Option<u64>) {
    if let Some(v) = v {
        *acc = Some(acc.unwrap_or(0) + v);
    }
}

/// Extracts the KV-cache series from a parsed exposition.
pub fn extract_kv(text: &PromText) -> KvValues {
    let mut out = KvValues::default();
    for l in text.lines.iter().filter(|l| l.name == CACHE_CONFIG_INFO) {
        add(
            &mut out.num_gpu_blocks,
            label_u64(&l.labels, "num_gpu_blocks"),
        );
        add(
            &mut out.kv_cache_size_tokens,
            label_u64(&l.labels, "kv_cache_size_tokens"),
        );
        if out.block_size.is_none() {
            out.block_size = label_u64(&l.labels, "block_size").filter(|b| *b > 0);
        }
        if out.enable_prefix_caching.is_none() {
            out.enable_prefix_caching = l
                .labels
                .iter()
                .find(|(k, _)| k == "enable_prefix_caching")
                .and_then(|(_, v)| match v.as_str() {
                    "True" | "true" => Some(true),
                    "False" | "false" => Some(false),
                    _ => None,
                });
        }
    }
    for l in text
        .lines
        .iter()
        .filter(|l| l.name == NUM_PREEMPTIONS_TOTAL)
    {
        if l.value.is_finite() {
            *out.preemptions_total.get_or_insert(0.0) += l.value;
        }
    }
    out
}
