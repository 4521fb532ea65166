//! The upgrade rule (which non-streamed requests may be sent as streams) and the folds' refusals:
//! whatever a fold cannot prove equal to vLLM's non-streamed answer stops it.

use tokenmeter::dialect::Api;
use tokenmeter::fold::{Folded, Unfoldable};

fn refused(api: Api, body: &str) -> &'static str {
    match api.dialect().as_stream(body.as_bytes()) {
        Err(Unfoldable(why)) => why,
        Ok(Some(_)) => panic!("{body} was upgraded"),
        Ok(None) => panic!("{body} is not a non-streamed request"),
    }
}

fn upgraded(api: Api, body: &str) -> serde_json::Value {
    let up = api.dialect().as_stream(body.as_bytes()).unwrap().unwrap();
    serde_json::from_slice(&up.body).unwrap()
}

#[test]
fn plain_requests_are_upgraded_with_usage_asked_where_needed() {
    let chat = upgraded(
        Api::Chat,
        r#"{"model":"m","messages":[],"stream":false,"temperature":0.5}"#,
    );
    assert_eq!(
        chat.to_string(),
        r#"{"model":"m","messages":[],"stream":true,"temperature":0.5,"stream_options":{"include_usage":true}}"#
    );
    let cmpl = upgraded(Api::Completions, r#"{"model":"m","prompt":"x"}"#);
    assert_eq!(cmpl["stream_options"]["include_usage"], true);
    let msg = upgraded(
        Api::Messages,
        r#"{"model":"m","max_tokens":4,"messages":[]}"#,
    );
    assert_eq!(
        msg.to_string(),
        r#"{"model":"m","max_tokens":4,"messages":[],"stream":true}"#
    );
    let resp = upgraded(Api::Responses, r#"{"model":"m","input":"x","tools":[]}"#);
    assert_eq!(resp["stream"], true);
    assert!(resp.get("stream_options").is_none());
    // Chat with n > 1 and logprobs is proven by the pairs.
    upgraded(
        Api::Chat,
        r#"{"messages":[],"n":2,"logprobs":true,"top_logprobs":2}"#,
    );
    upgraded(
        Api::Chat,
        r#"{"messages":[],"tools":null,"tool_choice":null}"#,
    );
}

#[test]
fn streamed_requests_are_left_alone() {
    for api in Api::ALL {
        assert!(api
            .dialect()
            .as_stream(br#"{"stream":true}"#)
            .unwrap()
            .is_none());
    }
}

#[test]
fn what_cannot_be_proven_passes_through_with_its_reason() {
    let cases = [
        (
            Api::Chat,
            r#"{"messages":[],"tools":[{"type":"function"}]}"#,
            "request has tools",
        ),
        (
            Api::Chat,
            r#"{"messages":[],"tool_choice":"none"}"#,
            "request has tool_choice",
        ),
        (
            Api::Chat,
            r#"{"messages":[],"functions":[{}]}"#,
            "request has functions",
        ),
        (
            Api::Chat,
            r#"{"messages":[],"prompt_logprobs":1}"#,
            "request asks for prompt logprobs",
        ),
        (
            Api::Chat,
            r#"{"messages":[],"return_token_ids":true}"#,
            "request asks for token ids",
        ),
        (
            Api::Chat,
            r#"{"messages":[],"use_beam_search":true}"#,
            "request uses beam search",
        ),
        (
            Api::Chat,
            r#"{"messages":[],"stream_options":{"include_usage":true}}"#,
            "request has stream_options without stream",
        ),
        (
            Api::Chat,
            r#"{"messages":[],"n":0}"#,
            "n is not a positive integer",
        ),
        (
            Api::Chat,
            r#"{"messages":[],"stream":"no"}"#,
            "stream is not a boolean",
        ),
        (Api::Chat, r#"[1]"#, "request body is not a JSON object"),
        (
            Api::Completions,
            r#"{"prompt":["a","b"]}"#,
            "prompt is not one string",
        ),
        (Api::Completions, r#"{"prompt":"a","n":2}"#, "n is not 1"),
        (
            Api::Completions,
            r#"{"prompt":"a","logprobs":0}"#,
            "request asks for logprobs",
        ),
        (
            Api::Completions,
            r#"{"prompt":"a","echo":true}"#,
            "request asks for echo",
        ),
        (
            Api::Completions,
            r#"{"prompt":"a","best_of":2}"#,
            "request has best_of",
        ),
        (
            Api::Messages,
            r#"{"messages":[],"tools":[{}]}"#,
            "request has tools",
        ),
        (
            Api::Messages,
            r#"{"messages":[],"thinking":{"type":"enabled"}}"#,
            "request asks for thinking",
        ),
        (
            Api::Responses,
            r#"{"input":"x","tools":[{}]}"#,
            "request has tools",
        ),
        (
            Api::Responses,
            r#"{"input":"x","reasoning":{"effort":"low"}}"#,
            "request asks for reasoning",
        ),
        (
            Api::Responses,
            r#"{"input":"x","background":true}"#,
            "request runs in the background",
        ),
        (
            Api::Responses,
            r#"{"input":"x","include":["message.output_text.logprobs"]}"#,
            "request has include",
        ),
    ];
    for (api, body, why) in cases {
        assert_eq!(refused(api, body), why, "{body}");
    }
}

fn fold_chat(req: &str, events: &[&str]) -> Result<Folded, Unfoldable> {
    let mut fold = Api::Chat
        .dialect()
        .as_stream(req.as_bytes())
        .unwrap()
        .unwrap()
        .fold;
    for e in events {
        fold.feed(e.as_bytes())?;
    }
    fold.finish()
}

const ROLE: &str = r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#;
const USAGE: &str = r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":1,"total_tokens":2,"completion_tokens":1}}"#;

#[test]
fn chat_logprob_floats_take_the_non_streamed_layout() {
    let tok = r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"\u00e9\n"},"logprobs":{"content":[{"token":"x","logprob":-0.00001234,"bytes":[120],"top_logprobs":[{"token":"x","logprob":-1.5e-7,"bytes":[120]}]}]},"finish_reason":"stop","stop_reason":null}]}"#;
    let Ok(Folded::Answer(a)) = fold_chat(
        r#"{"messages":[],"logprobs":true}"#,
        &[ROLE, tok, USAGE, "[DONE]"],
    ) else {
        panic!()
    };
    let a = String::from_utf8(a).unwrap();
    assert!(
        a.contains(r#""content":"\u00e9\n","#),
        "escaped text is copied as sent: {a}"
    );
    assert!(a.contains(r#""logprob":-1.234e-05,"#), "{a}");
    assert!(a.contains(r#""logprob":-1.5e-07,"#), "{a}");
    assert!(a.contains(r#""system_fingerprint":null,"#), "{a}");
}

#[test]
fn chat_streams_that_cannot_be_proven_stop_the_fold() {
    let req = r#"{"messages":[]}"#;
    let reasoning = r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"reasoning":"hm"},"logprobs":null,"finish_reason":null}]}"#;
    assert_eq!(
        fold_chat(req, &[ROLE, reasoning]).unwrap_err().0,
        "stream carries reasoning"
    );
    let tools = r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]},"logprobs":null,"finish_reason":null}]}"#;
    assert_eq!(
        fold_chat(req, &[ROLE, tools]).unwrap_err().0,
        "stream carries tool calls"
    );
    let unknown = r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[],"new_field":1}"#;
    assert_eq!(
        fold_chat(req, &[ROLE, unknown]).unwrap_err().0,
        "unknown chunk shape"
    );
    let fin = r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":"length","stop_reason":null}]}"#;
    assert_eq!(
        fold_chat(req, &[ROLE, fin, USAGE]).unwrap_err().0,
        "stream ended without [DONE]"
    );
    assert_eq!(
        fold_chat(req, &[ROLE, fin, "[DONE]"]).unwrap_err().0,
        "stream ended without usage"
    );
    assert_eq!(
        fold_chat(r#"{"messages":[],"n":2}"#, &[ROLE, fin, USAGE, "[DONE]"])
            .unwrap_err()
            .0,
        "stream did not carry every choice"
    );
    assert!(matches!(
        fold_chat(req, &[ROLE, fin, USAGE, "[DONE]"]),
        Ok(Folded::Answer(_))
    ));
}

