//! What a generation request asks for, read from its JSON body, and the one edit the proxy may
//! make to it: asking the upstream for usage on a stream that did not.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::session::{agent_user_id, SessionSource};

/// The fields of a request body that measurement needs; absent or ill-typed fields are `None`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RequestInfo {
    /// The body was a JSON object.
    pub is_json_object: bool,
    /// `model`.
    pub model: Option<String>,
    /// `stream`: its value when boolean, false when absent, unknown otherwise.
    pub stream: Option<bool>,
    /// `n`, when it is a small positive integer.
    pub n: Option<u32>,
    /// Who the body says sent it: `user` when it is a string (OpenAI APIs), else
    /// `metadata.user_id` when it is a string (Anthropic Messages; Claude Code sends it there).
    pub user: Option<String>,
    /// `stream_options` is present (whatever its value).
    pub has_stream_options: bool,
    /// `stream_options.include_usage` is true.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats` is true.
    pub continuous_usage: bool,
    /// The session the body names: `prompt_cache_key`, else the `session_id` of an Anthropic
    /// `metadata.user_id` that is a JSON string (Claude Code's).
    pub session: Option<(SessionSource, String)>,
    /// Where the conversation (`messages`, else an `input` array) lies in the body: read, for
    /// the session's turn and the prefix audit, only once the request is on its way.
    pub conversation: Option<std::ops::Range<usize>>,
}

#[derive(Deserialize)]
struct RawRequest<'a> {
    #[serde(default, borrow)]
    model: Member<'a>,
    #[serde(default, borrow)]
    stream: Member<'a>,
    #[serde(default, borrow)]
    n: Member<'a>,
    #[serde(default, borrow)]
    user: Member<'a>,
    #[serde(default, borrow)]
    stream_options: Member<'a>,
    #[serde(default, borrow)]
    metadata: Member<'a>,
    #[serde(default, borrow)]
    prompt_cache_key: Member<'a>,
    #[serde(default, borrow)]
    messages: Member<'a>,
    #[serde(default, borrow)]
    input: Member<'a>,
}

/// The one member of `metadata` read: Anthropic's `user_id`.
#[derive(Deserialize, Default)]
struct RawMetadata<'a> {
    #[serde(default, borrow)]
    user_id: Member<'a>,
}

/// A member's raw value; unlike `Option<&RawValue>`, a JSON `null` is `Some("null")`.
#[derive(Default)]
struct Member<'a>(Option<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Member<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(d).map(|v| Member(Some(v)))
    }
}

#[derive(Deserialize, Default)]
struct RawStreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
    #[serde(default)]
    continuous_usage_stats: Option<bool>,
}

impl RequestInfo {
    /// Reads `body`; anything that is not a JSON object yields the default (all unknown).
    pub fn parse(body: &[u8]) -> RequestInfo {
        // A struct also deserializes from an array; only objects are requests.
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return RequestInfo::default();
        }
        let Ok(raw) = serde_json::from_slice::<RawRequest<'_>>(body) else {
            return RequestInfo::default();
        };
        let string =
            |v: Option<&RawValue>| v.and_then(|v| serde_json::from_str::<String>(v.get()).ok());
        // `user`, else `metadata.user_id`; Claude Code writes a JSON string of ids there, which
        // names the user (its account, else its device, pseudonymised) and the session.
        let body_user = string(raw.user.0).or_else(|| {
            let meta = raw.metadata.0?;
            let m = serde_json::from_str::<Option<RawMetadata<'_>>>(meta.get()).ok()??;
            string(m.user_id.0)
        });
        let agent = match (&body_user, raw.user.0) {
            (Some(u), None) => agent_user_id(u),
            _ => None,
        };
        let opts = raw
            .stream_options
            .0
            .and_then(|v| serde_json::from_str::<Option<RawStreamOptions>>(v.get()).ok())
            .flatten()
            .unwrap_or_default();
        RequestInfo {
            is_json_object: true,
            model: string(raw.model.0),
            // Absent means the API's default, false; present but not a boolean is unknown.
            stream: match raw.stream.0 {
                None => Some(false),
                Some(v) => serde_json::from_str::<bool>(v.get()).ok(),
            },
            n: raw
                .n
                .0
                .and_then(|v| serde_json::from_str::<u32>(v.get()).ok()),
            user: body_user.and_then(|u| match &agent {
                Some(a) => a.user.clone(),
                None => Some(u),
            }),
            session: string(raw.prompt_cache_key.0)
                .filter(|k| !k.trim().is_empty() && k.len() <= 256)
                .map(|k| (SessionSource::PromptCacheKey, k))
                .or_else(|| {
                    let s = agent.and_then(|a| a.session)?;
                    Some((SessionSource::MetadataUserId, s))
                }),
            conversation: [raw.messages.0, raw.input.0]
                .into_iter()
                .flatten()
                .find(|v| v.get().starts_with('['))
                .map(|v| {
                    // The member borrows from `body`: its offset is where it lies.
                    let start = v.get().as_ptr() as usize - body.as_ptr() as usize;
                    start..start + v.get().len()
                }),
            has_stream_options: raw.stream_options.0.is_some(),
            include_usage: opts.include_usage == Some(true),
            continuous_usage: opts.continuous_usage_stats == Some(true),
        }
    }

    /// Whether usage should be injected: a stream that did not ask for it, and whose options
    /// would not change anything else the client receives once usage is on.
    pub fn wants_injection(&self) -> bool {
        self.is_json_object
            && self.stream == Some(true)
            && !self.include_usage
            && !self.continuous_usage
    }
}

