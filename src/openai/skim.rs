//! The fast path of [`summarize`](super::summarize): one pass over the bytes of the shapes vLLM
//! streams (`choices` with `delta`/`message`/`text`/`finish_reason`, `usage`), without building
//! strings or checking what nobody reads.
//!
//! It answers only for input it has fully checked to be a JSON object of that shape; for anything
//! else (escaped keys, `\u` escapes, exponents, non-null `error`/`metrics`, duplicate fields, deep
//! nesting, bad UTF-8, malformed JSON) it declines and serde decides. So where it answers, the
//! answer is serde's; the differential tests below and `fuzz/fuzz_targets/summarize.rs` hold it
//! to that.

use std::borrow::Cow;

use super::{Summary, Usage};
use crate::swar::find_string_special;

/// The skimmer declined: serde must decide.
#[derive(Debug)]
pub(super) struct Decline;

type Skimmed<T> = Result<T, Decline>;

/// Nesting the skimmer follows before it declines (serde_json stops at 128).
const MAX_DEPTH: u32 = 64;

/// Summarizes `data` when it is a JSON object of a shape the skimmer knows.
pub(super) fn summarize(data: &[u8]) -> Skimmed<Summary<'_>> {
    // One check of the whole input (fast on ASCII) lets spans be borrowed as `str` below.
    let text = std::str::from_utf8(data).map_err(|_| Decline)?;
    let mut p = Parser {
        text,
        b: data,
        i: 0,
        depth: 0,
    };
    let summary = p.top()?;
    p.ws();
    if p.i != data.len() {
        return Err(Decline);
    }
    Ok(summary)
}

struct Parser<'a> {
    text: &'a str,
    b: &'a [u8],
    i: usize,
    depth: u32,
}

/// Marks a field as read, declining on the second time (serde rejects duplicate fields).
fn first_time(seen: &mut bool) -> Skimmed<()> {
    if std::mem::replace(seen, true) {
        Err(Decline)
    } else {
        Ok(())
    }
}

/// A raw JSON value that carries output, by the rule of `carries` in the serde path.
fn carries(raw: &[u8]) -> bool {
    raw != b"null" && raw != b"\"\"" && raw != b"[]"
}

