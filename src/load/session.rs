//! An agent's session as real coding agents send it: the conversation resent in full and
//! extended by each call (the previous input, the previous answer, one new item: a tool result
//! within a turn, a user message starting the next), and the agent's own session identity
//! (Codex CLI's headers and `prompt_cache_key` on Responses, Claude Code's header and
//! `metadata.user_id` on Messages, nothing on chat: a plain SDK).

use rand::Rng;
use serde::Serialize;
use serde_json::{json, Value};

use super::api::Api;

/// A random UUID string: version 7 (Codex's thread ids) or 4 (Claude Code's session ids).
pub fn uuid(rng: &mut impl Rng, version: u8) -> String {
    let mut b: [u8; 16] = rng.gen();
    b[6] = (b[6] & 0x0f) | (version << 4);
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// One item of the conversation.
#[derive(Debug, Clone)]
enum Item {
    User(String),
    /// The model's answer, and the tool call the agent made of it when a tool's result follows.
    Assistant(String, Option<String>),
    /// A tool's result: the call's id and the output.
    ToolResult(String, String),
}

/// The tool every load agent calls, by API: Codex's, Claude Code's, a plain SDK's.
fn tool_name(api: Api) -> &'static str {
    match api {
        Api::Responses => "exec_command",
        Api::Messages => "Bash",
        _ => "run",
    }
}

/// The arguments of the tool call (a JSON object, as a string where the API sends one).
const TOOL_ARGS: &str = r#"{"cmd":"ls"}"#;

/// One agent's session in progress.
#[derive(Debug, Clone)]
pub struct Session {
    /// The API spoken.
    pub api: Api,
    /// The session's id (Codex's thread id, Claude Code's session id; chat and completions
    /// clients send none, the id is load's own).
    pub id: String,
    /// The agent's device (Claude Code's `device_id`, 64 hex digits; same for all its sessions).
    device_id: String,
    /// The current turn's id (Codex's `turn_id`).
    turn_id: String,
    /// Turns started (the current one included).
    pub turns: u32,
    /// The agent's instructions (the same in every session of the agent).
    system: String,
    items: Vec<Item>,
}

impl Session {
    /// A new session of an agent speaking `api` with instructions `system`.
    pub fn new(api: Api, system: String, device_id: String, rng: &mut impl Rng) -> Self {
        Session {
            api,
            id: uuid(rng, if api == Api::Messages { 4 } else { 7 }),
            device_id,
            turn_id: String::new(),
            turns: 0,
            system,
            items: Vec::new(),
        }
    }

    /// Starts a turn with the user's message.
    pub fn user(&mut self, text: String, rng: &mut impl Rng) {
        self.turn_id = uuid(rng, 7);
        self.turns += 1;
        self.items.push(Item::User(text));
    }

    /// The answer of the last call, as the next call resends it.
    pub fn assistant(&mut self, text: String) {
        self.items.push(Item::Assistant(text, None));
    }

    /// A tool's output, continuing the turn, in each API's own form as the agents send it
    /// (chat `role: "tool"`, Responses `function_call_output`, Messages `tool_result` blocks):
    /// the answer before it becomes the tool call it answers (the simulator answers in text;
    /// the agent's call is `run`/`exec_command`/`Bash` with the same arguments).
    pub fn tool_result(&mut self, text: String, rng: &mut impl Rng) {
        let id = format!("call_{:016x}", rng.gen::<u64>());
        match self.items.last_mut() {
            Some(Item::Assistant(_, call)) => *call = Some(id.clone()),
            _ => self
                .items
                .push(Item::Assistant(String::new(), Some(id.clone()))),
        }
        self.items.push(Item::ToolResult(id, text));
    }

    /// The path of the next call (Claude Code asks with `?beta=true`).
    pub fn path(&self) -> String {
        match self.api {
            Api::Messages => format!("{}?beta=true", self.api.path()),
            _ => self.api.path().to_string(),
        }
    }

