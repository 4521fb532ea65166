//! Agent sessions against two truths, over real sockets: `load --agents` (its own record of the
//! sessions, turns, calls and tokens it sent and heard) through the proxy to the simulator (its
//! prefix cache's counters, `/sim/truth`). Each agent runs a set number of sessions, so the run
//! ends with no call cut at a deadline and every figure compares exactly
//! (docs/sessions.md, "Verified against the simulator").
//! - Ample cache: the proxy's sessions (access log, `/stats`, `analyze`) equal load's record;
//!   every call that extends its session's previous one reported exactly the expected cached
//!   tokens; the reported cached tokens sum to the simulator's `prompt_tokens_cached`.
//! - Thrashing cache (more agents' contexts than blocks, fewer running sequences than that, so
//!   no preemption): the audit shows lost prefixes, those calls' TTFT exceeds the kept calls',
//!   and the simulator's eviction count is exactly the block balance the log implies, with the
//!   audit's lost blocks a lower bound of it.
//! - Both: the audit per in-flight level and per user, live and offline, equals the truth
//!   (`sessions_audit`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokenmeter::load::{
    run, AgentSpec, AgentsReport, Api, Arrivals, Dist, LoadOptions, NoProgress,
};
use tokenmeter::proxy::session::pseudonym;
use tokenmeter::sim::SimConfig;

use crate::common::{raw_request, start_sim, TempDir, TestProxy};

/// The prefix cache's block size in the simulator and the audit.
const B: u64 = 16;

async fn get_json(addr: std::net::SocketAddr, path: &str) -> Value {
    let req = format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n");
    let r = raw_request(addr, req.as_bytes()).await;
    assert_eq!(r.status, 200, "{path}");
    serde_json::from_slice(&r.body).unwrap()
}

/// One session as the proxy's lines show it.
#[derive(Debug, Default, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Tally {
    calls: u64,
    turns: u64,
    prompt: u64,
    completion: u64,
    cached: Option<u64>,
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The sessions of the log's generation lines, by pseudonym.
fn tally(lines: &[Value]) -> BTreeMap<String, Tally> {
    let mut turns: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut out: BTreeMap<String, Tally> = BTreeMap::new();
    for l in lines.iter().filter(|l| l["session"].is_string()) {
        let s = l["session"].as_str().unwrap().to_string();
        let t = out.entry(s.clone()).or_default();
        t.calls += 1;
        t.prompt += u(&l["prompt_tokens"]);
        t.completion += u(&l["completion_tokens"]);
        if let Some(c) = l["cached_prompt_tokens"].as_u64() {
            t.cached = Some(t.cached.unwrap_or(0) + c);
        }
        let turn = l["turn"].as_u64().expect("every agent call has a turn");
        let e = turns.entry(s).or_insert((turn, turn));
        *e = (e.0.min(turn), e.1.max(turn));
    }
    for (s, (lo, hi)) in turns {
        out.get_mut(&s).unwrap().turns = hi - lo + 1;
    }
    out
}

