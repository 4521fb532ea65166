//! A tolerant reader of the Prometheus text exposition format (0.0.4), and the extraction of the
//! few vLLM series the cross-check keeps.
//!
//! Lines that do not parse are skipped and counted, never fatal: a scrape of a newer or older
//! vLLM must degrade to `null` values, not to an error.

use std::collections::BTreeMap;

use crate::exposition::vllm;

/// One parsed series line: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct PromLine {
    /// Metric name, e.g. `vllm:generation_tokens_total`.
    pub name: String,
    /// Label pairs in the order written.
    pub labels: Vec<(String, String)>,
    /// The sample value (`NaN`, `+Inf`, `-Inf` accepted).
    pub value: f64,
}

/// The result of parsing a whole exposition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromText {
    /// Series lines, in input order.
    pub lines: Vec<PromLine>,
    /// Non-comment, non-blank lines that could not be parsed (skipped).
    pub garbage: u64,
}

/// Parses an exposition; never fails (unparsable lines are counted in `garbage`).
pub fn parse(text: &str) -> PromText {
    let mut out = PromText::default();
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line) {
            Some(l) => out.lines.push(l),
            None => out.garbage += 1,
        }
    }
    out
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// `name{a="x",b="y"} value [timestamp]`; `None` if malformed.
fn parse_line(line: &str) -> Option<PromLine> {
    let name_end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let (l, after) = parse_labels(r)?;
        labels = l;
        rest = after;
    }
    let mut fields = rest.split_whitespace();
    let value = parse_value(fields.next()?)?;
    // An optional integer timestamp; anything further is malformed.
    if let Some(ts) = fields.next() {
        ts.parse::<i64>().ok()?;
    }
    if fields.next().is_some() {
        return None;
    }
    Some(PromLine {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Labels after the `{`; returns them and the text after the closing `}`.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim();
        if key.is_empty() || !key.chars().all(is_name_char) {
            return None;
        }
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        };
        labels.push((key.to_string(), value));
        s = s[end + 1..].trim_start();
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return None;
        }
    }
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse::<f64>().ok(),
    }
}

/// A histogram summed over label sets: cumulative bucket counts by upper bound, sum and count.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramValues {
    /// `(le, cumulative count)`, finite bounds only, ascending; the `+Inf` bucket equals `count`.
    pub buckets: Vec<(f64, f64)>,
    /// `_sum`, seconds.
    pub sum: f64,
    /// `_count`.
    pub count: f64,
}

/// The vLLM series the cross-check keeps, each summed over its `engine`/`model_name` label sets;
/// `None` when the exposition does not carry it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VllmValues {
    /// `vllm:num_requests_running` (gauge).
    pub running: Option<f64>,
    /// `vllm:num_requests_waiting` (gauge).
    pub waiting: Option<f64>,
    /// `vllm:generation_tokens_total` (counter).
    pub generation_tokens_total: Option<f64>,
    /// `vllm:prompt_tokens_total` (counter).
    pub prompt_tokens_total: Option<f64>,
    /// `vllm:kv_cache_usage_perc`, else the deprecated `vllm:gpu_cache_usage_perc` (a fraction
    /// 0..1 per engine): the *mean* over label sets, since a sum of fractions means nothing.
    pub kv_cache_usage: Option<f64>,
    /// `vllm:time_to_first_token_seconds` (histogram).
    pub ttft: Option<HistogramValues>,
    /// The KV cache's size and the preemption counter.
    pub kv: kv::KvValues,
}

/// Name of the KV-cache gauge, and the deprecated name read when it is absent.
pub const KV_CACHE_NAMES: [&str; 2] = [
    vllm::KV_CACHE_USAGE_PERC.name,
    vllm::GPU_CACHE_USAGE_PERC.name,
];

fn sum_of(text: &PromText, name: &str) -> Option<f64> {
    let mut found = None;
    for l in text.lines.iter().filter(|l| l.name == name) {
        if l.value.is_finite() {
            *found.get_or_insert(0.0) += l.value;
        }
    }
    found
}

fn mean_of(text: &PromText, name: &str) -> Option<f64> {
    let (mut n, mut total) = (0u32, 0.0);
    for l in text.lines.iter().filter(|l| l.name == name) {
        if l.value.is_finite() {
            n += 1;
            total += l.value;
        }
    }
    (n > 0).then(|| total / n as f64)
}

fn histogram_of(text: &PromText, base: &str) -> Option<HistogramValues> {
    let bucket_name = format!("{base}_bucket");
    let mut buckets: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for l in text.lines.iter().filter(|l| l.name == bucket_name) {
        let Some(le) = l.labels.iter().find(|(k, _)| k == "le") else {
            continue;
        };
        let Some(bound) = parse_value(&le.1).filter(|b| b.is_finite()) else {
            continue;
        };
        if !l.value.is_finite() {
            continue;
        }
        // Keyed on the bit pattern after normalizing: bounds are positive finite floats, whose
        // bit patterns sort like the values.
        let e = buckets.entry(bound.abs().to_bits()).or_insert((bound, 0.0));
        e.1 += l.value;
    }
    let count = sum_of(text, &format!("{base}_count"));
    let sum = sum_of(text, &format!("{base}_sum"));
    match (count, sum) {
        (Some(count), Some(sum)) => Some(HistogramValues {
            buckets: buckets.into_values().collect(),
            sum,
            count,
        }),
        _ => None,
    }
}

/// Extracts the kept series from a parsed exposition.
pub fn extract(text: &PromText) -> VllmValues {
    VllmValues {
        running: sum_of(text, vllm::NUM_REQUESTS_RUNNING.name),
        waiting: sum_of(text, vllm::NUM_REQUESTS_WAITING.name),
        generation_tokens_total: sum_of(text, vllm::GENERATION_TOKENS_TOTAL.name),
        prompt_tokens_total: sum_of(text, vllm::PROMPT_TOKENS_TOTAL.name),
        kv_cache_usage: KV_CACHE_NAMES.iter().find_map(|n| mean_of(text, n)),
        ttft: histogram_of(text, vllm::TIME_TO_FIRST_TOKEN_SECONDS.name),
        kv: kv::extract_kv(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_with_escapes_and_timestamps() {
        let t = parse("a_b:c{x=\"1\\\"2\",y=\"a\\nb\",} 3.5 1700000000000\nbare 1e3\n");
        assert_eq!(t.garbage, 0);
        assert_eq!(t.lines[0].labels[0], ("x".into(), "1\"2".into()));
        assert_eq!(t.lines[0].labels[1], ("y".into(), "a\nb".into()));
        assert_eq!(t.lines[0].value, 3.5);
        assert_eq!(t.lines[1].value, 1000.0);
    }

    #[test]
    fn garbage_is_counted_not_fatal() {
        let t = parse("ok 1\n{x=\"1\"} 2\nbad{x=1} 3\nnovalue\nx 1 2 3\nv{a=\"b\" 4\ny NaNa\n");
        assert_eq!(t.lines.len(), 1);
        assert_eq!(t.garbage, 6);
    }
}

/// The KV-cache series (kept here: they are read from the same parsed exposition).
pub mod kv {
    use super::PromText;
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
}