#[test]
fn an_error_event_becomes_the_non_streamed_error() {
    // vLLM writes a streamed error with json.dumps' default separators and ASCII escapes.
    let err = r#"{"error": {"message": "caf\u00e9 went wrong", "type": "InternalServerError", "param": null, "code": 500}}"#;
    let Ok(Folded::Error { status, body }) =
        fold_chat(r#"{"messages":[]}"#, &[ROLE, err, "[DONE]"])
    else {
        panic!()
    };
    assert_eq!(status, 500);
    assert_eq!(
        String::from_utf8(body).unwrap(),
        r#"{"error":{"message":"café went wrong","type":"InternalServerError","param":null,"code":500}}"#
    );
    let mut m = Api::Messages
        .dialect()
        .as_stream(br#"{"messages":[]}"#)
        .unwrap()
        .unwrap()
        .fold;
    m.feed(br#"{"type":"error","error":{"type":"BadRequestError","message":"no"}}"#)
        .unwrap();
    assert_eq!(
        m.finish().unwrap(),
        Folded::Error {
            status: 400,
            body: br#"{"type":"error","error":{"type":"BadRequestError","message":"no"}}"#.to_vec()
        }
    );
}

#[test]
fn held_bytes_follow_the_text_kept() {
    let mut fold = Api::Chat
        .dialect()
        .as_stream(br#"{"messages":[]}"#)
        .unwrap()
        .unwrap()
        .fold;
    fold.feed(ROLE.as_bytes()).unwrap();
    let tok = r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"abcd"},"logprobs":null,"finish_reason":null}]}"#;
    for _ in 0..10 {
        fold.feed(tok.as_bytes()).unwrap();
    }
    assert_eq!(fold.held_bytes(), 40);
}
