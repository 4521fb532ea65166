//! `load --agents` sends real sessions: each API's agent identity (Codex CLI's headers and
//! `prompt_cache_key` on Responses, Claude Code's header, `metadata.user_id` and `?beta=true` on
//! Messages, nothing on chat), every call resending the previous one extended, and a truth record
//! that adds up. Against the simulator, the cached tokens load reports are the ones the
//! simulator counted.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use tokenmeter::load::{run, AgentSpec, Api, Arrivals, Dist, LoadOptions, NoProgress};
use tokenmeter::sim::SimConfig;

/// A request as the recorder saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A non-streamed answer of `api` saying "done", reporting 7 cached tokens where the API does.
fn answer(api: Api) -> String {
    match api {
        Api::Responses => r#"{"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]}],"usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":7},"output_tokens":2,"total_tokens":42}}"#.into(),
        Api::Messages => r#"{"type":"message","role":"assistant","content":[{"type":"text","text":"done"}],"usage":{"input_tokens":40,"output_tokens":2,"cache_read_input_tokens":7}}"#.into(),
        _ => r#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}],"usage":{"prompt_tokens":40,"completion_tokens":2,"total_tokens":42,"prompt_tokens_details":{"cached_tokens":7}}}"#.into(),
    }
}

/// A keep-alive HTTP/1.1 server recording every request and answering `body`.
async fn recorder(body: String) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = l.accept().await else {
                return;
            };
            let (seen, body) = (s2.clone(), body.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut tmp = vec![0u8; 65536];
                loop {
                    let head_end = loop {
                        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break p;
                        }
                        match c.read(&mut tmp).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&tmp[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                    let mut lines = head.split("\r\n");
                    let path = lines.next().unwrap().split(' ').nth(1).unwrap().to_string();
                    let headers: Vec<(String, String)> = lines
                        .filter_map(|l| l.split_once(':'))
                        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                        .collect();
                    let len: usize = headers
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                        .map_or(0, |(_, v)| v.parse().unwrap());
                    while buf.len() < head_end + 4 + len {
                        match c.read(&mut tmp).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&tmp[..n]),
                        }
                    }
                    let b: Value = serde_json::from_slice(&buf[head_end + 4..head_end + 4 + len])
                        .unwrap_or(Value::Null);
                    buf.drain(..head_end + 4 + len);
                    seen.lock().unwrap().push(Seen {
                        path,
                        headers,
                        body: b,
                    });
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if c.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, seen)
}

fn spec() -> AgentSpec {
    AgentSpec {
        think_ms: Dist::parse("5").unwrap(),
        prompt_words: Dist::parse("20").unwrap(),
        output_tokens: Dist::parse("10").unwrap(),
        stream_share: 0.0,
        turns_per_session: Dist::parse("2").unwrap(),
        calls_per_turn: Dist::parse("2").unwrap(),
        ..AgentSpec::default()
    }
}