impl<'a> Parser<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    /// The next byte that is not whitespace, not consumed.
    fn peek(&mut self) -> Skimmed<u8> {
        self.ws();
        self.b.get(self.i).copied().ok_or(Decline)
    }

    fn eat(&mut self, c: u8) -> Skimmed<()> {
        if self.peek()? == c {
            self.i += 1;
            Ok(())
        } else {
            Err(Decline)
        }
    }

    fn literal(&mut self, word: &[u8]) -> Skimmed<()> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(Decline)
        }
    }

    /// A string at the current `"`: its contents' byte range and whether it holds escapes.
    fn string(&mut self) -> Skimmed<(usize, usize, bool)> {
        let start = self.i + 1;
        let mut i = start;
        let mut escaped = false;
        loop {
            i = find_string_special(self.b, i);
            match self.b.get(i) {
                Some(b'"') => {
                    self.i = i + 1;
                    return Ok((start, i, escaped));
                }
                Some(b'\\') => match self.b.get(i + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                        escaped = true;
                        i += 2;
                    }
                    _ => return Err(Decline),
                },
                _ => return Err(Decline),
            }
        }
    }

    /// A number by JSON's grammar; exponents decline. Returns its text.
    fn number(&mut self) -> Skimmed<&'a [u8]> {
        let start = self.i;
        if self.b.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        match self.b.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(Decline),
        }
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            if !matches!(self.b.get(self.i), Some(b'0'..=b'9')) {
                return Err(Decline);
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.b.get(self.i) {
            return Err(Decline);
        }
        Ok(&self.b[start..self.i])
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    /// Any value, checked and skipped; returns its exact text (as serde's `RawValue` has it).
    fn value(&mut self) -> Skimmed<&'a [u8]> {
        let c = self.peek()?;
        let start = self.i;
        match c {
            b'"' => {
                self.string()?;
            }
            b'{' => {
                self.enter()?;
                let mut first = true;
                while self.key(&mut first)?.is_some() {
                    self.value()?;
                }
                self.depth -= 1;
            }
            b'[' => {
                self.enter()?;
                let mut first = true;
                while self.element(&mut first)? {
                    self.value()?;
                }
                self.depth -= 1;
            }
            b't' => self.literal(b"true")?,
            b'f' => self.literal(b"false")?,
            b'n' => self.literal(b"null")?,
            _ => {
                self.number()?;
            }
        }
        Ok(&self.b[start..self.i])
    }

    /// Consumes the `{` or `[` at the cursor, one level deeper.
    fn enter(&mut self) -> Skimmed<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Decline);
        }
        self.i += 1;
        Ok(())
    }

    /// Inside an object: the next member's key (the `:` consumed), or `None` at its `}`.
    fn key(&mut self, first: &mut bool) -> Skimmed<Option<&'a [u8]>> {
        let c = self.peek()?;
        if std::mem::take(first) {
            if c == b'}' {
                self.i += 1;
                return Ok(None);
            }
        } else {
            match c {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Ok(None);
                }
                _ => return Err(Decline),
            }
        }
        if self.peek()? != b'"' {
            return Err(Decline);
        }
        let (from, to, escaped) = self.string()?;
        if escaped {
            // serde compares the unescaped key; not worth doing here.
            return Err(Decline);
        }
        self.eat(b':')?;
        Ok(Some(&self.b[from..to]))
    }

    /// Inside an array: whether another element follows (the `,` consumed), false at its `]`.
    fn element(&mut self, first: &mut bool) -> Skimmed<bool> {
        let c = self.peek()?;
        if std::mem::take(first) {
            if c == b']' {
                self.i += 1;
                return Ok(false);
            }
            return Ok(true);
        }
        match c {
            b',' => {
                self.i += 1;
                Ok(true)
            }
            b']' => {
                self.i += 1;
                Ok(false)
            }
            _ => Err(Decline),
        }
    }

    /// Consumes `null` when it is next; false (nothing consumed) otherwise.
    fn null(&mut self) -> Skimmed<bool> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Consumes the `{` of an object that must come next.
    fn open_object(&mut self) -> Skimmed<()> {
        if self.peek()? != b'{' {
            return Err(Decline);
        }
        self.enter()
    }

    fn top(&mut self) -> Skimmed<Summary<'a>> {
        let mut s = Summary::default();
        let (mut seen_choices, mut seen_usage) = (false, false);
        let (mut seen_error, mut seen_metrics) = (false, false);
        self.open_object()?;
        let mut first = true;
        while let Some(key) = self.key(&mut first)? {
            match key {
                b"choices" => {
                    first_time(&mut seen_choices)?;
                    if !self.null()? {
                        self.choices(&mut s)?;
                    }
                }
                b"usage" => {
                    first_time(&mut seen_usage)?;
                    if !self.null()? {
                        s.usage = Some(self.usage()?);
                    }
                }
                // vLLM sends `"metrics": null`; a present value (error events, per-request
                // timings) is rare and serde reads it.
                b"error" | b"metrics" => {
                    first_time(if key == b"error" {
                        &mut seen_error
                    } else {
                        &mut seen_metrics
                    })?;
                    if !self.null()? {
                        return Err(Decline);
                    }
                }
                _ => {
                    self.value()?;
                }
            }
        }
        self.depth -= 1;
        Ok(s)
    }

    fn choices(&mut self, s: &mut Summary<'a>) -> Skimmed<()> {
        if self.peek()? != b'[' {
            return Err(Decline);
        }
        self.enter()?;
        let mut first = true;
        while self.element(&mut first)? {
            let (content, finish) = self.choice()?;
            s.choices += 1;
            s.content_choices += content as u32;
            if s.finish_reason.is_none() {
                s.finish_reason = finish;
            }
        }
        self.depth -= 1;
        Ok(())
    }

    /// One choice: whether it carries output, and its `finish_reason`.
    fn choice(&mut self) -> Skimmed<(bool, Option<Cow<'a, str>>)> {
        let (mut seen_delta, mut seen_message, mut seen_text, mut seen_finish) =
            (false, false, false, false);
        let mut content = false;
        let mut finish = None;
        self.open_object()?;
        let mut first = true;
        while let Some(key) = self.key(&mut first)? {
            match key {
                b"delta" | b"message" => {
                    first_time(if key == b"delta" {
                        &mut seen_delta
                    } else {
                        &mut seen_message
                    })?;
                    if !self.null()? {
                        content |= self.output()?;
                    }
                }
                b"text" => {
                    first_time(&mut seen_text)?;
                    content |= carries(self.value()?);
                }
                b"finish_reason" => {
                    first_time(&mut seen_finish)?;
                    if !self.null()? {
                        if self.peek()? != b'"' {
                            return Err(Decline);
                        }
                        let (from, to, escaped) = self.string()?;
                        if escaped {
                            return Err(Decline);
                        }
                        finish = Some(Cow::Borrowed(&self.text[from..to]));
                    }
                }
                _ => {
                    self.value()?;
                }
            }
        }
        self.depth -= 1;
        Ok((content, finish))
    }

    /// A `delta` or `message` object: whether any of its output fields carries output.
    fn output(&mut self) -> Skimmed<bool> {
        let mut seen = [false; 4];
        let mut carried = false;
        self.open_object()?;
        let mut first = true;
        while let Some(key) = self.key(&mut first)? {
            let slot = match key {
                b"content" => 0,
                b"reasoning_content" => 1,
                b"reasoning" => 2,
                b"tool_calls" => 3,
                _ => {
                    self.value()?;
                    continue;
                }
            };
            first_time(&mut seen[slot])?;
            carried |= carries(self.value()?);
        }
        self.depth -= 1;
        Ok(carried)
    }

    fn usage(&mut self) -> Skimmed<Usage> {
        let mut u = Usage::default();
        let (mut seen_prompt, mut seen_completion) = (false, false);
        self.open_object()?;
        let mut first = true;
        while let Some(key) = self.key(&mut first)? {
            match key {
                b"prompt_tokens" => {
                    first_time(&mut seen_prompt)?;
                    u.prompt_tokens = self.count()?;
                }
                b"completion_tokens" => {
                    first_time(&mut seen_completion)?;
                    u.completion_tokens = self.count()?;
                }
                _ => {
                    self.value()?;
                }
            }
        }
        self.depth -= 1;
        Ok(u)
    }

    /// `null` or a non-negative integer that fits in u64; anything else declines.
    fn count(&mut self) -> Skimmed<Option<u64>> {
        if self.null()? {
            return Ok(None);
        }
        let digits = self.number()?;
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(Decline);
        }
        let mut n: u64 = 0;
        for &d in digits {
            n = n
                .checked_mul(10)
                .and_then(|n| n.checked_add(u64::from(d - b'0')))
                .ok_or(Decline)?;
        }
        Ok(Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::super::summarize_serde;
    use super::*;
    use proptest::prelude::*;

    /// Where the skimmer answers, its answer is serde's.
    fn agrees(data: &[u8]) -> bool {
        let serde = summarize_serde(data);
        match summarize(data) {
            Ok(s) => {
                assert_eq!(
                    Some(&s),
                    serde.as_ref(),
                    "{:?}",
                    String::from_utf8_lossy(data)
                );
                true
            }
            Err(Decline) => false,
        }
    }

    fn fixture_events() -> &'static [Vec<u8>] {
        static EVENTS: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
        EVENTS.get_or_init(read_fixture_events)
    }

    fn read_fixture_events() -> Vec<Vec<u8>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm");
        let mut events = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let raw = std::fs::read(entry.unwrap().path()).unwrap();
            let text = String::from_utf8_lossy(&raw);
            for line in text.lines() {
                if let Some(data) = line.strip_prefix("data: ") {
                    events.push(data.as_bytes().to_vec());
                } else if line.starts_with('{') {
                    events.push(line.as_bytes().to_vec());
                }
            }
        }
        events
    }

    #[test]
    fn answers_for_every_recorded_vllm_event_and_agrees() {
        let events = fixture_events();
        assert!(events.len() > 20, "{}", events.len());
        let mut answered = 0;
        for e in events {
            if e.as_slice() == b"[DONE]" {
                continue;
            }
            let error = e.windows(8).any(|w| w == b"\"error\":");
            assert!(
                agrees(e) || error,
                "declined {}",
                String::from_utf8_lossy(e)
            );
            answered += 1;
        }
        assert!(answered > 20);
    }

    #[test]
    fn declines_what_serde_must_decide() {
        for data in [
            &br#"{"choices":[],"choices":[]}"#[..],
            br#"{"ch\u006fices":[{"text":"a"}]}"#,
            br#"{"choices":[{"text":"\u00e9"}]}"#,
            br#"{"usage":{"completion_tokens":1e2}}"#,
            br#"{"usage":{"completion_tokens":-1}}"#,
            br#"{"usage":{"completion_tokens":18446744073709551616}}"#,
            br#"{"error":{"message":"x"}}"#,
            br#"{"choices":[{"text":"a"}]} x"#,
            br#"[{"choices":[]}]"#,
            b"{\"choices\":[{\"text\":\"a\xff\"}]}",
            br#"{"choices":[{"finish_reason":5}]}"#,
            br#"{"a":01}"#,
            br#"{"a":[1,]}"#,
            br#"{"a":{"b":1,}}"#,
        ] {
            assert!(
                summarize(data).is_err(),
                "{}",
                String::from_utf8_lossy(data)
            );
        }
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(70), "]".repeat(70));
        assert!(summarize(deep.as_bytes()).is_err());
    }

    #[test]
    fn hand_picked_cases_agree() {
        for data in [
            &br#"{"choices":null,"usage":null}"#[..],
            br#" { "choices" : [ { "delta" : { "content" : "" } } , { "text" : "x" } ] } "#,
            br#"{"choices":[{"delta":{"content":[ ]}},{"message":{"tool_calls":[]}}]}"#,
            br#"{"choices":[{"delta":null,"text":null,"finish_reason":null},{"finish_reason":"stop"}]}"#,
            br#"{"choices":[{"finish_reason":"length"},{"finish_reason":"stop"}]}"#,
            br#"{"usage":{"prompt_tokens":0,"completion_tokens":18446744073709551615,"x":[1.5,-0.0,true,false,{"y":"\n\"\\\/"}]}}"#,
            br#"{"choices":[{"delta":{"reasoning":"r","content":null}}],"id":"\t"}"#,
            br#"{}"#,
        ] {
            assert!(agrees(data), "{}", String::from_utf8_lossy(data));
        }
    }

    /// JSON text of the shapes vLLM sends, with the variations serde must agree on.
    fn json_value(depth: u32) -> BoxedStrategy<String> {
        let leaf = prop_oneof![
            Just("null".to_string()),
            Just("true".to_string()),
            Just("false".to_string()),
            Just("\"\"".to_string()),
            Just("[]".to_string()),
            Just("[ ]".to_string()),
            Just("{}".to_string()),
            (0u64..u64::MAX).prop_map(|n| n.to_string()),
            Just("18446744073709551616".to_string()),
            Just("-1".to_string()),
            Just("1.25".to_string()),
            Just("2e3".to_string()),
            "[a-z \\\\\"\\n\\t/é]{0,8}".prop_map(|s| format!("{s:?}")),
        ];
        if depth == 0 {
            return leaf.boxed();
        }
        prop_oneof![
            3 => leaf,
            1 => prop::collection::vec(json_value(depth - 1), 0..3)
                .prop_map(|v| format!("[{}]", v.join(","))),
            1 => prop::collection::vec((json_key(), json_value(depth - 1)), 0..4)
                .prop_map(|v| object(&v)),
        ]
        .boxed()
    }

    fn json_key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("choices"),
            Just("usage"),
            Just("delta"),
            Just("message"),
            Just("text"),
            Just("finish_reason"),
            Just("content"),
            Just("reasoning_content"),
            Just("reasoning"),
            Just("tool_calls"),
            Just("prompt_tokens"),
            Just("completion_tokens"),
            Just("index"),
            Just("id"),
            Just("error"),
        ]
        .prop_map(str::to_string)
    }

    fn object(members: &[(String, String)]) -> String {
        let body: Vec<String> = members.iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
        format!("{{{}}}", body.join(","))
    }

    fn event() -> impl Strategy<Value = String> {
        let output_key = prop_oneof![
            3 => prop_oneof![
                Just("content"),
                Just("reasoning_content"),
                Just("reasoning"),
                Just("tool_calls"),
                Just("role"),
            ]
            .prop_map(str::to_string),
            1 => json_key(),
        ];
        let output_value = prop_oneof![json_value(1), "[a-z ]{1,8}".prop_map(|s| format!("{s:?}"))];
        let output = prop::collection::vec((output_key, output_value), 0..3)
            .prop_map(|m| object(&m))
            .boxed();
        let text = prop_oneof![json_value(1), "[a-z ]{1,8}".prop_map(|s| format!("{s:?}"))];
        let choice_member = prop_oneof![
            (prop_oneof![Just("delta"), Just("message")], output)
                .prop_map(|(k, v)| (k.to_string(), v)),
            text.prop_map(|v| ("text".to_string(), v)),
            prop_oneof![
                Just("null".to_string()),
                "[a-z_]{1,8}".prop_map(|s| format!("{s:?}"))
            ]
            .prop_map(|v| ("finish_reason".to_string(), v)),
            (json_key(), json_value(1)),
        ];
        let choice = prop::collection::vec(choice_member, 0..5).prop_map(|m| object(&m));
        let usage =
            prop::collection::vec((json_key(), json_value(0)), 0..4).prop_map(|m| object(&m));
        let member = prop_oneof![
            prop::collection::vec(choice, 0..3)
                .prop_map(|c| ("choices".to_string(), format!("[{}]", c.join(",")))),
            usage.prop_map(|u| ("usage".to_string(), u)),
            (json_key(), json_value(2)),
        ];
        (prop::collection::vec(member, 0..4), "[ \n]{0,2}")
            .prop_map(|(m, ws)| format!("{ws}{}{ws}", object(&m)))
    }

    #[test]
    fn generated_events_are_mostly_answered_not_declined() {
        // Otherwise the differential property below would hold by declining everything.
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = clean_event();
        let (mut answered, mut with_choices) = (0, 0);
        for _ in 0..2000 {
            let e = strategy.new_tree(&mut runner).unwrap().current();
            if agrees(e.as_bytes()) {
                answered += 1;
                with_choices += (summarize(e.as_bytes()).unwrap().content_choices > 0) as u32;
            }
        }
        assert!(
            answered > 1900 && with_choices > 500,
            "{answered} {with_choices}"
        );
    }

    /// Events as vLLM writes them (each field once, no exponents), fields in any order, any
    /// whitespace between tokens: the skimmer must answer nearly all of them.
    fn clean_event() -> impl Strategy<Value = String> {
        let ws = || "[ \n\t]{0,1}";
        let text = || {
            prop_oneof![
                Just("null".to_string()),
                Just("\"\"".to_string()),
                "[a-z \\\"\n\t/é]{1,6}".prop_map(|s| format!("{s:?}")),
            ]
        };
        let output = (
            prop::option::of(text()),
            prop::option::of(text()),
            prop::option::of(prop_oneof![
                Just("[]".to_string()),
                Just("[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]".to_string())
            ]),
            any::<bool>(),
        )
            .prop_map(|(content, reasoning, tools, role)| {
                let mut m = Vec::new();
                if role {
                    m.push(("role".to_string(), "\"assistant\"".to_string()));
                }
                m.extend(content.map(|v| ("content".to_string(), v)));
                m.extend(reasoning.map(|v| ("reasoning_content".to_string(), v)));
                m.extend(tools.map(|v| ("tool_calls".to_string(), v)));
                m
            });
        let choice = (
            prop_oneof![
                output.clone().prop_map(|o| ("delta", o)),
                output.prop_map(|o| ("message", o))
            ],
            prop::option::of(text()),
            prop::option::of(prop_oneof![
                Just("null".to_string()),
                Just("\"stop\"".to_string()),
                Just("\"length\"".to_string())
            ]),
            0u32..3,
        )
            .prop_map(|((field, out), text, finish, index)| {
                let mut m = vec![("index".to_string(), index.to_string())];
                m.push((field.to_string(), object(&out)));
                m.extend(text.map(|t| ("text".to_string(), t)));
                m.extend(finish.map(|f| ("finish_reason".to_string(), f)));
                m.push(("logprobs".to_string(), "null".to_string()));
                m
            });
        let usage = (0u64..1 << 40, prop::option::of(0u64..1 << 20)).prop_map(|(p, c)| {
            let c = c.map_or("null".to_string(), |c| c.to_string());
            format!("{{\"prompt_tokens\":{p},\"total_tokens\":1,\"completion_tokens\":{c},\"prompt_tokens_details\":null}}")
        });
        (
            prop::collection::vec(choice, 0..3),
            prop::option::of(usage),
            any::<prop::sample::Index>(),
            ws(),
        )
            .prop_map(move |(choices, usage, at, ws)| {
                let choices: Vec<String> = choices.iter().map(|c| object(c)).collect();
                let mut m = vec![
                    ("id".to_string(), "\"chatcmpl-1\"".to_string()),
                    ("created".to_string(), "1795976854".to_string()),
                    ("choices".to_string(), format!("[{}]", choices.join(","))),
                    ("metrics".to_string(), "null".to_string()),
                ];
                m.extend(usage.map(|u| ("usage".to_string(), u)));
                let n = m.len();
                m.rotate_left(at.index(n));
                object(&m)
                    .replace(',', &format!("{ws},{ws}"))
                    .replace(':', &format!(":{ws}"))
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn agrees_with_serde_on_clean_events(e in clean_event()) {
            prop_assert!(agrees(e.as_bytes()), "declined {e}");
        }

        #[test]
        fn agrees_with_serde_on_generated_events(e in event()) {
            agrees(e.as_bytes());
        }

        #[test]
        fn agrees_with_serde_on_mutated_recorded_events(
            pick in any::<prop::sample::Index>(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            cut in any::<bool>(),
        ) {
            let events = fixture_events();
            let mut e = events[pick.index(events.len())].clone();
            let i = at.index(e.len());
            if cut { e.truncate(i) } else { e[i] = byte }
            agrees(&e);
        }
    }
}
