//! Which agent session and turn a generation request belongs to, from what the agent sent, and
//! what the conversation it carries says for the prefix-cache audit (`proxy/session_table.rs`).
//!
//! Identity, first found wins (docs/sessions.md): the Codex headers `session-id`, `thread-id`,
//! Claude Code's `X-Claude-Code-Session-Id`, the `session_id` of Codex's
//! `x-codex-turn-metadata`, the body's `prompt_cache_key`, the `session_id` of an Anthropic
//! `metadata.user_id` that is a JSON string, and for a client that sends none, a fingerprint of
//! the conversation's opening (its items up to the first user message, normalised). The raw value
//! never leaves this module: a session is named by a pseudonym, `s-` and 12 hex digits of its
//! SHA-256 (`f-` for a fingerprint).

use std::hash::{Hash, Hasher};

use http::{HeaderMap, HeaderName};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::hex::hex;
pub use crate::record::SessionSource;

/// Longest raw session id read; a longer value is not an id.
const MAX_ID_LEN: usize = 256;

/// Codex's session field.
static SESSION_ID: HeaderName = HeaderName::from_static("session-id");
/// Codex's thread field (older versions).
static THREAD_ID: HeaderName = HeaderName::from_static("thread-id");
/// Claude Code's session field.
static CLAUDE_SESSION_ID: HeaderName = HeaderName::from_static("x-claude-code-session-id");
/// Codex's turn metadata (JSON with its session, thread and turn ids).
static CODEX_TURN_METADATA: HeaderName = HeaderName::from_static("x-codex-turn-metadata");

/// The session a request's head names, if any (the first three sources, in order).
pub fn from_headers(headers: &HeaderMap) -> Option<(SessionSource, String)> {
    let header = |name: &HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty() && v.len() <= MAX_ID_LEN)
    };
    if let Some(v) = header(&SESSION_ID).or_else(|| header(&THREAD_ID)) {
        return Some((SessionSource::CodexHeader, v.to_string()));
    }
    if let Some(v) = header(&CLAUDE_SESSION_ID) {
        return Some((SessionSource::ClaudeHeader, v.to_string()));
    }
    let meta = headers.get(&CODEX_TURN_METADATA)?.to_str().ok()?;
    let ids: Ids<'_> = serde_json::from_str(meta).ok()?;
    let id = ids.session_id.or(ids.thread_id)?;
    valid_id(&id).then(|| (SessionSource::CodexHeader, id.into_owned()))
}

/// The turn Codex names in `x-codex-turn-metadata` (its `turn_id`), as a hash: two calls of a
/// session with the same one are in the same turn.
pub fn codex_turn(headers: &HeaderMap) -> Option<u64> {
    let meta = headers.get(&CODEX_TURN_METADATA)?.to_str().ok()?;
    let ids: Ids<'_> = serde_json::from_str(meta).ok()?;
    let turn = ids.turn_id.filter(|t| valid_id(t))?;
    let mut h = std::hash::DefaultHasher::new();
    turn.hash(&mut h);
    Some(h.finish())
}

fn valid_id(id: &str) -> bool {
    !id.trim().is_empty() && id.len() <= MAX_ID_LEN
}

/// The ids an agent's JSON metadata carries (Codex's turn metadata, Claude Code's `user_id`).
#[derive(Deserialize, Default)]
struct Ids<'a> {
    #[serde(default, borrow)]
    session_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    thread_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    turn_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    device_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    account_uuid: Option<std::borrow::Cow<'a, str>>,
}

/// What an Anthropic `metadata.user_id` that is a JSON string (Claude Code's
/// `{"device_id":…,"account_uuid":…,"session_id":…}`) says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentUserId {
    /// The user: `account_uuid` when not empty, else `device-` and 8 hex digits of the
    /// `device_id`'s SHA-256.
    pub user: Option<String>,
    /// The session's raw id.
    pub session: Option<String>,
}

/// Reads `user_id` as Claude Code writes it; `None` when it is not a JSON object string.
pub fn agent_user_id(user_id: &str) -> Option<AgentUserId> {
    if !user_id.trim_start().starts_with('{') {
        return None;
    }
    let ids: Ids<'_> = serde_json::from_str(user_id).ok()?;
    let account = ids.account_uuid.filter(|a| valid_id(a));
    let device = ids.device_id.filter(|d| valid_id(d));
    let user = match (account, device) {
        (Some(a), _) => Some(a.chars().filter(|c| !c.is_control()).take(64).collect()),
        (None, Some(d)) => Some(format!("device-{}", short_hash(&d, 4))),
        (None, None) => None,
    };
    let session = ids
        .session_id
        .filter(|s| valid_id(s))
        .map(std::borrow::Cow::into_owned);
    Some(AgentUserId { user, session })
}

/// The first `bytes` bytes of `raw`'s SHA-256, in hex.
fn short_hash(raw: &str, bytes: usize) -> String {
    let d: [u8; 32] = Sha256::digest(raw.as_bytes()).into();
    hex(&d[..bytes]).as_str().to_string()
}

