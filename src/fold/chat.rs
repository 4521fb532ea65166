//! Chat completions: which non-streamed requests may be sent as streams, and the fold that rebuilds
//! vLLM 0.32's `chat.completion` object from its `chat.completion.chunk` stream.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{
    as_stream_request, choices_asked, first_asking, is_null, openai_error, push_raw_or_null,
    pyjson, string_inner, AsStream, Fold, Folded, Unfoldable,
};

/// A non-streamed chat request as a stream with its fold, or why it must pass through.
pub fn as_stream(body: &[u8]) -> Result<Option<AsStream>, Unfoldable> {
    as_stream_request(body, refusal, true, |req| Box::new(ChatFold::new(req)))
}

/// Why a chat request must pass through unchanged, if it must.
///
/// Tools: vLLM parses tool calls with a different parser when it streams, and the recorded pairs
/// show the answers differ (a call cut by the token limit stays text non-streamed, becomes a
/// parsed call streamed). Token ids, prompt logprobs, echo and beam search change what the
/// stream carries in ways no recording shows. `stream_options` without `stream` is an error
/// non-streamed that sending it as a stream would turn into a success.
pub(crate) fn refusal(req: &Map<String, Value>) -> Option<&'static str> {
    if let Some(k) = first_asking(req, &["tools", "tool_choice", "functions", "function_call"]) {
        return Some(match k {
            "tools" => "request has tools",
            "tool_choice" => "request has tool_choice",
            _ => "request has functions",
        });
    }
    if let Some(k) = first_asking(
        req,
        &[
            "return_token_ids",
            "prompt_logprobs",
            "echo",
            "use_beam_search",
            "kv_transfer_params",
            "stream_options",
        ],
    ) {
        return Some(match k {
            "return_token_ids" => "request asks for token ids",
            "prompt_logprobs" => "request asks for prompt logprobs",
            "echo" => "request asks for echo",
            "use_beam_search" => "request uses beam search",
            "kv_transfer_params" => "request has kv_transfer_params",
            _ => "request has stream_options without stream",
        });
    }
    choices_asked(req)
        .is_none()
        .then_some("n is not a positive integer")
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
    prompt_token_ids: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_text: Option<&'a RawValue>,
    #[serde(borrow)]
    metrics: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChunkChoice<'a> {
    index: u32,
    #[serde(borrow)]
    delta: Option<Delta<'a>>,
    #[serde(borrow)]
    logprobs: Option<&'a RawValue>,
    #[serde(borrow)]
    finish_reason: Option<&'a RawValue>,
    #[serde(borrow)]
    stop_reason: Option<&'a RawValue>,
    #[serde(borrow)]
    token_ids: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Delta<'a> {
    #[serde(borrow)]
    role: Option<&'a RawValue>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
    #[serde(borrow)]
    reasoning: Option<&'a RawValue>,
    #[serde(borrow)]
    reasoning_content: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_calls: Option<&'a RawValue>,
}

/// A streamed `logprobs` object: `{"content": [one entry per token]}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChunkLogprobs<'a> {
    #[serde(borrow)]
    content: Vec<&'a RawValue>,
}

/// The stream's usage object; the non-streamed one has the same members plus the details,
/// which the stream carries only when they are set.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamUsage<'a> {
    #[serde(borrow)]
    prompt_tokens: &'a RawValue,
    #[serde(borrow)]
    total_tokens: &'a RawValue,
    #[serde(borrow)]
    completion_tokens: &'a RawValue,
    #[serde(borrow)]
    prompt_tokens_details: Option<&'a RawValue>,
    #[serde(borrow)]
    completion_tokens_details: Option<&'a RawValue>,
}

