//! A strict scan of a request body's top level that tells the usage injection's plain case: a
//! JSON object with `"stream": true` and no `stream_options`. Before the upstream write it
//! stands in for serde's read of the body (`RequestInfo::parse`), whose generic code is most of
//! what metering runs on a chat stream's way there (docs/performance.md, "Code touched per
//! request"); serde reads the body after the write, for the record.
//!
//! It says yes only where serde would say the same: the body is valid UTF-8 and JSON by RFC
//! 8259's grammar, nested at most [`MAX_DEPTH`] deep (serde's limit is 128), no key of the top
//! level has an escape (serde compares keys unescaped), and none of the fields `RequestInfo`
//! reads comes twice (serde refuses the body then). Anything else is left to serde.

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

/// Deepest nesting scanned; deeper bodies are serde's to read.
pub const MAX_DEPTH: usize = 64;

/// Whether `body` is a JSON object whose top level has `"stream": true` and no
/// `stream_options`, as serde reads it: then the request asks for a stream and not for usage,
/// and usage may be asked for by appending `stream_options` before its closing brace. `false`
/// means only that this scan does not tell.
pub fn plain_stream(body: &[u8]) -> bool {
    if std::str::from_utf8(body).is_err() {
        return false;
    }
    Scan { b: body, i: 0 }.top().unwrap_or(false)
}

/// A position in the body; every method returns `None` where the scan gives up.
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    /// The top-level object: whether it is the plain case.
    fn top(&mut self) -> Option<bool> {
        self.ws();
        self.eat(b'{')?;
        self.ws();
        if self.eat(b'}').is_some() {
            return self.end().then_some(false);
        }
        let mut seen = [false; KNOWN.len()];
        let mut stream_true = false;
        loop {
            let (key, escaped) = self.string()?;
            if escaped {
                return None;
            }
            let known = KNOWN.iter().position(|k| *k == key);
            if let Some(k) = known {
                if std::mem::replace(&mut seen[k], true) {
                    return None;
                }
            }
            self.ws();
            self.eat(b':')?;
            self.ws();
            let start = self.i;
            self.value(1)?;
            if key == b"stream" {
                stream_true = &self.b[start..self.i] == b"true";
            }
            self.ws();
            match self.next()? {
                b',' => self.ws(),
                b'}' => break,
                _ => return None,
            }
        }
        Some(self.end() && stream_true && !seen[STREAM_OPTIONS])
    }

    /// Only whitespace is left.
    fn end(&mut self) -> bool {
        self.ws();
        self.i == self.b.len()
    }

    /// One value, at nesting `depth` (the top-level object's members are at 1).
    fn value(&mut self, depth: usize) -> Option<()> {
        match *self.b.get(self.i)? {
            b'{' => self.container(b'}', depth),
            b'[' => self.container(b']', depth),
            b'"' => self.string().map(drop),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// An object (closed by `}`) or an array (by `]`) at nesting `depth`, from its opening
    /// bracket: an object's members are `key: value`, an array's are values.
    fn container(&mut self, close: u8, depth: usize) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.i += 1;
        self.ws();
        if self.eat(close).is_some() {
            return Some(());
        }
        loop {
            if close == b'}' {
                self.string()?;
                self.ws();
                self.eat(b':')?;
                self.ws();
            }
            self.value(depth + 1)?;
            self.ws();
            match self.next()? {
                b',' => self.ws(),
                c if c == close => return Some(()),
                _ => return None,
            }
        }
    }

    /// A string (RFC 8259 §7): its raw bytes between the quotes, and whether it has an escape.
    fn string(&mut self) -> Option<(&'a [u8], bool)> {
        self.eat(b'"')?;
        let start = self.i;
        let mut escaped = false;
        loop {
            match self.next()? {
                b'"' => return Some((&self.b[start..self.i - 1], escaped)),
                b'\\' => {
                    escaped = true;
                    match self.next()? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                        b'u' => {
                            for _ in 0..4 {
                                if !self.next()?.is_ascii_hexdigit() {
                                    return None;
                                }
                            }
                        }
                        _ => return None,
                    }
                }
                c if c < 0x20 => return None,
                _ => {}
            }
        }
    }

    /// A number (RFC 8259 §6): `-`? (`0` | a digit not 0, digits) (`.` digits)? (`e` sign? digits)?
    fn number(&mut self) -> Option<()> {
        let _ = self.eat(b'-');
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.eat(b'.').is_some() {
            self.digit()?;
            self.digits();
        }
        if self.eat(b'e').or_else(|| self.eat(b'E')).is_some() {
            let _ = self.eat(b'+').or_else(|| self.eat(b'-'));
            self.digit()?;
            self.digits();
        }
        Some(())
    }

    fn digit(&mut self) -> Option<()> {
        self.next().filter(u8::is_ascii_digit).map(drop)
    }

    fn digits(&mut self) {
        while self.b.get(self.i).is_some_and(u8::is_ascii_digit) {
            self.i += 1;
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// JSON's whitespace: space, tab, line feed, carriage return.
    fn ws(&mut self) {
        while matches!(self.b.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.b.get(self.i) == Some(&c)).then(|| self.i += 1)
    }

    fn next(&mut self) -> Option<u8> {
        let c = *self.b.get(self.i)?;
        self.i += 1;
        Some(c)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::proxy::request::RequestInfo;

    /// What serde's read says of the same body: the plain case.
    fn serde_plain(body: &[u8]) -> bool {
        let info = RequestInfo::parse(body);
        info.wants_injection() && !info.has_stream_options
    }

    #[test]
    fn the_plain_case_and_what_is_left_to_serde() {
        let yes: &[&[u8]] = &[
            br#"{"model":"m","messages":[{"role":"user","content":"hi \"there\" \u00e9\n"}],"stream":true}"#,
            b" {\r\n \"stream\" : true , \"x\": [1, -0.5e+3, 0, {}, [], null, false]}\n",
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
            // Left to serde: an escaped key, bytes that are not UTF-8, deep nesting.
            br#"{"str\u0065am":true}"#,
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
                    if serde && !body.contains(&b'\\') {
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
            if serde_plain(&b) && !String::from_utf8_lossy(&b).contains("str\\u0065am") {
                prop_assert!(plain_stream(&b), "{}", String::from_utf8_lossy(&b));
            }
        }
    }
}
