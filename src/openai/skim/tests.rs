//! The skimmer against serde's reading: recorded vLLM events, hand-picked edge cases, generated
//! vLLM-shaped and messy JSON, and byte-mutated recorded events.

use super::super::summarize_reference;
use super::*;
use proptest::prelude::*;

/// Where the skimmer answers, its answer is serde's.
fn agrees(data: &[u8]) -> bool {
    let serde = summarize_reference(data);
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
        let path = entry.unwrap().path();
        if path.is_file() {
            events.extend(file_events(&path));
        }
    }
    events
}

/// The events of one recorded exchange: its `data:` values and its JSON body lines.
fn file_events(path: &std::path::Path) -> Vec<Vec<u8>> {
    let raw = std::fs::read(path).unwrap();
    let text = String::from_utf8_lossy(&raw);
    text.lines()
        .filter_map(|line| match line.strip_prefix("data: ") {
            Some(data) => Some(data),
            None => line.starts_with('{').then_some(line),
        })
        .map(|e| e.as_bytes().to_vec())
        .collect()
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
        // Text beyond ASCII, in a skipped value and in one that is read.
        "{\"id\":\"caf\u{e9} \u{1f600}\",\"choices\":[{\"delta\":{\"content\":\"\u{4e2d}\u{6587}\"},\"finish_reason\":\"\u{e9}t\u{e9}\"}]}".as_bytes(),
    ] {
        assert!(agrees(data), "{}", String::from_utf8_lossy(data));
    }
    // Invalid UTF-8 inside a string, skipped or read, and a stray high byte outside one.
    for data in [
        &b"{\"id\":\"\xc3\",\"choices\":[]}"[..],
        b"{\"choices\":[{\"delta\":{\"content\":\"\xff\xfe\"}}]}",
        b"{\"choices\":[{\"finish_reason\":\"\xe9\"}]}",
        b"{\"choices\":[]\xc3\xa9}",
    ] {
        assert!(!agrees(data), "{}", String::from_utf8_lossy(data));
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
        (prop_oneof![Just("delta"), Just("message")], output).prop_map(|(k, v)| (k.to_string(), v)),
        text.prop_map(|v| ("text".to_string(), v)),
        prop_oneof![
            Just("null".to_string()),
            "[a-z_]{1,8}".prop_map(|s| format!("{s:?}"))
        ]
        .prop_map(|v| ("finish_reason".to_string(), v)),
        (json_key(), json_value(1)),
    ];
    let choice = prop::collection::vec(choice_member, 0..5).prop_map(|m| object(&m));
    let usage = prop::collection::vec((json_key(), json_value(0)), 0..4).prop_map(|m| object(&m));
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

/// The memo's answer for `e` after learning from `learn` is the whole parse's answer for `e`.
fn memo_agrees(learn: &[u8], e: &[u8]) {
    let mut memo = EventMemo::default();
    let _ = summarize_memo(learn, &mut memo);
    let resumed = summarize_memo(e, &mut memo).ok();
    assert_eq!(
        resumed,
        summarize(e).ok(),
        "learned {:?}, read {:?}",
        String::from_utf8_lossy(learn),
        String::from_utf8_lossy(e)
    );
}