impl StreamUsage<'_> {
    /// The non-streamed `usage` object.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"prompt_tokens\":");
        out.extend_from_slice(self.prompt_tokens.get().as_bytes());
        out.extend_from_slice(b",\"total_tokens\":");
        out.extend_from_slice(self.total_tokens.get().as_bytes());
        out.extend_from_slice(b",\"completion_tokens\":");
        out.extend_from_slice(self.completion_tokens.get().as_bytes());
        out.extend_from_slice(b",\"prompt_tokens_details\":");
        push_raw_or_null(out, self.prompt_tokens_details.map(RawValue::get));
        out.extend_from_slice(b",\"completion_tokens_details\":");
        push_raw_or_null(out, self.completion_tokens_details.map(RawValue::get));
        out.push(b'}');
    }
}

/// Per-choice state: everything the non-streamed choice needs, nothing else.
#[derive(Default)]
struct ChoiceState {
    seen: bool,
    role: Option<String>,
    /// The content as escaped JSON string text (pieces of escaped text concatenate exactly).
    content: Vec<u8>,
    /// Logprob entries, comma-separated, floats in Python's layout.
    logprobs: Vec<u8>,
    logprob_entries: usize,
    finish_reason: Option<String>,
    stop_reason: Option<String>,
}

/// Where a chunk stream stands: ended by `[DONE]`, or by an error event (kept: vLLM's error is the
/// answer). Shared by the chat and completions folds, whose streams end the same way.
#[derive(Default)]
pub(crate) struct StreamEnd {
    done: bool,
    error: Option<Folded>,
}

impl StreamEnd {
    /// Takes `[DONE]` and error events (true: the event is consumed); refuses any event after
    /// the end; false for a chunk the fold reads itself.
    pub(crate) fn take_control(&mut self, data: &[u8]) -> Result<bool, Unfoldable> {
        if data == b"[DONE]" {
            self.done = true;
            return Ok(true);
        }
        if self.done || self.error.is_some() {
            return Err(Unfoldable("event after the end of the stream"));
        }
        if data.starts_with(b"{\"error\"") {
            self.error = Some(openai_error(data).ok_or(Unfoldable("error event not readable"))?);
            return Ok(true);
        }
        Ok(false)
    }

    /// At the end of the stream: the error event as the answer, if there was one; refused if
    /// `[DONE]` never came; `None` when the fold is to build its answer.
    pub(crate) fn ended(&mut self) -> Result<Option<Folded>, Unfoldable> {
        if let Some(e) = self.error.take() {
            return Ok(Some(e));
        }
        if !self.done {
            return Err(Unfoldable("stream ended without [DONE]"));
        }
        Ok(None)
    }
}

/// The ids, times and totals a non-streamed answer takes from the stream.
#[derive(Default)]
pub(crate) struct Header {
    pub(crate) id: Option<String>,
    pub(crate) created: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) system_fingerprint: Option<String>,
    pub(crate) usage: Option<Vec<u8>>,
    pub(crate) metrics: Option<Vec<u8>>,
}

impl Header {
    /// Keeps the stream's usage object (when set), in its non-streamed layout.
    pub(crate) fn note_usage(&mut self, usage: Option<&RawValue>) -> Result<(), Unfoldable> {
        if let Some(u) = usage.filter(|u| u.get() != "null") {
            let usage: StreamUsage<'_> =
                serde_json::from_str(u.get()).map_err(|_| Unfoldable("unknown usage shape"))?;
            let mut out = Vec::new();
            usage.write(&mut out);
            self.usage = Some(out);
        }
        Ok(())
    }

    /// Takes the first id, `created` and `model`, the last fingerprint and metrics.
    pub(crate) fn note(
        &mut self,
        id: Option<&RawValue>,
        created: Option<&RawValue>,
        model: Option<&RawValue>,
        fingerprint: Option<&RawValue>,
        metrics: Option<&RawValue>,
    ) -> Result<(), Unfoldable> {
        let first = |slot: &mut Option<String>, v: Option<&RawValue>| {
            if slot.is_none() {
                *slot = v.map(|v| v.get().to_string());
            }
        };
        first(&mut self.id, id);
        first(&mut self.created, created);
        first(&mut self.model, model);
        if let Some(f) = fingerprint.filter(|f| f.get() != "null") {
            self.system_fingerprint = Some(f.get().to_string());
        }
        if let Some(m) = metrics.filter(|m| m.get() != "null") {
            let mut out = Vec::new();
            pyjson::copy_with_python_floats(m.get().as_bytes(), &mut out)
                .ok_or(Unfoldable("metrics not readable"))?;
            self.metrics = Some(out);
        }
        Ok(())
    }

