//! A strict scan of a request body's top level that tells the usage injection's plain case: a
//! JSON object with `"stream": true` and no `stream_options`. Before the upstream write it
//! stands in for serde's read of the body (`RequestInfo::parse`), whose generic code is most of
//! what metering runs on a chat stream's way there (docs/performance.md, "Code touched per
//! request"); serde reads the body after the write, for the record.
//!
//! The walk is the event skimmer's (`openai::object_members`), which answers only where serde
//! would read the same JSON: anything it declines (an escaped key, a `\u` escape, an exponent,
//! deep nesting, bad UTF-8) is left to serde. Here it also declines a field `RequestInfo` reads
//! given twice, which fails serde's parse.

/// The top-level fields `RequestInfo::parse` reads (a second one of these fails its parse).
const KNOWN: [&[u8]; 9] = [
    b"model",
    b"stream",
    b"n",
    b"user",
    b"stream_options",
    b"metadata",
    b"prompt_cache_key",
    b"messages",
    b"input",
];

/// Index of `stream_options` in [`KNOWN`].
const STREAM_OPTIONS: usize = 4;

/// Whether `body` is a JSON object whose top level has `"stream": true` and no
/// `stream_options`, as serde reads it: then the request asks for a stream and not for usage,
/// and usage may be asked for by appending `stream_options` before its closing brace. `false`
/// means only that this scan does not tell.
pub fn plain_stream(body: &[u8]) -> bool {
    let mut seen = [false; KNOWN.len()];
    let mut stream_true = false;
    let walked = crate::openai::object_members(body, |key, raw| {
        if let Some(k) = KNOWN.iter().position(|known| *known == key) {
            if std::mem::replace(&mut seen[k], true) {
                return false;
            }
        }
        if key == b"stream" {
            stream_true = raw == b"true";
        }
        true
    });
    walked.is_some() && stream_true && !seen[STREAM_OPTIONS]
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::proxy::request::RequestInfo;

    /// The skimmer's nesting limit: the top-level object is 1.
    const MAX_DEPTH: usize = 64;

    /// Whether the skimmer declines `b` whatever its fields: a `\u` escape or an exponent.
    fn skimmer_declines(b: &[u8]) -> bool {
        b.windows(2)
            .any(|w| w == b"\\u" || (w[0].is_ascii_digit() && matches!(w[1], b'e' | b'E')))
    }

    /// What serde's read says of the same body: the plain case.
    fn serde_plain(body: &[u8]) -> bool {
        let info = RequestInfo::parse(body);
        info.wants_injection() && !info.has_stream_options
    }

    #[test]
    fn the_plain_case_and_what_is_left_to_serde() {
        let yes: &[&[u8]] = &[
            br#"{"model":"m","messages":[{"role":"user","content":"hi \"there\" \n"}],"stream":true}"#,
            b" {\r\n \"stream\" : true , \"x\": [1, -0.5, 0, {}, [], null, false]}\n",
            br#"{"stream":true,"extra":{"stream_options":1,"stream":false},"extra":2}"#,
        ];
        for b in yes {
            assert!(plain_stream(b), "{}", String::from_utf8_lossy(b));
            assert!(serde_plain(b));
        }
        let no: &[&[u8]] = &[
            br#"{"stream":false}"#,
            br#"{"stream":"true"}"#,
            br#"{"model":"m"}"#,
            br#"{}"#,
            br#"{"stream":true,"stream_options":null}"#,
            br#"{"stream":true,"stream_options":{"include_usage":false}}"#,
            // Serde refuses these bodies: no injection.
            br#"{"stream":true,"stream":true}"#,
            br#"{"stream":true,"model":"a","model":"b"}"#,
            br#"{"stream":true,}"#,
            br#"{"stream":true} x"#,
            br#"{"stream":true,"n":01}"#,
            br#"{"stream":true,"n":1.}"#,
            br#"{"stream":true,"s":"a\x"}"#,
            b"{\"stream\":true,\"s\":\"tab\tin\"}",
            br#"[{"stream":true}]"#,
            // Left to serde: an escaped key, a `\u` escape, an exponent, bytes that are not
            // UTF-8, deep nesting.
            br#"{"str\u0065am":true}"#,
            br#"{"stream":true,"s":"\u00e9"}"#,
            br#"{"stream":true,"t":1e-5}"#,
            b"{\"stream\":true,\"s\":\"\xff\"}",
        ];
        for b in no {
            assert!(!plain_stream(b), "{}", String::from_utf8_lossy(b));
        }
        let deep = format!(
            "{{\"stream\":true,\"d\":{}1{}}}",
            "[".repeat(MAX_DEPTH),
            "]".repeat(MAX_DEPTH)
        );
        assert!(!plain_stream(deep.as_bytes()));
        let shallow = format!(
            "{{\"stream\":true,\"d\":{}1{}}}",
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert!(plain_stream(shallow.as_bytes()));
    }

    #[test]
    fn recorded_chat_requests_are_the_plain_case_when_serde_says_so() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm");
        let mut seen = 0;
        let mut stack = vec![dir];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "json") {
                    let Ok(text) = std::fs::read(&p) else {
                        continue;
                    };
                    // A recorded request's body, or the file itself.
                    let body = serde_json::from_slice::<serde_json::Value>(&text)
                        .ok()
                        .and_then(|v| v.get("body").cloned())
                        .and_then(|b| serde_json::to_vec(&b).ok())
                        .unwrap_or(text);
                    let (scan, serde) = (plain_stream(&body), serde_plain(&body));
                    assert!(!scan || serde, "{}", p.display());
                    if serde && !skimmer_declines(&body) {
                        assert!(scan, "{}", p.display());
                    }
                    seen += 1;
                }
            }
        }
        assert!(seen > 0);
    }

    /// JSON values as text, some with `stream` and `stream_options` at the top.
    fn body() -> impl Strategy<Value = Vec<u8>> {
        let leaf = prop_oneof![
            Just("null".to_string()),
            Just("true".to_string()),
            Just("false".to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| serde_json::to_string(&f).unwrap_or_default()),
            "[a-z\"\\\\\u{e9}\n]{0,6}".prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
        ];
        let value = leaf.prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec(("(stream|n|model|x|stream_options)", inner), 0..4).prop_map(
                    |kv| {
                        let m: Vec<String> =
                            kv.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                        format!("{{{}}}", m.join(","))
                    }
                ),
            ]
        });
        let key = prop_oneof![
            Just("stream".to_string()),
            Just("stream_options".to_string()),
            Just("model".to_string()),
            Just("messages".to_string()),
            Just("str\\u0065am".to_string()),
            "[a-z_]{1,5}",
        ];
        (
            prop::collection::vec((key, value), 0..6),
            any::<bool>(),
            " {0,2}",
        )
            .prop_map(|(members, stream_first, pad)| {
                let mut m: Vec<String> = members
                    .iter()
                    .map(|(k, v)| format!("\"{k}\"{pad}:{pad}{v}"))
                    .collect();
                if stream_first {
                    m.insert(0, "\"stream\":true".into());
                }
                format!("{pad}{{{}}}{pad}", m.join(",")).into_bytes()
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Never yes where serde says no, on bodies as written and cut or changed by a byte.
        #[test]
        fn yes_only_where_serde_says_yes(b in body(), cut in any::<prop::sample::Index>(),
                                         byte in any::<u8>(), how in 0u8..3) {
            let mut b = b;
            match how {
                0 => {}
                1 => b.truncate(cut.index(b.len() + 1)),
                _ => {
                    if !b.is_empty() {
                        let i = cut.index(b.len());
                        b[i] = byte;
                    }
                }
            }
            if plain_stream(&b) {
                prop_assert!(serde_plain(&b), "{}", String::from_utf8_lossy(&b));
            }
        }

        /// Yes where serde says yes, when no top-level key is escaped.
        #[test]
        fn yes_where_serde_says_yes(b in body()) {
            if serde_plain(&b) && !skimmer_declines(&b) {
                prop_assert!(plain_stream(&b), "{}", String::from_utf8_lossy(&b));
            }
        }
    }
}