#[test]
fn a_memo_skips_the_repeated_members_and_answers_what_the_whole_parse_answers() {
    let mut resumed = 0;
    let mut memo = EventMemo::default();
    for e in fixture_events() {
        let before = memo.prefix().to_vec();
        let got = summarize_memo(e, &mut memo).ok();
        assert_eq!(got, summarize(e).ok(), "{}", String::from_utf8_lossy(e));
        if !before.is_empty() && e.starts_with(&before) {
            resumed += 1;
        }
    }
    // Every event of a recorded stream after its first shares `id`..`model` with the one before.
    assert!(resumed > 20, "{resumed}");
    let first = br#"{"id":"x-1","object":"chat.completion.chunk","created":17,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}"#;
    let mut memo = EventMemo::default();
    assert!(summarize_memo(first, &mut memo).is_ok());
    assert_eq!(
        memo.prefix(),
        br#"{"id":"x-1","object":"chat.completion.chunk","created":17,"model":"m","#.to_vec()
    );
    // The same prefix, then what the whole parse must still check.
    for (e, answers) in [
        (&br#"{"id":"x-1","object":"chat.completion.chunk","created":17,"model":"m","choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]}"#[..], true),
        (br#"{"id":"x-1","object":"chat.completion.chunk","created":17,"model":"m","choices":[],"choices":[]}"#, false),
        (br#"{"id":"x-1","object":"chat.completion.chunk","created":17,"model":"m","model":"n","choices":[]}"#, true),
        (br#"{"id":"x-1","object":"chat.completion.chunk","created":17,"model":"m","choices":[{"text":"\u00e9"}]}"#, false),
        (br#"{"id":"x-1","object":"chat.completion.chunk","created":17,"model":"m","choices":[]"#, false),
        (br#"{"id":"x-1","object":"chat.completion.chunk","created":17,"model":"m","choices":[]}x"#, false),
        (b"{\"id\":\"x-1\",\"object\":\"chat.completion.chunk\",\"created\":17,\"model\":\"m\",\"choices\":[{\"text\":\"\xff\"}]}", false),
        // Not the prefix: a number that goes on past the learned one.
        (br#"{"id":"x-1","object":"chat.completion.chunk","created":170,"model":"m","choices":[]}"#, true),
    ] {
        memo_agrees(first, e);
        assert_eq!(summarize(e).is_ok(), answers, "{}", String::from_utf8_lossy(e));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// After learning from a recorded event, the memo reads any one-byte change, cut or insertion
    /// of it (inside or outside the prefix) as the whole parse does.
    #[test]
    fn a_memo_agrees_with_the_whole_parse_on_mutated_recorded_events(
        pick in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        how in 0..3u8,
    ) {
        let events = fixture_events();
        let learn = &events[pick.index(events.len())];
        let mut e = learn.clone();
        let i = at.index(e.len());
        match how {
            0 => e[i] = byte,
            1 => e.truncate(i),
            _ => e.insert(i, byte),
        }
        memo_agrees(learn, &e);
    }
}

/// `learn` with its template's string replaced by `body` (None: `learn` has no template).
fn with_template_body(learn: &[u8], body: &[u8]) -> Option<Vec<u8>> {
    let mut memo = EventMemo::default();
    summarize_memo(learn, &mut memo).ok()?;
    let (quote, after) = memo.template_places()?;
    let mut e = learn[..=quote].to_vec();
    e.extend_from_slice(body);
    e.extend_from_slice(&learn[after - 1..]);
    Some(e)
}

/// The events of one recorded stream but its `[DONE]`.
fn stream_fixture(name: &str) -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm");
    let mut events = file_events(&dir.join(name));
    events.retain(|e| e.as_slice() != b"[DONE]");
    events
}

#[test]
fn a_template_answers_the_token_events_of_recorded_streams_as_the_whole_parse_does() {
    for (name, expected) in [
        ("02_chat_stream_plain.http", 3),
        ("03_chat_stream_usage.http", 3),
        ("09_completions_stream_usage.http", 2),
        ("agents/c01_chat_stream_tool_named.http", 15),
    ] {
        let mut memo = EventMemo::default();
        let mut hits = 0;
        for e in stream_fixture(name) {
            let by_template = memo.template_answer(&e);
            let got = summarize_memo(&e, &mut memo).ok();
            assert_eq!(
                got,
                summarize(&e).ok(),
                "{name}: {}",
                String::from_utf8_lossy(&e)
            );
            if let Some(t) = by_template {
                assert_eq!(Some(t), got);
                hits += 1;
            }
        }
        // Every token event after the first that learns, but the one with the finish reason.
        assert_eq!(hits, expected, "{name}: template answers");
    }
}

#[test]
fn a_template_declines_what_its_string_cannot_hide() {
    let learn = br#"{"id":"x-1","object":"chat.completion.chunk","created":17,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}"#;
    let mut memo = EventMemo::default();
    summarize_memo(learn, &mut memo).unwrap();
    assert!(memo.template_answer(learn).is_some());
    let declined = [
        &b""[..],
        b"\\u00e9",
        b"\\x",
        b"\xff",
        b"\x01",
        b"a\"},\"finish_reason\":\"stop\"}]}",
        b"a\"},\"finish_reason\":\"stop",
        b"a\"",
    ];
    let answered = [&b"b"[..], b"\\\"", b"\\n\\t", "é€😀".as_bytes(), b"  "];
    let cases = declined.iter().map(|b| (b, false));
    for (body, answers) in cases.chain(answered.iter().map(|b| (b, true))) {
        let e = with_template_body(learn, body).unwrap();
        assert_eq!(
            memo.template_answer(&e).is_some(),
            answers,
            "{:?}",
            String::from_utf8_lossy(&e)
        );
        memo_agrees(learn, &e);
    }
    // A finish reason, a usage, or an empty string: nothing to learn a template from.
    for e in [
        &br#"{"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}"#[..],
        br#"{"id":"x","choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":1}}"#,
        br#"{"id":"x","choices":[{"index":0,"delta":{"content":""}}]}"#,
    ] {
        let mut memo = EventMemo::default();
        summarize_memo(e, &mut memo).unwrap();
        assert!(memo.template_places().is_none(), "{}", String::from_utf8_lossy(e));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// After learning from a recorded event, an event that differs from it only between the
    /// template's quotes, by any bytes, is read as the whole parse reads it.
    #[test]
    fn a_template_agrees_with_the_whole_parse_whatever_its_string_holds(
        pick in any::<prop::sample::Index>(),
        body in prop::collection::vec(
            prop_oneof![
                4 => 0x20u8..0x7f,
                1 => Just(b'"'),
                1 => Just(b'\\'),
                1 => any::<u8>(),
            ],
            0..12,
        ),
    ) {
        let events = fixture_events();
        let learn = &events[pick.index(events.len())];
        if let Some(e) = with_template_body(learn, &body) {
            memo_agrees(learn, &e);
        }
    }
}

#[test]
fn a_stream_whose_events_differ_outside_their_token_stops_learning_templates() {
    let event = |i: u32| {
        format!(
            r#"{{"id":"x-1","object":"chat.completion.chunk","created":17,"model":"m","choices":[{{"index":0,"delta":{{"content":"t{i}"}},"finish_reason":null}}],"stamp":{i}}}"#
        )
    };
    let mut memo = EventMemo::default();
    for i in 0..10 {
        let e = event(i);
        let got = summarize_memo(e.as_bytes(), &mut memo).ok();
        assert_eq!(got, summarize(e.as_bytes()).ok());
        // Learned from the first event, then three misses in a row.
        assert_eq!(memo.template_places().is_some(), i < 3, "event {i}");
    }
    // The prefix is still used.
    assert!(!memo.prefix().is_empty());
}