    /// `"id":…,"object":…,"created":…,"model":…,` with `object` given.
    pub(crate) fn write_head(&self, object: &str, out: &mut Vec<u8>) -> Result<(), Unfoldable> {
        let (Some(id), Some(created), Some(model)) = (&self.id, &self.created, &self.model) else {
            return Err(Unfoldable("stream without id, created or model"));
        };
        out.extend_from_slice(b"{\"id\":");
        out.extend_from_slice(id.as_bytes());
        out.extend_from_slice(b",\"object\":\"");
        out.extend_from_slice(object.as_bytes());
        out.extend_from_slice(b"\",\"created\":");
        out.extend_from_slice(created.as_bytes());
        out.extend_from_slice(b",\"model\":");
        out.extend_from_slice(model.as_bytes());
        Ok(())
    }

    /// `"service_tier":null,"system_fingerprint":…,"usage":{…}`.
    pub(crate) fn write_totals(&self, out: &mut Vec<u8>) -> Result<(), Unfoldable> {
        let usage = self
            .usage
            .as_ref()
            .ok_or(Unfoldable("stream ended without usage"))?;
        out.extend_from_slice(b",\"service_tier\":null,\"system_fingerprint\":");
        push_raw_or_null(out, self.system_fingerprint.as_deref());
        out.extend_from_slice(b",\"usage\":");
        out.extend_from_slice(usage);
        Ok(())
    }

    /// `,"metrics":…}` closing the object.
    pub(crate) fn write_metrics_and_close(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b",\"metrics\":");
        match &self.metrics {
            Some(m) => out.extend_from_slice(m),
            None => out.extend_from_slice(b"null"),
        }
        out.push(b'}');
    }
}

/// Rebuilds a `chat.completion` from a `chat.completion.chunk` stream.
pub struct ChatFold {
    n: u32,
    logprobs: bool,
    header: Header,
    choices: Vec<ChoiceState>,
    held: usize,
    end: StreamEnd,
}

impl ChatFold {
    /// A fold for the (already admitted) non-streamed request `req`.
    pub fn new(req: &Map<String, Value>) -> ChatFold {
        ChatFold {
            n: choices_asked(req).unwrap_or(1),
            logprobs: req.get("logprobs") == Some(&Value::Bool(true)),
            header: Header::default(),
            choices: Vec::new(),
            held: 0,
            end: StreamEnd::default(),
        }
    }

    fn choice(&mut self, index: u32) -> Result<&mut ChoiceState, Unfoldable> {
        if index >= self.n {
            return Err(Unfoldable("choice index beyond n"));
        }
        let i = index as usize;
        if self.choices.len() <= i {
            self.choices.resize_with(i + 1, ChoiceState::default);
        }
        Ok(&mut self.choices[i])
    }
}

