//! The exposed metric names, types and label sets, pinned: the proxy's `/stats/metrics` (meter,
//! fleet, OTLP, access log, scrape, build and process series) and the simulator's `/metrics`, read
//! over real sockets after requests of two APIs went through. Dashboards and alert rules query
//! these names (`deploy/grafana`, `grafana/`, the monitoring tests); a change here is a change
//! their users see, so it is made on purpose, in this list.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::common::{post, raw_request, start_sim};
use tokenmeter::sim::SimConfig;

/// Every sample name of the exposition with its family's type and each label-name set it appears
/// with: `name type label,label,...` (no labels: `-`), one line each, sorted.
fn catalog(text: &str) -> BTreeSet<String> {
    let mut types: BTreeMap<&str, &str> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(
                types.insert(name, kind).is_none(),
                "family {name} declared twice"
            );
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, _value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.strip_suffix('}').unwrap()),
            None => (series, ""),
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|s| name.strip_suffix(s))
            .find(|f| types.get(f) == Some(&"histogram"))
            .unwrap_or(name);
        let kind = types
            .get(family)
            .unwrap_or_else(|| panic!("{name} has no # TYPE line before it"));
        let keys: Vec<&str> = if labels.is_empty() {
            vec!["-"]
        } else {
            // Label values here hold no `",` (model and user names are plain).
            labels
                .split("\",")
                .map(|p| p.split_once("=\"").unwrap().0)
                .collect()
        };
        out.insert(format!("{name} {kind} {}", keys.join(",")));
    }
    out
}