/// The pseudonym logged for a raw session id.
pub fn pseudonym(raw: &str) -> String {
    format!("s-{}", short_hash(raw, 6))
}

/// What the request's conversation (`messages`, or Responses' `input` items) says: its length,
/// which turn it is in, and a hash of every prefix of it, normalised, so that a later call can be
/// told to extend it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Conversation {
    /// The turn the call belongs to: 1 + the number of user messages that follow model output
    /// or a tool's result, after the first user message.
    pub turn: u32,
    /// `prefix[i]`: the hash of the normalised items `0..=i`.
    pub prefix: Vec<u64>,
    /// The hash of the items up to and including the first user message (the fingerprint's
    /// input), when there is a user message.
    pub opening: Option<u64>,
}

impl Conversation {
    /// Reads a conversation's items; `None` when `items` is not a JSON array (a Responses
    /// `input` string, or no conversation).
    pub fn read(items: &RawValue) -> Option<Conversation> {
        if !items.get().starts_with('[') {
            return None;
        }
        let items: Vec<&RawValue> = serde_json::from_str(items.get()).ok()?;
        let mut c = Conversation {
            prefix: Vec::with_capacity(items.len()),
            ..Conversation::default()
        };
        let mut hasher = std::hash::DefaultHasher::new();
        // Whether the last item that was not a system or developer message was a user's.
        let mut after_user = false;
        for raw in items {
            let Ok(mut v) = serde_json::from_str::<Value>(raw.get()) else {
                return None;
            };
            normalise(&mut v);
            hash_value(&v, &mut hasher);
            c.prefix.push(hasher.finish());
            match kind(&v) {
                Kind::User => {
                    if c.opening.is_none() {
                        c.opening = c.prefix.last().copied();
                        c.turn = 1;
                    } else if !after_user {
                        c.turn += 1;
                    }
                    after_user = true;
                }
                Kind::Agent => after_user = false,
                Kind::Neutral => {}
            }
        }
        Some(c)
    }

    /// The pseudonym of a conversation's opening, for a client that names no session.
    pub fn fingerprint(&self) -> Option<String> {
        self.opening
            .map(|h| format!("f-{}", &format!("{h:016x}")[..12]))
    }

    /// Whether this conversation starts with all of `earlier` (`earlier`'s item count and its
    /// whole hash) and adds to it.
    pub fn extends(&self, earlier_len: usize, earlier_hash: u64) -> bool {
        earlier_len > 0
            && self.prefix.len() > earlier_len
            && self.prefix[earlier_len - 1] == earlier_hash
    }
}

/// What an item is to the turn rule.
enum Kind {
    /// A user's message (not a tool's result sent as a user message).
    User,
    /// The model's output, a tool call or a tool's result.
    Agent,
    /// System and developer messages: no one's turn.
    Neutral,
}

fn kind(v: &Value) -> Kind {
    let role = v.get("role").and_then(Value::as_str);
    let ty = v.get("type").and_then(Value::as_str);
    match (role, ty) {
        (Some("user"), None | Some("message")) => {
            // Anthropic sends a tool's result as a user message of `tool_result` blocks.
            let tool_results = v
                .get("content")
                .and_then(Value::as_array)
                .is_some_and(|blocks| {
                    !blocks.is_empty()
                        && blocks
                            .iter()
                            .all(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
                });
            if tool_results {
                Kind::Agent
            } else {
                Kind::User
            }
        }
        (Some("system" | "developer"), _) | (None, None) => Kind::Neutral,
        // The assistant, a tool; Responses items without a role: `function_call`,
        // `function_call_output`, `reasoning`.
        _ => Kind::Agent,
    }
}

/// What an agent changes in an item it resends without changing its content: Claude Code moves
/// `cache_control` to the newest block and sends a block that lost it as a plain string.
fn normalise(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.shift_remove("cache_control");
            for (_, child) in map.iter_mut() {
                normalise(child);
            }
            if let Some(content) = map.get_mut("content") {
                if let Some(text) = one_text_block(content) {
                    *content = Value::String(text);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalise),
        _ => {}
    }
}

/// The text of `[{"type":"text","text":…}]` (a one-block list that says only that).
fn one_text_block(content: &Value) -> Option<String> {
    let [block] = content.as_array()?.as_slice() else {
        return None;
    };
    let map = block.as_object()?;
    let text = map.get("text")?.as_str()?;
    (map.len() == 2 && map.get("type")?.as_str() == Some("text")).then(|| text.to_string())
}

/// Feeds `v` to `h`, member order kept (the agents resend an item's members in the same order).
fn hash_value(v: &Value, h: &mut impl Hasher) {
    match v {
        Value::Null => 0u8.hash(h),
        Value::Bool(b) => (1u8, b).hash(h),
        Value::Number(n) => (2u8, n.to_string()).hash(h),
        Value::String(s) => (3u8, s).hash(h),
        Value::Array(items) => {
            (4u8, items.len()).hash(h);
            items.iter().for_each(|i| hash_value(i, h));
        }
        Value::Object(map) => {
            (5u8, map.len()).hash(h);
            for (k, child) in map {
                k.hash(h);
                hash_value(child, h);
            }
        }
    }
}

/// A request's session and turn, as the proxy logs them, with what the audit compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionCall {
    /// The session's pseudonym.
    pub name: String,
    /// Where it came from.
    pub source: SessionSource,
    /// The turn by the conversation's rule, when the request carries a conversation (the
    /// session table may take it from Codex's `turn_id` instead).
    pub turn: Option<u32>,
    /// Codex's `turn_id`, hashed ([`codex_turn`]), when sent.
    pub turn_key: Option<u64>,
    /// The hash of each prefix of the conversation ([`Conversation::prefix`]); empty without
    /// one.
    pub prefix: Vec<u64>,
}

