//! Completions: which non-streamed requests may be sent as streams, and the fold that rebuilds
//! vLLM 0.32's `text_completion` object from its stream.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::chat::{Header, StreamEnd};
use super::{
    as_stream_request, choices_asked, first_asking, is_null, push_raw_or_null, string_inner,
    AsStream, Fold, Folded, Unfoldable,
};

/// A non-streamed completions request as a stream with its fold, or why it must pass through.
pub fn as_stream(body: &[u8]) -> Result<Option<AsStream>, Unfoldable> {
    as_stream_request(body, refusal, true, |req| {
        Box::new(CompletionsFold::new(req))
    })
}

/// Why a completions request must pass through unchanged, if it must.
///
/// Only one string prompt with one choice and no logprobs is proven by a recorded pair: a list of
/// prompts numbers its choices across prompts, streamed logprobs carry offsets relative to each
/// event, echo and `best_of` change what is streamed, and nothing recorded shows them folding.
pub(crate) fn refusal(req: &Map<String, Value>) -> Option<&'static str> {
    if !matches!(req.get("prompt"), Some(Value::String(_))) {
        return Some("prompt is not one string");
    }
    if choices_asked(req) != Some(1) {
        return Some("n is not 1");
    }
    if let Some(k) = first_asking(
        req,
        &[
            "logprobs",
            "prompt_logprobs",
            "echo",
            "best_of",
            "return_token_ids",
            "use_beam_search",
            "kv_transfer_params",
            "suffix",
            "stream_options",
        ],
    ) {
        return Some(match k {
            "logprobs" => "request asks for logprobs",
            "prompt_logprobs" => "request asks for prompt logprobs",
            "echo" => "request asks for echo",
            "best_of" => "request has best_of",
            "return_token_ids" => "request asks for token ids",
            "use_beam_search" => "request uses beam search",
            "kv_transfer_params" => "request has kv_transfer_params",
            "suffix" => "request has suffix",
            _ => "request has stream_options without stream",
        });
    }
    // `logprobs: 0` asks for logprobs too (`asks` treats only null/false as absent).
    None
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Chunk<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    object: Option<&'a RawValue>,
    #[serde(borrow)]
    created: Option<&'a RawValue>,
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    choices: Vec<ChunkChoice<'a>>,
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
    #[serde(borrow)]
    system_fingerprint: Option<&'a RawValue>,
    #[serde(borrow)]
    metrics: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChunkChoice<'a> {
    index: u32,
    #[serde(borrow)]
    text: Option<&'a RawValue>,
    #[serde(borrow)]
    logprobs: Option<&'a RawValue>,
    #[serde(borrow)]
    finish_reason: Option<&'a RawValue>,
    #[serde(borrow)]
    stop_reason: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_token_ids: Option<&'a RawValue>,
    #[serde(borrow)]
    token_ids: Option<&'a RawValue>,
}

/// Rebuilds a `text_completion` from its stream (one choice: see [`refusal`]).
#[derive(Default)]
pub struct CompletionsFold {
    header: Header,
    seen: bool,
    text: Vec<u8>,
    finish_reason: Option<String>,
    stop_reason: Option<String>,
    end: StreamEnd,
}

impl CompletionsFold {
    /// A fold for the (already admitted) non-streamed request `req`.
    pub fn new(_req: &Map<String, Value>) -> CompletionsFold {
        CompletionsFold::default()
    }
}

impl Fold for CompletionsFold {
    fn feed(&mut self, data: &[u8]) -> Result<(), Unfoldable> {
        if self.end.take_control(data)? {
            return Ok(());
        }
        let chunk: Chunk<'_> =
            serde_json::from_slice(data).map_err(|_| Unfoldable("unknown chunk shape"))?;
        if chunk
            .object
            .is_some_and(|o| o.get() != "\"text_completion\"")
        {
            return Err(Unfoldable("unknown chunk object"));
        }
        self.header.note(
            chunk.id,
            chunk.created,
            chunk.model,
            chunk.system_fingerprint,
            chunk.metrics,
        )?;
        self.header.note_usage(chunk.usage)?;
        for c in &chunk.choices {
            if c.index != 0 {
                return Err(Unfoldable("choice index beyond n"));
            }
            self.seen = true;
            if !is_null(c.logprobs) || !is_null(c.token_ids) || !is_null(c.prompt_token_ids) {
                return Err(Unfoldable("stream carries logprobs or token ids"));
            }
            if let Some(t) = c.text.filter(|t| t.get() != "null") {
                let inner = string_inner(t.get()).ok_or(Unfoldable("text is not a string"))?;
                self.text.extend_from_slice(inner.as_bytes());
            }
            if let Some(f) = c.finish_reason.filter(|f| f.get() != "null") {
                self.finish_reason = Some(f.get().to_string());
                self.stop_reason = c.stop_reason.map(|s| s.get().to_string());
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<Folded, Unfoldable> {
        if let Some(e) = self.end.ended()? {
            return Ok(e);
        }
        let (true, Some(finish)) = (self.seen, &self.finish_reason) else {
            return Err(Unfoldable("the choice did not finish"));
        };
        let mut out = Vec::with_capacity(self.text.len() + 700);
        self.header.write_head("text_completion", &mut out)?;
        out.extend_from_slice(b",\"choices\":[{\"index\":0,\"text\":\"");
        out.extend_from_slice(&self.text);
        out.extend_from_slice(b"\",\"logprobs\":null,\"finish_reason\":");
        out.extend_from_slice(finish.as_bytes());
        out.extend_from_slice(b",\"stop_reason\":");
        push_raw_or_null(&mut out, self.stop_reason.as_deref());
        out.extend_from_slice(
            b",\"token_ids\":null,\"prompt_logprobs\":null,\"prompt_token_ids\":null,\"routed_experts\":null}]",
        );
        self.header.write_totals(&mut out)?;
        out.extend_from_slice(b",\"kv_transfer_params\":null,\"ec_transfer_params\":null");
        self.header.write_metrics_and_close(&mut out);
        Ok(Folded::Answer(out))
    }

    fn held_bytes(&self) -> usize {
        self.text.len()
    }
}