/// Returns `body` with `stream_options.include_usage` set to true, every other field kept in order.
///
/// When the body has no `stream_options`, the member is appended before the closing brace and
/// every original byte is kept; otherwise the object is re-serialized (same members, same order).
pub fn inject_include_usage(body: &[u8], info: &RequestInfo) -> Option<Bytes> {
    if !info.has_stream_options {
        let end = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
        if body[end] != b'}' {
            return None;
        }
        let mut out = Vec::with_capacity(body.len() + 40);
        out.extend_from_slice(&body[..end]);
        out.extend_from_slice(b",\"stream_options\":{\"include_usage\":true}");
        out.extend_from_slice(&body[end..]);
        return Some(Bytes::from(out));
    }
    let mut map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body).ok()?;
    let opts = map.get_mut("stream_options")?;
    if !opts.is_object() {
        *opts = serde_json::Value::Object(serde_json::Map::new());
    }
    opts.as_object_mut()?
        .insert("include_usage".into(), serde_json::Value::Bool(true));
    serde_json::to_vec(&map).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_is_user_else_anthropic_metadata_user_id() {
        let u = |b: &[u8]| RequestInfo::parse(b).user;
        assert_eq!(
            u(br#"{"metadata":{"user_id":"carol"}}"#).as_deref(),
            Some("carol")
        );
        assert_eq!(
            u(br#"{"user":"dave","metadata":{"user_id":"carol"}}"#).as_deref(),
            Some("dave")
        );
        for body in [
            &br#"{"metadata":{"user_id":7}}"#[..],
            br#"{"metadata":null}"#,
            br#"{"metadata":"x"}"#,
            br#"{"metadata":{}}"#,
        ] {
            assert_eq!(u(body), None, "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn reads_fields_and_tolerates_wrong_types() {
        let i = RequestInfo::parse(br#"{"model":"m","messages":[],"stream":true,"n":2,"user":"u","stream_options":{"include_usage":true}}"#);
        assert_eq!(i.model.as_deref(), Some("m"));
        assert_eq!(
            (i.stream, i.n, i.include_usage, i.continuous_usage),
            (Some(true), Some(2), true, false)
        );
        let w = RequestInfo::parse(
            br#"{"model":5,"stream":"yes","n":-1,"user":{},"stream_options":7}"#,
        );
        assert!(w.is_json_object);
        assert_eq!((w.model, w.stream, w.n, w.user), (None, None, None, None));
        assert!(w.has_stream_options && !w.include_usage);
        assert_eq!(RequestInfo::parse(b"not json"), RequestInfo::default());
        assert_eq!(RequestInfo::parse(b"[1,2]"), RequestInfo::default());
        assert_eq!(RequestInfo::parse(&[0xff, 0xfe]), RequestInfo::default());
    }

    #[test]
    fn injection_appends_without_touching_other_bytes() {
        let body = br#"{"model":"m", "messages":[{"role":"user","content":"x"}], "stream":true, "temperature":1e-1 }  "#;
        let info = RequestInfo::parse(body);
        assert!(info.wants_injection());
        let out = inject_include_usage(body, &info).unwrap();
        let expected = br#"{"model":"m", "messages":[{"role":"user","content":"x"}], "stream":true, "temperature":1e-1 ,"stream_options":{"include_usage":true}}  "#;
        assert_eq!(&out[..], &expected[..]);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
    }

    #[test]
    fn injection_into_existing_options_keeps_order() {
        let body = br#"{"stream":true,"stream_options":{"include_usage":false},"model":"m"}"#;
        let info = RequestInfo::parse(body);
        assert!(info.wants_injection());
        let out = inject_include_usage(body, &info).unwrap();
        assert_eq!(
            &out[..],
            br#"{"stream":true,"stream_options":{"include_usage":true},"model":"m"}"#
        );
        let null_opts = br#"{"stream":true,"stream_options":null}"#;
        let out = inject_include_usage(null_opts, &RequestInfo::parse(null_opts)).unwrap();
        assert_eq!(
            &out[..],
            br#"{"stream":true,"stream_options":{"include_usage":true}}"#
        );
    }

    #[test]
    fn no_injection_when_usage_asked_or_not_streaming() {
        assert!(!RequestInfo::parse(br#"{"stream":false}"#).wants_injection());
        assert!(
            !RequestInfo::parse(br#"{"stream":true,"stream_options":{"include_usage":true}}"#)
                .wants_injection()
        );
        assert!(!RequestInfo::parse(
            br#"{"stream":true,"stream_options":{"continuous_usage_stats":true}}"#
        )
        .wants_injection());
    }
}