/// Runs `agents` agents of `spec` through a proxy to a simulator of `sim`; returns load's
/// report, the proxy's `/stats` once it counted every call, its log lines and the
/// simulator's truth.
async fn run_through(
    sim: SimConfig,
    agents: usize,
    spec: AgentSpec,
) -> (
    AgentsReport,
    Value,
    Vec<Value>,
    tokenmeter::sim::truth::KvTruth,
) {
    let sim = start_sim(sim).await;
    let proxy = TestProxy::start(&format!("http://{}", sim.addr()), |_| {}).await;
    let mut opts = LoadOptions::agents(
        format!("http://{}", proxy.addr),
        Arrivals::Agents { agents },
        spec,
        Duration::from_secs(60),
    );
    opts.api = Api::Chat;
    let report = run(opts, NoProgress).await.unwrap();
    let a = report.agents.unwrap();
    assert_eq!(a.cancelled_at_deadline, 0, "every agent ran its sessions");
    assert!(
        a.wall_s < 30.0,
        "the run ended when the agents did: {} s",
        a.wall_s
    );
    // /stats answers after every finish queued before the query: wait for the last ones.
    let deadline = Instant::now() + Duration::from_secs(5);
    let stats = loop {
        let s = get_json(proxy.addr, "/stats").await;
        let v = &s["sessions"];
        let calls = v["top"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| u(&r["calls"]))
            .sum::<u64>()
            + u(&v["other"]["calls"]);
        if calls >= a.sessions.calls || Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let user = stats["sessions"]["top"][0]["user"]
        .as_str()
        .unwrap()
        .to_string();
    let mine = get_json(proxy.addr, &format!("/stats?user={user}")).await;
    user_filter_holds(&stats["sessions"], &mine["sessions"], &user);
    let truth = sim.kv_truth();
    let lines = proxy.finish().await;
    sim.shutdown().await;
    (a, stats, lines, truth)
}

fn spec(apis: Vec<Api>, prompt_words: &str, sessions: u64) -> AgentSpec {
    AgentSpec {
        apis,
        think_ms: Dist::parse("1..20").unwrap(),
        prompt_words: Dist::parse(prompt_words).unwrap(),
        output_tokens: Dist::parse("8..40").unwrap(),
        stream_share: 0.5,
        turns_per_session: Dist::parse("1..3").unwrap(),
        calls_per_turn: Dist::parse("1..3").unwrap(),
        sessions_per_agent: Some(sessions),
        seed: 35,
    }
}

/// The proxy's sessions equal load's record, session by session (the pseudonym of the id load
/// sent for Responses and Messages; chat sends none, so there the multiset of sessions).
fn sessions_equal_loads(a: &AgentsReport, lines: &[Value]) -> BTreeMap<String, Tally> {
    let proxy = tally(lines);
    let t = &a.sessions;
    let sum = |f: fn(&Tally) -> u64| proxy.values().map(f).sum::<u64>();
    assert_eq!(proxy.len() as u64, t.sessions, "sessions");
    assert_eq!(sum(|x| x.calls), t.calls, "calls");
    assert_eq!(sum(|x| x.turns), t.turns, "turns");
    assert_eq!(sum(|x| x.prompt), t.prompt_tokens, "prompt tokens");
    assert_eq!(
        sum(|x| x.completion),
        t.completion_tokens,
        "completion tokens"
    );
    let cached: Option<u64> = proxy.values().filter_map(|x| x.cached).reduce(|x, y| x + y);
    assert_eq!(cached, t.cached_tokens, "cached tokens");
    let mut theirs: Vec<Tally> = Vec::new();
    for s in &t.per_session {
        let mine = Tally {
            calls: s.calls,
            turns: u64::from(s.turns),
            prompt: s.prompt_tokens,
            completion: s.completion_tokens,
            cached: s.cached_tokens,
        };
        if s.api != "chat" {
            assert_eq!(
                proxy.get(&pseudonym(&s.id)),
                Some(&mine),
                "session {}",
                s.id
            );
        }
        theirs.push(mine);
    }
    let mut ours: Vec<Tally> = proxy.values().cloned().collect();
    theirs.sort();
    ours.sort();
    assert_eq!(ours, theirs);
    proxy
}

/// `/stats?user=`'s sessions are the unfiltered view's rows of that user (every session is in the
/// unfiltered top here), in the same order, nothing in `other`; the audit lists that user alone.
fn user_filter_holds(all: &Value, mine: &Value, user: &str) {
    let without_idle = |r: &Value| {
        let mut r = r.clone();
        r.as_object_mut().unwrap().remove("idle_s");
        r
    };
    assert_eq!(u(&all["other"]["sessions"]), 0, "every session listed");
    let want: Vec<Value> = (all["top"].as_array().unwrap().iter())
        .filter(|r| r["user"] == user)
        .map(without_idle)
        .collect();
    let got: Vec<Value> = mine["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(without_idle)
        .collect();
    assert!(!got.is_empty());
    assert_eq!(got, want, "{user}'s sessions");
    assert_eq!(u(&mine["active"]), want.len() as u64);
    assert_eq!(
        (u(&mine["other"]["sessions"]), u(&mine["other"]["calls"])),
        (0, 0)
    );
    let by_user = mine["audit"]["by_user"].as_array().unwrap();
    assert!(by_user.iter().all(|r| r["user"] == user), "{by_user:?}");
    assert_eq!(mine["audit"]["total"], all["audit"]["total"]);
}

/// `/stats` sessions: every session seen, every call counted, the wait summed.
fn stats_equal_log(stats: &Value, proxy: &BTreeMap<String, Tally>, lines: &[Value]) {
    let v = &stats["sessions"];
    assert_eq!(u(&v["seen"]), proxy.len() as u64);
    assert_eq!(
        u(&v["active"]),
        proxy.len() as u64,
        "all within the active window"
    );
    let top = v["top"].as_array().unwrap();
    let calls: u64 = top.iter().map(|r| u(&r["calls"])).sum::<u64>() + u(&v["other"]["calls"]);
    let agent_lines: Vec<&Value> = lines.iter().filter(|l| l["session"].is_string()).collect();
    assert_eq!(calls, agent_lines.len() as u64);
    let wait: f64 = top
        .iter()
        .map(|r| r["wait_ms"].as_f64().unwrap())
        .sum::<f64>()
        + v["other"]["wait_ms"].as_f64().unwrap();
    let e2e: f64 = agent_lines
        .iter()
        .map(|l| l["e2e_ms"].as_f64().unwrap())
        .sum();
    assert!((wait - e2e).abs() < 1e-6 * e2e.max(1.0), "{wait} vs {e2e}");
    for w in top.windows(2) {
        assert!(
            w[0]["wait_ms"].as_f64() >= w[1]["wait_ms"].as_f64(),
            "by wait"
        );
    }
    for r in top {
        let t = &proxy[r["session"].as_str().unwrap()];
        assert_eq!((u(&r["calls"]), u(&r["turns"])), (t.calls, t.turns));
        assert_eq!(r["cached_tokens"].as_u64(), t.cached);
    }
}

/// `analyze` on the same log: the same sessions.
fn analyze_equals_log(lines: &[Value], proxy: &BTreeMap<String, Tally>) -> Value {
    let dir = TempDir::new("sessions-analyze");
    let path = dir.0.join("access.jsonl");
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&path, text).unwrap();
    let r = tokenmeter::analyze::analyze(&[path], &Default::default()).unwrap();
    let v = serde_json::to_value(&r).unwrap();
    crate::common::assert_schema("analyze.schema.json", &v);
    let s = v["sessions"].clone();
    assert_eq!(u(&s["sessions"]), proxy.len() as u64);
    assert_eq!(u(&s["calls"]), proxy.values().map(|t| t.calls).sum::<u64>());
    assert_eq!(u(&s["turns"]), proxy.values().map(|t| t.turns).sum::<u64>());
    assert!(u(&s["wait_per_turn"]["count"]) > 0);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ample_cache_every_figure_equals_loads_record_and_the_simulators_truth() {
    let sim = SimConfig {
        enable_prompt_tokens_details: true,
        max_model_len: 16384,
        num_gpu_blocks: 65536,
        step_base_ms: 1.0,
        step_per_seq_ms: 0.0,
        log_stats_interval_s: 0.0,
        ..SimConfig::default()
    };
    let apis = vec![Api::Responses, Api::Messages, Api::Chat];
    let (a, stats, lines, truth) = run_through(sim, 6, spec(apis, "20..200", 2)).await;
    assert!(lines.iter().all(|l| l["outcome"] == "ok"), "no failed call");
    let proxy = sessions_equal_loads(&a, &lines);
    assert_eq!(proxy.len(), 12, "6 agents x 2 sessions");
    assert!(
        a.sessions.turns > a.sessions.sessions,
        "sessions of several turns"
    );
    stats_equal_log(&stats, &proxy, &lines);
    let s = analyze_equals_log(&lines, &proxy);

    // The simulator's truth: every reported cached token, and each extending call's expectation.
    let cached: u64 = lines.iter().map(|l| u(&l["cached_prompt_tokens"])).sum();
    assert_eq!(cached, truth.prompt_tokens_cached);
    assert_eq!((truth.evictions, truth.preemptions), (0, 0));
    let mut extending = 0;
    for l in lines.iter().filter(|l| l["session"].is_string()) {
        match l["prefix_audit"].as_str().unwrap() {
            "kept" => {
                assert_eq!(
                    l["prefix_expected_tokens"], l["cached_prompt_tokens"],
                    "{l}"
                );
                extending += 1;
            }
            "first_call" => {}
            other => panic!("{other}: {l}"),
        }
    }
    assert_eq!(extending, a.sessions.calls - 12);
    assert_eq!(u(&s["audit"]["lost_tokens"]), 0);
    let levels = crate::sessions_audit::audit_equals_truth(&stats, &s, &lines);
    assert!(levels.values().all(|t| t.lost_tokens == 0));
    assert_eq!(u(&s["audit"]["by_verdict"]["kept"]), extending);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thrashing_cache_the_audit_shows_the_lost_prefixes_and_the_evictions_balance() {
    // 10 agents' contexts (each up to ~2,000 tokens, ~125 blocks) against 400 usable blocks,
    // with at most 3 sequences running (so the running ones fit: no preemption, asserted
    // below), and prefill slow enough that a lost prefix costs TTFT.
    let sim = SimConfig {
        enable_prompt_tokens_details: true,
        max_model_len: 4096,
        max_num_seqs: 3,
        num_gpu_blocks: 401,
        prefill_tok_s: 16000.0,
        cold_start_ms: 0.0,
        step_base_ms: 1.0,
        step_per_seq_ms: 0.0,
        log_stats_interval_s: 0.0,
        ..SimConfig::default()
    };
    let apis = vec![Api::Responses, Api::Chat];
    let (a, stats, lines, truth) = run_through(sim, 10, spec(apis, "200..400", 2)).await;
    assert!(lines.iter().all(|l| l["outcome"] == "ok"), "no failed call");
    assert_eq!(truth.preemptions, 0, "the balance below assumes none");
    let proxy = sessions_equal_loads(&a, &lines);
    stats_equal_log(&stats, &proxy, &lines);
    let s = analyze_equals_log(&lines, &proxy);
    let cached: u64 = lines.iter().map(|l| u(&l["cached_prompt_tokens"])).sum();
    assert_eq!(cached, truth.prompt_tokens_cached);

    // The audit: lost prefixes, and what they cost.
    let lost: Vec<&Value> = lines
        .iter()
        .filter(|l| l["prefix_audit"] == "lost")
        .collect();
    let kept: Vec<&Value> = lines
        .iter()
        .filter(|l| l["prefix_audit"] == "kept")
        .collect();
    assert!(lost.len() >= 5, "{} lost, {} kept", lost.len(), kept.len());
    let lost_tokens: u64 = lost.iter().map(|l| u(&l["prefix_lost_tokens"])).sum();
    assert_eq!(lost_tokens, u(&s["audit"]["lost_tokens"]));
    for l in &lost {
        let (e, c) = (
            u(&l["prefix_expected_tokens"]),
            u(&l["cached_prompt_tokens"]),
        );
        assert_eq!(u(&l["prefix_lost_tokens"]), e - c);
        assert_eq!(c % B, 0, "whole blocks");
    }
    // TTFT of the streamed ones (a non-streamed call has none).
    let mean = |v: &[&Value]| {
        let t: Vec<f64> = v.iter().filter_map(|l| l["ttft_ms"].as_f64()).collect();
        t.iter().sum::<f64>() / t.len().max(1) as f64
    };
    let (ttft_lost, ttft_kept) = (mean(&lost), mean(&kept));
    assert!(
        ttft_lost > ttft_kept,
        "lost {ttft_lost:.1} ms vs kept {ttft_kept:.1} ms"
    );
    let streamed_lost = lost.iter().filter(|l| l["ttft_ms"].is_number()).count();
    assert_eq!(s["audit"]["ttft_lost"]["count"], streamed_lost);
    // Per level and per user, live and offline, against the truth.
    let levels = crate::sessions_audit::audit_equals_truth(&stats, &s, &lines);
    assert!(levels.len() >= 2, "several in-flight levels");
    for (n, t) in &levels {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        eprintln!(
            "level {n}: kept {} lost {} first {}; expected {} cached {} lost {} tokens; TTFT kept {:.1} ms ({}), lost {:.1} ms ({})",
            t.kept, t.lost, t.first, t.expected, t.cached, t.lost_tokens,
            mean(&t.ttft_kept), t.ttft_kept.len(), mean(&t.ttft_lost), t.ttft_lost.len()
        );
    }

    // Evictions. Every full block a call computes is registered once (no two agents share a
    // block: their instructions differ; one session of an agent at a time) and leaves the
    // cache only by eviction, so evictions = Σ (full blocks of prompt + output − cached
    // blocks) − blocks still cached. Each block the audit counts lost was evicted between
    // two calls of its session, a distinct eviction each time: a lower bound.
    let registered: u64 = lines
        .iter()
        .map(|l| {
            (u(&l["prompt_tokens"]) + u(&l["completion_tokens"])) / B
                - u(&l["cached_prompt_tokens"]) / B
        })
        .sum();
    assert_eq!(truth.evictions, registered - truth.cached_blocks);
    assert!(lost_tokens / B <= truth.evictions);
    eprintln!(
        "thrash: {} ({:.1} s): {} calls, {} lost ({} tokens, {} blocks), {} kept; TTFT lost {ttft_lost:.1} ms, kept {ttft_kept:.1} ms; evictions {} (registered {registered}, cached at end {})",
        s["audit"]["by_verdict"],
        a.wall_s,
        lines.len(),
        lost.len(),
        lost_tokens,
        lost_tokens / B,
        kept.len(),
        truth.evictions,
        truth.cached_blocks
    );
}