fn lines(list: &str) -> BTreeSet<String> {
    list.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

async fn get_text(addr: std::net::SocketAddr, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n");
    let r = raw_request(addr, req.as_bytes()).await;
    assert_eq!(r.status, 200);
    String::from_utf8(r.body).unwrap()
}

/// The proxy's series with the `user` label on (it joins `model` on the counters).
const PROXY: &str = "
    process_cpu_seconds_total counter -
    process_open_fds gauge -
    process_resident_memory_bytes gauge -
    process_start_time_seconds gauge -
    tokenmeter_access_log_dropped_total counter -
    tokenmeter_access_log_failed_total counter -
    tokenmeter_access_log_written_total counter -
    tokenmeter_agent_call_gap_seconds_bucket histogram le
    tokenmeter_agent_call_gap_seconds_count histogram -
    tokenmeter_agent_call_gap_seconds_sum histogram -
    tokenmeter_agent_calls_total counter prefix_audit
    tokenmeter_agent_turn_wait_seconds_bucket histogram le
    tokenmeter_agent_turn_wait_seconds_count histogram -
    tokenmeter_agent_turn_wait_seconds_sum histogram -
    tokenmeter_build_info gauge version
    tokenmeter_completion_tokens_total counter model,api,user
    tokenmeter_e2e_request_latency_seconds_bucket histogram model,le
    tokenmeter_e2e_request_latency_seconds_count histogram model
    tokenmeter_e2e_request_latency_seconds_sum histogram model
    tokenmeter_first_byte_seconds_bucket histogram model,le
    tokenmeter_first_byte_seconds_count histogram model
    tokenmeter_first_byte_seconds_sum histogram model
    tokenmeter_generation_tokens_total counter model,user
    tokenmeter_inter_token_latency_seconds_bucket histogram model,le
    tokenmeter_inter_token_latency_seconds_count histogram model
    tokenmeter_inter_token_latency_seconds_sum histogram model
    tokenmeter_otlp_dropped_total counter -
    tokenmeter_otlp_export_failures_total counter -
    tokenmeter_otlp_exports_total counter -
    tokenmeter_otlp_span_export_failures_total counter -
    tokenmeter_otlp_span_exports_total counter -
    tokenmeter_otlp_spans_dropped_total counter -
    tokenmeter_otlp_spans_exported_total counter -
    tokenmeter_prefix_expected_tokens_total counter -
    tokenmeter_prefix_lost_tokens_total counter -
    tokenmeter_prompt_tokens_total counter model,user
    tokenmeter_requests_in_flight gauge -
    tokenmeter_requests_total counter model,api,user,outcome,status
    tokenmeter_time_per_output_token_seconds_bucket histogram model,le
    tokenmeter_time_per_output_token_seconds_count histogram model
    tokenmeter_time_per_output_token_seconds_sum histogram model
    tokenmeter_time_to_first_token_seconds_bucket histogram model,le
    tokenmeter_time_to_first_token_seconds_count histogram model
    tokenmeter_time_to_first_token_seconds_sum histogram model
    tokenmeter_upstream_completion_tokens_total counter upstream
    tokenmeter_upstream_ejected gauge upstream
    tokenmeter_upstream_failures_total counter upstream
    tokenmeter_upstream_in_flight gauge upstream
    tokenmeter_upstream_prompt_tokens_total counter upstream
    tokenmeter_upstream_requests_total counter upstream,outcome
    tokenmeter_upstream_retries_total counter upstream
    tokenmeter_upstream_scrape_errors_total counter -
    tokenmeter_upstream_scrapes_total counter -
";

/// The KV-cache and saturation gauges: exposed once a scrape gave the upstream's
/// `cache_config_info` and a window holds a scrape (pinned by
/// `kv_and_saturation_gauges_are_pinned`, left out of the simulator run's comparison).
const KV: &str = "
    tokenmeter_kv_blocks_estimate gauge -
    tokenmeter_kv_blocks_server gauge -
    tokenmeter_kv_growth_blocks_per_second gauge -
    tokenmeter_kv_headroom_sequences gauge -
    tokenmeter_kv_sequences_fit_p50_context gauge -
    tokenmeter_kv_sequences_fit_p90_context gauge -
    tokenmeter_kv_sequences_fit_p99_context gauge -
    tokenmeter_kv_time_to_full_seconds gauge -
    tokenmeter_saturation_state gauge -
";

/// The simulator's series: vLLM's names and labels.
const SIM: &str = "
    vllm:cache_config_info gauge _block_size_resolved,block_size,cache_dtype,cache_hit_alignment_tokens,effective_attention_block_size,enable_mamba_shared_prefix_checkpoint,enable_prefix_caching,engine,gpu_memory_utilization,hash_block_size,is_attention_free,kv_cache_dtype_skip_layers,kv_cache_layout,kv_cache_max_concurrency,kv_cache_memory_bytes,kv_cache_size_tokens,kv_offloading_backend,kv_offloading_size,kv_sharing_fast_prefill,mamba_block_size,mamba_cache_dtype,mamba_cache_mode,mamba_page_size_padded,mamba_ssm_cache_dtype,num_cpu_blocks,num_gpu_blocks,num_gpu_blocks_override,prefix_cache_retention_interval,prefix_caching_hash_algo,prefix_match_unit,replayssm_buffer_len,skip_page_size_padded,sliding_window,swa_bounded_replay,use_kda_recoverssm,use_replayssm,user_specified_block_size
    vllm:e2e_request_latency_seconds_bucket histogram engine,le,model_name
    vllm:e2e_request_latency_seconds_count histogram engine,model_name
    vllm:e2e_request_latency_seconds_sum histogram engine,model_name
    vllm:generation_tokens_total counter engine,model_name
    vllm:inter_token_latency_seconds_bucket histogram engine,le,model_name
    vllm:inter_token_latency_seconds_count histogram engine,model_name
    vllm:inter_token_latency_seconds_sum histogram engine,model_name
    vllm:kv_cache_usage_perc gauge engine,model_name
    vllm:num_requests_running gauge engine,model_name
    vllm:num_preemptions_total counter engine,model_name
    vllm:num_requests_waiting gauge engine,model_name
    vllm:num_requests_waiting_by_reason gauge engine,model_name,reason
    vllm:prefix_cache_hits_total counter engine,model_name
    vllm:prefix_cache_queries_total counter engine,model_name
    vllm:prompt_tokens_cached_total counter engine,model_name
    vllm:prompt_tokens_total counter engine,model_name
    vllm:request_queue_time_seconds_bucket histogram engine,le,model_name
    vllm:request_queue_time_seconds_count histogram engine,model_name
    vllm:request_queue_time_seconds_sum histogram engine,model_name
    vllm:request_success_total counter engine,finished_reason,model_name
    vllm:time_to_first_token_seconds_bucket histogram engine,le,model_name
    vllm:time_to_first_token_seconds_count histogram engine,model_name
    vllm:time_to_first_token_seconds_sum histogram engine,model_name
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exposed_names_types_and_labels_are_pinned() {
    let sim = start_sim(SimConfig {
        fixed_pace: true,
        fixed_ttft_ms: 1.0,
        fixed_gap_ms: 1.0,
        ..SimConfig::default()
    })
    .await;
    let sim_url = format!("http://{}", sim.addr());
    // One replica, so the cross-check scrapes it (its counters join the exposition); nothing
    // listens on port 1, so the OTLP counters exist and count failures.
    let proxy = crate::common::TestProxy::start(&sim_url, |c| {
        c.upstream_metrics_url = Some(format!("{sim_url}/metrics"));
        c.otlp_endpoint = Some("http://127.0.0.1:1".into());
        c.meter.metrics_user_label = true;
    })
    .await;
    let chat = r#"{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}"#;
    let messages =
        r#"{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;
    for (path, body) in [("/v1/chat/completions", chat), ("/v1/messages", messages)] {
        let r = raw_request(proxy.addr, &post(path, body, &[("x-tokenmeter-user", "u")])).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    // The scrape counters appear with the first scrape's result.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = get_text(proxy.addr, "/stats/metrics").await;
        if text.contains("tokenmeter_upstream_scrapes_total")
            && text.contains("tokenmeter_requests_total{")
            || Instant::now() > deadline
        {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let kv = lines(KV);
    let found: BTreeSet<String> = catalog(&text).difference(&kv).cloned().collect();
    let want = lines(PROXY);
    assert_eq!(
        found.difference(&want).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "exposed but not pinned\n{text}"
    );
    assert_eq!(
        want.difference(&found).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "pinned but not exposed\n{text}"
    );
    proxy.stop().await;

    let text = get_text(sim.addr(), "/metrics").await;
    assert_eq!(catalog(&text), lines(SIM), "{text}");
}

/// Every `.rs` file under `dir`.
fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn each_exposed_name_is_declared_once_in_the_source() {
    let mut files = Vec::new();
    sources(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let texts: Vec<(String, String)> = files
        .iter()
        .map(|p| (p.display().to_string(), std::fs::read_to_string(p).unwrap()))
        .collect();
    let families: BTreeSet<&str> = PROXY
        .lines()
        .chain(SIM.lines())
        .filter_map(|l| l.split_whitespace().next())
        .map(|n| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n)
        })
        .collect();
    for name in families {
        let literal = format!("\"{name}\"");
        let at: Vec<&str> = texts
            .iter()
            .flat_map(|(path, text)| text.matches(&literal).map(move |_| path.as_str()))
            .collect();
        assert_eq!(at.len(), 1, "{name} is spelled as a literal in {at:?}");
    }
}

#[test]
fn kv_and_saturation_gauges_are_pinned() {
    use tokenmeter::meter::{Meter, MeterConfig};
    use tokenmeter::scrape::prom_text::{extract, parse};
    use tokenmeter::scrape::ServerSample;
    let t0 = 1_800_000_000 * tokenmeter::clock::NANOS_PER_SEC;
    let s = tokenmeter::clock::NANOS_PER_SEC;
    let mut m = Meter::new(MeterConfig::default(), t0);
    m.enable_server(10.0);
    let values = extract(&parse(include_str!(
        "../fixtures/vllm/agents/metrics_after.txt"
    )));
    m.request_started(t0, 1, "u", Some("m"));
    let mut r = crate::meter_support::record(t0, 500.0, Some(100.0), Some(10), Some(90), true);
    r.request_id = "tm-0-1".into();
    m.request_finished(t0 + s / 2, &r);
    for at in [t0 + s, t0 + 13 * s] {
        m.server_sample(ServerSample {
            ts_ns: at,
            values: values.clone(),
            proxy_in_flight: None,
            scrape_ms: 1.0,
        });
    }
    // A request that grows by a block: the estimate's growth and time to full are exposed.
    m.request_started(t0 + 2 * s, 2, "u", Some("m"));
    m.prompt_tokens(2, 1024);
    m.tokens(t0 + 12 * s, 2, 1);
    let found: BTreeSet<String> = catalog(&m.prometheus(t0 + 14 * s))
        .into_iter()
        .filter(|l| l.starts_with("tokenmeter_kv_") || l.starts_with("tokenmeter_saturation"))
        .collect();
    assert_eq!(found, lines(KV));
}