    /// The session's headers on the next call, as the agent sends them.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        match self.api {
            Api::Responses => {
                let meta = json!({
                    "session_id": self.id, "thread_id": self.id, "turn_id": self.turn_id,
                    "history_initialization": "new", "request_kind": "turn",
                });
                vec![
                    ("session-id", self.id.clone()),
                    ("thread-id", self.id.clone()),
                    ("x-client-request-id", self.id.clone()),
                    ("x-codex-turn-metadata", meta.to_string()),
                    ("originator", "codex_exec".to_string()),
                ]
            }
            Api::Messages => vec![("X-Claude-Code-Session-Id", self.id.clone())],
            _ => Vec::new(),
        }
    }

    /// The body of the next call: the whole conversation so far.
    pub fn body(&self, model: &str, max_tokens: u32, stream: bool, ignore_eos: bool) -> Vec<u8> {
        let mut b = match self.api {
            Api::Responses => self.responses_body(),
            Api::Messages => self.messages_body(max_tokens),
            Api::Completions => {
                json!({ "prompt": self.completion_prompt(), "max_tokens": max_tokens })
            }
            Api::Chat => self.chat_body(max_tokens),
        };
        b["model"] = Value::from(model);
        b["stream"] = Value::Bool(stream);
        if stream && matches!(self.api, Api::Chat | Api::Completions) {
            b["stream_options"] = json!({"include_usage": true});
        }
        if self.api == Api::Responses {
            b["max_output_tokens"] = Value::from(max_tokens);
        }
        if ignore_eos {
            b["ignore_eos"] = Value::Bool(true);
        }
        serde_json::to_vec(&b).unwrap_or_default()
    }

    fn chat_body(&self, max_tokens: u32) -> Value {
        let mut msgs = vec![json!({"role": "system", "content": self.system})];
        let name = tool_name(self.api);
        msgs.extend(self.items.iter().map(|it| match it {
            Item::User(t) => json!({"role": "user", "content": t}),
            Item::Assistant(t, None) => json!({"role": "assistant", "content": t}),
            Item::Assistant(t, Some(id)) => json!({"role": "assistant", "content": t,
                "tool_calls": [{"id": id, "type": "function",
                                "function": {"name": name, "arguments": TOOL_ARGS}}]}),
            Item::ToolResult(id, t) => json!({"role": "tool", "tool_call_id": id, "content": t}),
        }));
        json!({ "messages": msgs, "max_tokens": max_tokens })
    }

    /// Codex's form: the instructions as the first `developer` item, the history resent
    /// (`store: false`), the thread id as `prompt_cache_key`.
    fn responses_body(&self) -> Value {
        let text = |kind: &str, t: &str| json!([{"type": kind, "text": t}]);
        let mut input = vec![json!({"type": "message", "role": "developer",
                                    "content": text("input_text", &self.system)})];
        let name = tool_name(self.api);
        for it in &self.items {
            match it {
                Item::User(t) => input.push(
                    json!({"type": "message", "role": "user", "content": text("input_text", t)}),
                ),
                Item::Assistant(t, call) => {
                    input.push(json!({"type": "message", "role": "assistant",
                                      "content": text("output_text", t)}));
                    if let Some(id) = call {
                        input.push(json!({"type": "function_call", "name": name,
                                          "arguments": TOOL_ARGS, "call_id": id}));
                    }
                }
                Item::ToolResult(id, t) => {
                    input.push(json!({"type": "function_call_output", "call_id": id, "output": t}));
                }
            }
        }
        json!({ "input": input, "store": false, "prompt_cache_key": self.id })
    }

    /// Claude Code's form: the system as a text block with `cache_control`, the last message's
    /// block carrying `cache_control` (earlier ones resent as plain strings), and
    /// `metadata.user_id` a JSON string naming the session.
    fn messages_body(&self, max_tokens: u32) -> Value {
        let last = self.items.len().saturating_sub(1);
        let msgs: Vec<Value> = self
            .items
            .iter()
            .enumerate()
            .map(|(i, it)| {
                let cache = (i == last).then(|| json!({"type": "ephemeral"}));
                match it {
                    Item::User(t) | Item::Assistant(t, None) => {
                        let role = if matches!(it, Item::User(_)) {
                            "user"
                        } else {
                            "assistant"
                        };
                        let content = match cache {
                            Some(c) => json!([{"type": "text", "text": t, "cache_control": c}]),
                            None => Value::from(t.as_str()),
                        };
                        json!({"role": role, "content": content})
                    }
                    Item::Assistant(t, Some(id)) => json!({"role": "assistant", "content": [
                        {"type": "text", "text": t},
                        {"type": "tool_use", "id": id, "name": tool_name(self.api),
                         "input": serde_json::from_str::<Value>(TOOL_ARGS).unwrap_or_default()}]}),
                    Item::ToolResult(id, t) => {
                        let mut block = json!({"type": "tool_result", "tool_use_id": id,
                                               "content": t});
                        if let Some(c) = cache {
                            block["cache_control"] = c;
                        }
                        json!({"role": "user", "content": [block]})
                    }
                }
            })
            .collect();
        let user_id =
            json!({"device_id": self.device_id, "account_uuid": "", "session_id": self.id});
        json!({
            "messages": msgs,
            "system": [{"type": "text", "text": self.system, "cache_control": {"type": "ephemeral"}}],
            "max_tokens": max_tokens,
            "metadata": {"user_id": user_id.to_string()},
        })
    }

    /// Completions have no conversation: the history as one text, extended the same way.
    fn completion_prompt(&self) -> String {
        let mut p = self.system.clone();
        for it in &self.items {
            match it {
                Item::User(t) | Item::ToolResult(_, t) | Item::Assistant(t, _) => p.push_str(t),
            }
        }
        p
    }
}

