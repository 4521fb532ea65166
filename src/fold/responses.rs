//! OpenAI Responses: which non-streamed requests may be sent as streams, and the fold that rebuilds
//! vLLM 0.32's `response` object from its event stream.
//!
//! vLLM's terminal `response.completed` event carries the whole response object, member for
//! member the one it answers non-streamed (compare the recorded pairs); only its floats are laid
//! out by the stream's serializer, so they are laid out again as the non-streamed answer has them.
//! The fold keeps nothing but that event.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{as_stream_request, first_asking, pyjson, AsStream, Fold, Folded, Unfoldable};

/// A non-streamed Responses request as a stream with its fold, or why it must pass through.
pub fn as_stream(body: &[u8]) -> Result<Option<AsStream>, Unfoldable> {
    as_stream_request(body, refusal, false, |_| Box::<ResponsesFold>::default())
}

/// Why a Responses request must pass through unchanged, if it must: tools (the recorded
/// forced-tool pair differs), reasoning (its items are parsed differently when streamed),
/// `include` and `top_logprobs` (no recording shows them), and background mode (answered
/// at once with a queued response, not with the generation).
pub(crate) fn refusal(req: &Map<String, Value>) -> Option<&'static str> {
    first_asking(
        req,
        &[
            "tools",
            "tool_choice",
            "reasoning",
            "include",
            "top_logprobs",
            "background",
            "stream_options",
        ],
    )
    .map(|k| match k {
        "tools" => "request has tools",
        "tool_choice" => "request has tool_choice",
        "reasoning" => "request asks for reasoning",
        "include" => "request has include",
        "top_logprobs" => "request asks for logprobs",
        "background" => "request runs in the background",
        _ => "request has stream_options without stream",
    })
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(borrow)]
    response: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Completed<'a> {
    #[serde(borrow, default)]
    output: Vec<Item<'a>>,
}

#[derive(Deserialize)]
struct Item<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
}

/// Rebuilds a Responses `response` from its stream: the terminal event's response object.
#[derive(Default)]
pub struct ResponsesFold {
    answer: Option<Vec<u8>>,
}

impl Fold for ResponsesFold {
    fn feed(&mut self, data: &[u8]) -> Result<(), Unfoldable> {
        if self.answer.is_some() {
            return Err(Unfoldable("event after the end of the stream"));
        }
        let ev: Event<'_> =
            serde_json::from_slice(data).map_err(|_| Unfoldable("unknown event shape"))?;
        match ev.kind {
            "response.completed" => {
                let raw = ev
                    .response
                    .ok_or(Unfoldable("completed without response"))?;
                let done: Completed<'_> = serde_json::from_str(raw.get())
                    .map_err(|_| Unfoldable("unknown response shape"))?;
                if done.output.iter().any(|i| i.kind != "message") {
                    return Err(Unfoldable("response has output other than messages"));
                }
                let mut out = Vec::with_capacity(raw.get().len());
                pyjson::copy_with_python_floats(raw.get().as_bytes(), &mut out)
                    .ok_or(Unfoldable("response not readable"))?;
                self.answer = Some(out);
            }
            // Errors and failures: no recording shows the non-streamed answer to rebuild, so the
            // request is asked again non-streamed and vLLM's own answer passes through.
            "error" | "response.failed" | "response.incomplete" => {
                return Err(Unfoldable("stream ended in an error or failure"))
            }
            k if k.starts_with("response.") => {
                if k.contains("reasoning") || k.contains("function_call") || k.contains("refusal") {
                    return Err(Unfoldable("stream carries output other than text"));
                }
            }
            _ => return Err(Unfoldable("unknown event type")),
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<Folded, Unfoldable> {
        self.answer
            .take()
            .map(Folded::Answer)
            .ok_or(Unfoldable("stream ended without response.completed"))
    }

    fn held_bytes(&self) -> usize {
        self.answer.as_ref().map_or(0, Vec::len)
    }
}
