//! The recorded stream/non-stream pairs (the same request sent both ways to vLLM 0.32 at
//! temperature 0): replaying each recorded stream through its API's fold must give the recorded
//! non-streamed body byte for byte, but for the ids and timestamps of the other request; the
//! forced-tool pairs must be refused before sending (their answers differ).

use crate::common::Fixture;
use crate::fold_support::{expected_body, pair, FORCED_TOOL, PAIRS};
use serde_json::Value;
use tokenmeter::dialect::{detect, Api};
use tokenmeter::fold::{Fold, Folded, Unfoldable};

/// The data of each SSE event of a recorded stream.
fn event_data(f: &Fixture) -> Vec<Vec<u8>> {
    let mut scanner = tokenmeter::sse::SseScanner::default();
    let mut out = Vec::new();
    scanner.feed(&f.body, |ev| out.push(ev.data.to_vec()));
    out
}

fn replay(fold: &mut dyn Fold, stream: &Fixture) -> Result<Folded, Unfoldable> {
    for data in event_data(stream) {
        fold.feed(&data)?;
    }
    fold.finish()
}

#[test]
fn every_pair_rebuilds_the_recorded_non_streamed_body_or_is_refused() {
    for (name, path, request) in PAIRS {
        let api = detect(path).unwrap();
        let (stream, nonstream) = pair(name);
        assert_eq!((stream.status(), nonstream.status()), (200, 200), "{name}");
        let upgraded = api.dialect().as_stream(request.as_bytes());
        if FORCED_TOOL.contains(name) {
            let Err(Unfoldable(why)) = upgraded else {
                panic!("{name}: a request with tools must pass through");
            };
            assert!(why.contains("tool"), "{name}: {why}");
            continue;
        }
        let up = upgraded
            .unwrap_or_else(|e| panic!("{name}: {e:?}"))
            .unwrap();
        let (body, mut fold) = (up.body, up.fold);
        let sent: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(sent["stream"], true, "{name}");
        let Folded::Answer(rebuilt) =
            replay(fold.as_mut(), &stream).unwrap_or_else(|e| panic!("{name}: {e:?}"))
        else {
            panic!("{name}: not an answer");
        };
        let rebuilt = String::from_utf8(rebuilt).unwrap();
        let recorded = String::from_utf8(nonstream.body.clone()).unwrap();
        // Byte for byte, once the other request's ids and times are swapped for the stream's.
        let expected = expected_body(&recorded, &rebuilt);
        assert_eq!(rebuilt, expected, "{name}");
        let declared = nonstream
            .headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .unwrap();
        assert_eq!(
            declared.1,
            recorded.len().to_string(),
            "{name}: the recording is whole"
        );
    }
}

#[test]
fn the_forced_tool_streams_would_not_fold_into_the_recorded_answers() {
    // Had the rule let them through, the folds would still have stopped at the tool call.
    let reqs = [
        (
            "p03_chat_tool_named",
            Api::Chat,
            r#"{"model":"tiny-llama","messages":[],"max_tokens":40}"#,
        ),
        (
            "p09_messages_tool_any",
            Api::Messages,
            r#"{"model":"tiny-llama","messages":[],"max_tokens":40}"#,
        ),
        (
            "p12_responses_tool_required",
            Api::Responses,
            r#"{"model":"tiny-llama","input":"x"}"#,
        ),
    ];
    for (name, api, req) in reqs {
        let (stream, _) = pair(name);
        let mut fold = api
            .dialect()
            .as_stream(req.as_bytes())
            .unwrap()
            .unwrap()
            .fold;
        let err = replay(fold.as_mut(), &stream).unwrap_err();
        assert!(
            err.0.contains("tool") || err.0.contains("non-text") || err.0.contains("other than"),
            "{name}: {err:?}"
        );
    }
}

#[test]
fn every_recorded_pair_is_covered() {
    let dir = crate::common::fixture_path("agents/pairs");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|f| f.strip_suffix(".nonstream.http").map(str::to_string))
        .collect();
    names.sort();
    let listed: Vec<String> = PAIRS.iter().map(|p| p.0.to_string()).collect();
    assert_eq!(names, listed);
}
