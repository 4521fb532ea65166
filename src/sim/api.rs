//! [`SimApi`]: how the simulator serves one generation API, as vLLM 0.32 does. Each API's wire
//! file declares its one `SimApi` (`wire_openai.rs` for chat and completions,
//! `wire_responses.rs`, `wire_messages.rs`); the router finds it by the API (`http.rs`,
//! `sim_api`), and request parsing and the answer read it instead of matching on the API.

use super::engine::Timings;
use super::request::{ApiError, GenRequest, RequestRules};
use super::wire_parts::{Answering, ChoiceOut, EventWrite};

/// Everything the simulator does differently per API.
#[derive(Debug, Clone, Copy)]
pub struct SimApi {
    /// How its requests are read and checked.
    pub request: RequestRules,
    /// The writer of a streamed answer's events.
    pub writer: fn(&GenRequest, &Answering<'_>) -> Box<dyn EventWrite>,
    /// The non-streamed answer, from its finished choices (and the per-request timings, when
    /// they are reported).
    pub full_response: fn(&GenRequest, &Answering<'_>, &[ChoiceOut], Option<&Timings>) -> String,
    /// An error in its shape (vLLM answers Anthropic's requests with Anthropic's error body).
    pub error: fn(ApiError) -> ApiError,
}