/// The texts a call's conversation carries, in order, whatever JSON form holds them.
fn texts(api: Api, b: &Value) -> Vec<String> {
    let text_of = |c: &Value| match c {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    };
    let items = match api {
        Api::Responses => &b["input"],
        _ => &b["messages"],
    };
    items
        .as_array()
        .unwrap()
        .iter()
        .map(|m| text_of(&m["content"]))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_send_their_session_identity_and_extend_the_conversation() {
    for api in [Api::Responses, Api::Messages, Api::Chat] {
        let (url, seen) = recorder(answer(api)).await;
        let mut opts = LoadOptions::agents(
            url,
            Arrivals::Agents { agents: 2 },
            spec(),
            Duration::from_millis(600),
        );
        opts.api = api;
        opts.model = Some("m".into());
        let report = run(opts, NoProgress).await.unwrap();
        let a = report.agents.unwrap();
        let seen: Vec<Seen> = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.path.starts_with("/v1/"))
            .cloned()
            .collect();
        assert!(seen.len() >= 4, "{api:?}: {} calls", seen.len());
        let mut by_session: std::collections::BTreeMap<String, Vec<&Seen>> = Default::default();
        for s in &seen {
            let id = match api {
                Api::Responses => {
                    let id = s.header("session-id").unwrap().to_string();
                    assert_eq!(s.header("thread-id"), Some(id.as_str()));
                    assert_eq!(s.header("x-client-request-id"), Some(id.as_str()));
                    let meta: Value =
                        serde_json::from_str(s.header("x-codex-turn-metadata").unwrap()).unwrap();
                    assert_eq!(meta["session_id"], id.as_str());
                    assert_eq!(meta["thread_id"], id.as_str());
                    assert_eq!(meta["history_initialization"], "new");
                    assert_eq!(s.body["prompt_cache_key"], id.as_str());
                    assert_eq!(s.body["store"], false);
                    assert_eq!(s.body["input"][0]["role"], "developer");
                    assert_eq!(s.path, "/v1/responses");
                    id
                }
                Api::Messages => {
                    let id = s.header("x-claude-code-session-id").unwrap().to_string();
                    let uid: Value =
                        serde_json::from_str(s.body["metadata"]["user_id"].as_str().unwrap())
                            .unwrap();
                    assert_eq!(uid["session_id"], id.as_str());
                    assert_eq!(uid["account_uuid"], "");
                    assert_eq!(uid["device_id"].as_str().unwrap().len(), 64);
                    assert_eq!(s.path, "/v1/messages?beta=true");
                    assert_eq!(s.body["system"][0]["cache_control"]["type"], "ephemeral");
                    id
                }
                _ => {
                    for h in ["session-id", "x-claude-code-session-id", "thread-id"] {
                        assert!(s.header(h).is_none(), "chat sends no {h}");
                    }
                    // Chat's calls have no id: a session is its system prompt + first message.
                    texts(api, &s.body)[..2].join("|")
                }
            };
            by_session.entry(id).or_default().push(s);
        }
        for calls in by_session.values() {
            for w in calls.windows(2) {
                let (prev, next) = (texts(api, &w[0].body), texts(api, &w[1].body));
                assert_eq!(
                    next[..prev.len()],
                    prev[..],
                    "{api:?}: a call resends the previous"
                );
                assert_eq!(next[prev.len()], "done", "then the previous answer");
                // Then a user's message (a new turn), or the tool call and its result in the
                // API's own form.
                let items = match api {
                    Api::Responses => &w[1].body["input"],
                    _ => &w[1].body["messages"],
                };
                let new: Vec<&Value> = items.as_array().unwrap()[prev.len()..].iter().collect();
                let tool = |v: &Value| match api {
                    Api::Responses => v["type"] == "function_call_output",
                    Api::Messages => v["content"][0]["type"] == "tool_result",
                    _ => v["role"] == "tool",
                };
                let last = new[new.len() - 1];
                if tool(last) {
                    let (call, id) = match api {
                        Api::Responses => (new[1]["call_id"].clone(), last["call_id"].clone()),
                        Api::Messages => (
                            new[0]["content"][1]["id"].clone(),
                            last["content"][0]["tool_use_id"].clone(),
                        ),
                        _ => (
                            new[0]["tool_calls"][0]["id"].clone(),
                            last["tool_call_id"].clone(),
                        ),
                    };
                    assert!(call.is_string(), "{api:?}: the tool call {new:?}");
                    assert_eq!(call, id, "{api:?}: the result answers the call");
                    let n = if api == Api::Responses { 3 } else { 2 };
                    assert_eq!(new.len(), n, "{api:?}: {new:?}");
                } else {
                    assert_eq!(last["role"], "user", "{api:?}: {last}");
                    assert_eq!(new.len(), 2, "{api:?}: the answer and the user's message");
                }
            }
        }
        // The truth record adds up: finished calls, turns of 2 calls, 7 cached tokens each.
        let t = &a.sessions;
        let finished = a.results.len() as u64;
        assert_eq!(t.calls, finished);
        assert_eq!(t.per_session.iter().map(|s| s.calls).sum::<u64>(), t.calls);
        assert_eq!(t.calls_reporting_cached, finished);
        assert_eq!(t.cached_tokens, Some(7 * finished));
        // Anthropic's input_tokens leaves the cached part out: the prompt is 40 + 7 there.
        let prompt = if api == Api::Messages { 47 } else { 40 };
        assert_eq!(t.prompt_tokens, prompt * finished);
        assert_eq!(t.completion_tokens, 2 * finished);
        for s in &t.per_session {
            assert!(s.turns <= 2 && s.calls <= 4 && s.calls > 0, "{s:?}");
            assert!(u64::from(s.turns) >= s.calls.div_ceil(2), "{s:?}");
            assert_eq!(s.api, api.as_str());
        }
        if api != Api::Chat {
            assert!(
                t.sessions >= by_session.len() as u64 - 2,
                "sessions cut at the deadline may be missing"
            );
            assert!(by_session.values().any(|c| c.len() == 4), "a whole session");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_tokens_load_reports_are_the_simulators() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim = tokenmeter::sim::spawn(
        SimConfig {
            enable_prompt_tokens_details: true,
            stop_probability_per_token: 0.0,
            log_stats_interval_s: 0.0,
            step_base_ms: 1.0,
            step_per_seq_ms: 0.0,
            ..SimConfig::default()
        },
        l,
    )
    .await
    .unwrap();
    let mut opts = LoadOptions::agents(
        format!("http://{}", sim.addr()),
        Arrivals::Agents { agents: 3 },
        AgentSpec {
            apis: vec![Api::Responses, Api::Messages, Api::Chat],
            stream_share: 0.5,
            ..spec()
        },
        Duration::from_millis(1500),
    );
    opts.ignore_eos = true;
    let report = run(opts, NoProgress).await.unwrap();
    let a = report.agents.unwrap();
    let t = &a.sessions;
    assert!(t.calls >= 6, "{t:?}");
    let reported = t.cached_tokens.unwrap_or(0);
    assert!(reported > 0, "later calls find the earlier ones: {t:?}");
    let truth = sim.kv_truth();
    if a.cancelled_at_deadline == 0 {
        assert_eq!(reported, truth.prompt_tokens_cached);
    } else {
        assert!(reported <= truth.prompt_tokens_cached);
    }
    sim.shutdown().await;
}