impl Fold for ChatFold {
    fn feed(&mut self, data: &[u8]) -> Result<(), Unfoldable> {
        if self.end.take_control(data)? {
            return Ok(());
        }
        let chunk: Chunk<'_> =
            serde_json::from_slice(data).map_err(|_| Unfoldable("unknown chunk shape"))?;
        if chunk
            .object
            .is_some_and(|o| o.get() != "\"chat.completion.chunk\"")
        {
            return Err(Unfoldable("unknown chunk object"));
        }
        if !is_null(chunk.prompt_token_ids) || !is_null(chunk.prompt_text) {
            return Err(Unfoldable("stream carries prompt token ids"));
        }
        self.header.note(
            chunk.id,
            chunk.created,
            chunk.model,
            chunk.system_fingerprint,
            chunk.metrics,
        )?;
        self.header.note_usage(chunk.usage)?;
        let logprobs = self.logprobs;
        let mut added = 0;
        for c in &chunk.choices {
            let state = self.choice(c.index)?;
            state.seen = true;
            if !is_null(c.token_ids) {
                return Err(Unfoldable("stream carries token ids"));
            }
            if let Some(d) = &c.delta {
                if !is_null(d.reasoning) || !is_null(d.reasoning_content) {
                    return Err(Unfoldable("stream carries reasoning"));
                }
                if !is_null(d.tool_calls) {
                    return Err(Unfoldable("stream carries tool calls"));
                }
                if let Some(r) = d.role.filter(|r| r.get() != "null") {
                    state.role = Some(r.get().to_string());
                }
                if let Some(text) = d.content.filter(|t| t.get() != "null") {
                    let inner =
                        string_inner(text.get()).ok_or(Unfoldable("content is not a string"))?;
                    state.content.extend_from_slice(inner.as_bytes());
                    added += inner.len();
                }
            }
            match c.logprobs.filter(|l| l.get() != "null") {
                Some(lp) if logprobs => {
                    let lp: ChunkLogprobs<'_> = serde_json::from_str(lp.get())
                        .map_err(|_| Unfoldable("unknown logprobs shape"))?;
                    let before = state.logprobs.len();
                    for entry in lp.content {
                        if state.logprob_entries > 0 {
                            state.logprobs.push(b',');
                        }
                        state.logprob_entries += 1;
                        pyjson::copy_with_python_floats(
                            entry.get().as_bytes(),
                            &mut state.logprobs,
                        )
                        .ok_or(Unfoldable("logprobs not readable"))?;
                    }
                    added += state.logprobs.len() - before;
                }
                Some(_) => return Err(Unfoldable("logprobs not asked for")),
                None => {}
            }
            if let Some(f) = c.finish_reason.filter(|f| f.get() != "null") {
                state.finish_reason = Some(f.get().to_string());
                state.stop_reason = c.stop_reason.map(|s| s.get().to_string());
            }
        }
        self.held += added;
        Ok(())
    }

    fn finish(&mut self) -> Result<Folded, Unfoldable> {
        if let Some(e) = self.end.ended()? {
            return Ok(e);
        }
        if self.choices.len() != self.n as usize || self.choices.iter().any(|c| !c.seen) {
            return Err(Unfoldable("stream did not carry every choice"));
        }
        let mut out = Vec::with_capacity(self.held + 640 * self.choices.len() + 400);
        self.header.write_head("chat.completion", &mut out)?;
        out.extend_from_slice(b",\"choices\":[");
        for (i, c) in self.choices.iter().enumerate() {
            let Some(finish) = &c.finish_reason else {
                return Err(Unfoldable("a choice did not finish"));
            };
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(format!("{{\"index\":{i},\"message\":{{\"role\":").as_bytes());
            out.extend_from_slice(c.role.as_deref().unwrap_or("\"assistant\"").as_bytes());
            out.extend_from_slice(b",\"content\":\"");
            out.extend_from_slice(&c.content);
            out.extend_from_slice(
                b"\",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,\"reasoning\":null},\"logprobs\":",
            );
            if self.logprobs {
                out.extend_from_slice(b"{\"content\":[");
                out.extend_from_slice(&c.logprobs);
                out.extend_from_slice(b"]}");
            } else {
                out.extend_from_slice(b"null");
            }
            out.extend_from_slice(b",\"finish_reason\":");
            out.extend_from_slice(finish.as_bytes());
            out.extend_from_slice(b",\"stop_reason\":");
            push_raw_or_null(&mut out, c.stop_reason.as_deref());
            out.extend_from_slice(b",\"token_ids\":null,\"routed_experts\":null}");
        }
        out.push(b']');
        self.header.write_totals(&mut out)?;
        out.extend_from_slice(
            b",\"prompt_logprobs\":null,\"prompt_token_ids\":null,\"prompt_text\":null,\"kv_transfer_params\":null,\"ec_transfer_params\":null",
        );
        self.header.write_metrics_and_close(&mut out);
        Ok(Folded::Answer(out))
    }

    fn held_bytes(&self) -> usize {
        self.held
    }
}