/// Works out a request's session from the head's id (if any), the body's ids and its
/// conversation.
pub fn identify(
    header: Option<(SessionSource, String)>,
    body: Option<(SessionSource, String)>,
    conversation: Option<Conversation>,
    turn_key: Option<u64>,
) -> Option<SessionCall> {
    let (source, name) = match header.or(body) {
        Some((source, raw)) => (source, pseudonym(&raw)),
        None => (
            SessionSource::Fingerprint,
            conversation.as_ref()?.fingerprint()?,
        ),
    };
    let turn = conversation.as_ref().map(|c| c.turn).filter(|t| *t > 0);
    let prefix = conversation.map(|c| c.prefix).unwrap_or_default();
    Some(SessionCall {
        name,
        source,
        turn,
        turn_key,
        prefix,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(json: &str) -> Conversation {
        let raw: Box<RawValue> = serde_json::from_str(json).unwrap();
        Conversation::read(&raw).unwrap()
    }

    #[test]
    fn claude_codes_resent_blocks_hash_as_before() {
        let first = conv(
            r#"[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]"#,
        );
        let second = conv(
            r#"[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"Bash","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x","cache_control":{"type":"ephemeral"}}]}]"#,
        );
        assert!(second.extends(1, first.prefix[0]));
        assert_eq!(
            (first.turn, second.turn),
            (1, 1),
            "a tool result is no turn"
        );
        let third = conv(
            r#"[{"role":"user","content":"hi"},{"role":"assistant","content":"done"},{"role":"user","content":"again"}]"#,
        );
        assert_eq!(third.turn, 2);
        assert!(!third.extends(3, second.prefix[2]));
        assert_eq!(first.fingerprint(), second.fingerprint());
    }

    #[test]
    fn codex_items_count_turns_by_user_messages_after_output() {
        let c = conv(
            r#"[{"type":"message","role":"developer","content":[]},{"type":"message","role":"user","content":[{"type":"input_text","text":"env"}]},{"type":"message","role":"user","content":[{"type":"input_text","text":"ls"}]},{"type":"function_call","name":"exec","arguments":"{}"},{"type":"function_call_output","output":"a"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]},{"type":"message","role":"user","content":[{"type":"input_text","text":"again"}]}]"#,
        );
        assert_eq!(c.turn, 2);
        assert_eq!(c.prefix.len(), 7);
    }

    #[test]
    fn claude_code_user_id_gives_user_and_session() {
        let id = agent_user_id(
            r#"{"device_id":"edc5","account_uuid":"","session_id":"ccba1a68-ca13-4022-ab47-09f0042b059c"}"#,
        )
        .unwrap();
        assert_eq!(
            id.session.as_deref(),
            Some("ccba1a68-ca13-4022-ab47-09f0042b059c")
        );
        assert_eq!(id.user, Some(format!("device-{}", short_hash("edc5", 4))));
        let with_account =
            agent_user_id(r#"{"device_id":"d","account_uuid":"acct-1","session_id":"s"}"#).unwrap();
        assert_eq!(with_account.user.as_deref(), Some("acct-1"));
        assert_eq!(agent_user_id("carol"), None);
    }

    #[test]
    fn headers_in_order() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-codex-turn-metadata",
            r#"{"session_id":"m","turn_id":"t1"}"#.parse().unwrap(),
        );
        let t1 = codex_turn(&h);
        assert!(t1.is_some());
        assert_eq!(
            from_headers(&h),
            Some((SessionSource::CodexHeader, "m".to_string()))
        );
        h.insert("x-claude-code-session-id", "c".parse().unwrap());
        assert_eq!(
            from_headers(&h),
            Some((SessionSource::ClaudeHeader, "c".to_string()))
        );
        h.insert("thread-id", "t".parse().unwrap());
        h.insert("session-id", "s".parse().unwrap());
        assert_eq!(
            from_headers(&h),
            Some((SessionSource::CodexHeader, "s".to_string()))
        );
        assert!(pseudonym("s").starts_with("s-") && pseudonym("s").len() == 14);
    }
}