/// What one answer said that the session needs: its text and the cached prompt tokens its usage
/// reported (`None` when the field was absent or null: unknown, not 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Heard {
    /// The generated text, as the next call resends it.
    pub text: String,
    /// Chat `usage.prompt_tokens_details.cached_tokens`, Responses
    /// `usage.input_tokens_details.cached_tokens`, Messages `usage.cache_read_input_tokens`.
    pub cached_tokens: Option<u64>,
}

/// The cached tokens a usage object of `api` reports.
fn cached_of(api: Api, usage: &Value) -> Option<u64> {
    match api {
        Api::Chat | Api::Completions => usage["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Api::Responses => usage["input_tokens_details"]["cached_tokens"].as_u64(),
        Api::Messages => usage["cache_read_input_tokens"].as_u64(),
    }
}

impl Heard {
    /// Takes what one streamed event of `api` says.
    pub fn event(&mut self, api: Api, data: &[u8]) {
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        let piece = match api {
            Api::Chat => v["choices"][0]["delta"]["content"].as_str(),
            Api::Completions => v["choices"][0]["text"].as_str(),
            Api::Responses if v["type"] == "response.output_text.delta" => v["delta"].as_str(),
            Api::Messages if v["delta"]["type"] == "text_delta" => v["delta"]["text"].as_str(),
            _ => None,
        };
        if let Some(p) = piece {
            self.text.push_str(p);
        }
        let usage = match api {
            Api::Responses => &v["response"]["usage"],
            _ => &v["usage"],
        };
        if let Some(c) = cached_of(api, usage) {
            self.cached_tokens = Some(c);
        }
    }

    /// What a non-streamed answer of `api` says.
    pub fn body(api: Api, body: &[u8]) -> Heard {
        let Ok(v) = serde_json::from_slice::<Value>(body) else {
            return Heard::default();
        };
        let texts = |arr: &Value, key: &str| -> String {
            arr.as_array()
                .map(|a| a.iter().filter_map(|b| b[key].as_str()).collect())
                .unwrap_or_default()
        };
        let text = match api {
            Api::Chat => v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            Api::Completions => v["choices"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            Api::Responses => v["output"]
                .as_array()
                .map(|items| {
                    items
                        .iter()
                        .map(|it| texts(&it["content"], "text"))
                        .collect()
                })
                .unwrap_or_default(),
            Api::Messages => texts(&v["content"], "text"),
        };
        Heard {
            text,
            cached_tokens: cached_of(api, &v["usage"]),
        }
    }
}

/// Load's own record of one session, from the calls that finished.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SessionTruth {
    /// The session's id as sent (load's own for chat and completions).
    pub id: String,
    /// The API spoken.
    pub api: String,
    /// Turns with at least one finished call.
    pub turns: u32,
    /// Calls that finished (ok or not).
    pub calls: u64,
    /// Σ `prompt_tokens` the answers reported.
    pub prompt_tokens: u64,
    /// Σ `completion_tokens` the answers reported.
    pub completion_tokens: u64,
    /// Σ cached prompt tokens the answers reported; null when no answer reported the field.
    pub cached_tokens: Option<u64>,
}

/// Load's own truth of an `--agents` run's sessions, from the calls that finished: what a
/// proxy's sessions view must show.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SessionsTally {
    /// Sessions with at least one finished call.
    pub sessions: u64,
    /// Σ turns of those sessions.
    pub turns: u64,
    /// Finished calls in sessions.
    pub calls: u64,
    /// Σ prompt tokens reported.
    pub prompt_tokens: u64,
    /// Σ completion tokens reported.
    pub completion_tokens: u64,
    /// Σ cached prompt tokens reported; null when no call reported the field.
    pub cached_tokens: Option<u64>,
    /// Calls whose usage reported cached tokens.
    pub calls_reporting_cached: u64,
    /// Each session, in order of its first finished call.
    pub per_session: Vec<SessionTruth>,
}

impl SessionsTally {
    /// Tallies the finished calls of `results` that belong to a session.
    pub fn of(results: &[super::RequestResult]) -> Self {
        let mut t = SessionsTally::default();
        let mut index: std::collections::HashMap<&str, usize> = Default::default();
        for r in results {
            let Some(id) = r.session_id.as_deref() else {
                continue;
            };
            let i = *index.entry(id).or_insert_with(|| {
                t.per_session.push(SessionTruth {
                    id: id.to_string(),
                    api: r.session_api.unwrap_or_default().to_string(),
                    ..SessionTruth::default()
                });
                t.per_session.len() - 1
            });
            let s = &mut t.per_session[i];
            s.calls += 1;
            s.turns = s.turns.max(r.turn.unwrap_or(0));
            s.prompt_tokens += r.prompt_tokens.unwrap_or(0);
            s.completion_tokens += r.completion_tokens.unwrap_or(0);
            if let Some(c) = r.cached_tokens {
                s.cached_tokens = Some(s.cached_tokens.unwrap_or(0) + c);
                t.calls_reporting_cached += 1;
            }
        }
        for s in &t.per_session {
            t.sessions += 1;
            t.turns += u64::from(s.turns);
            t.calls += s.calls;
            t.prompt_tokens += s.prompt_tokens;
            t.completion_tokens += s.completion_tokens;
            if let Some(c) = s.cached_tokens {
                t.cached_tokens = Some(t.cached_tokens.unwrap_or(0) + c);
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::SmallRng, SeedableRng};

    #[test]
    fn each_call_resends_the_previous_one_and_extends_it() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut s = Session::new(Api::Messages, "sys".into(), "d".repeat(64), &mut rng);
        s.user("list files".into(), &mut rng);
        let a: Value = serde_json::from_slice(&s.body("m", 10, true, false)).unwrap();
        s.assistant("ls".into());
        s.tool_result("README.md".into(), &mut rng);
        let b: Value = serde_json::from_slice(&s.body("m", 10, true, false)).unwrap();
        assert_eq!(a["messages"][0]["content"][0]["text"], "list files");
        assert_eq!(
            b["messages"][0]["content"], "list files",
            "a string once not last"
        );
        assert_eq!(b["messages"][1]["content"][0]["text"], "ls");
        let call = &b["messages"][1]["content"][1];
        assert_eq!(
            (&call["type"], &call["name"]),
            (&json!("tool_use"), &json!("Bash"))
        );
        let result = &b["messages"][2]["content"][0];
        assert_eq!(result["type"], "tool_result");
        assert_eq!(result["tool_use_id"], call["id"]);
        assert_eq!(result["cache_control"]["type"], "ephemeral");
        let uid: Value = serde_json::from_str(b["metadata"]["user_id"].as_str().unwrap()).unwrap();
        assert_eq!(uid["session_id"], s.id.as_str());
        assert_eq!(s.path(), "/v1/messages?beta=true");
        assert_eq!(s.id.as_bytes()[14], b'4', "UUIDv4");
    }

    #[test]
    fn codex_headers_name_the_thread() {
        let mut rng = SmallRng::seed_from_u64(2);
        let mut s = Session::new(Api::Responses, "sys".into(), String::new(), &mut rng);
        s.user("go".into(), &mut rng);
        let h = s.headers();
        for k in ["session-id", "thread-id", "x-client-request-id"] {
            assert_eq!(h.iter().find(|(n, _)| *n == k).unwrap().1, s.id);
        }
        let b: Value = serde_json::from_slice(&s.body("m", 5, false, false)).unwrap();
        assert_eq!(b["prompt_cache_key"], s.id.as_str());
        assert_eq!(b["store"], false);
        assert_eq!(s.id.as_bytes()[14], b'7', "UUIDv7");
    }
}
