//! Errors the proxy answers itself, as JSON in the shape of the API the path belongs to, with the
//! right status.
//!
//! This module owns the error vocabulary of everything the proxy writes itself (its own errors
//! and `/stats*`), in the two shapes vLLM 0.32 itself answers errors in ([`ErrorShape`]), with
//! `type` one of the [`kind`] names, as vLLM sends them. A client then reads one vocabulary
//! whether vLLM or the proxy answered, and cannot tell the proxy's error from vLLM's.

use bytes::Bytes;
use http::StatusCode;

/// The `type` names, vLLM's.
pub mod kind {
    /// 400.
    pub const BAD_REQUEST: &str = "BadRequestError";
    /// 401.
    pub const AUTHENTICATION: &str = "AuthenticationError";
    /// 404.
    pub const NOT_FOUND: &str = "NotFoundError";
    /// 405.
    pub const METHOD_NOT_ALLOWED: &str = "MethodNotAllowedError";
    /// 408.
    pub const REQUEST_TIMEOUT: &str = "RequestTimeoutError";
    /// 413.
    pub const REQUEST_TOO_LARGE: &str = "RequestTooLargeError";
    /// 431.
    pub const HEADER_TOO_LARGE: &str = "RequestHeaderFieldsTooLargeError";
    /// 502.
    pub const BAD_GATEWAY: &str = "BadGatewayError";
    /// 503.
    pub const SERVICE_UNAVAILABLE: &str = "ServiceUnavailableError";
    /// 504.
    pub const GATEWAY_TIMEOUT: &str = "GatewayTimeoutError";
}

/// How an error body is laid out: the shape a client of the path's API reads, as vLLM writes it.
/// Which API a path belongs to, and so its shape, is the dialect's (`dialect::error_shape`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorShape {
    /// OpenAI's (chat, completions, Responses, and every other path, `/stats*` included):
    /// `{"error":{"message","type","param","code"}}` with `code` the status number.
    #[default]
    OpenAi,
    /// Anthropic Messages' (`/v1/messages` and the routes under it), as vLLM 0.32 answers its own
    /// Messages errors (recorded: `tests/fixtures/vllm/agents/m07_messages_unknown_model.http`,
    /// `m08_messages_stream_too_long.http`): Anthropic's envelope
    /// `{"type":"error","error":{"type","message"}}` with vLLM's `type` names
    /// (`NotFoundError`, `BadRequestError`), not Anthropic's (`not_found_error`, ...). The
    /// Anthropic SDK picks its exception class by the status and reads `error.message`.
    Messages,
}

/// The error body in `shape`.
pub fn error_body_in(
    shape: ErrorShape,
    status: StatusCode,
    kind: &str,
    message: &str,
    param: Option<&str>,
) -> Bytes {
    match shape {
        ErrorShape::OpenAi => error_body(status, kind, message, param),
        ErrorShape::Messages => {
            let v = serde_json::json!({
                "type": "error",
                "error": { "type": kind, "message": message },
            });
            Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
        }
    }
}

/// The error body: `{"error":{"message","type","param","code"}}` with `code` the status number.
pub fn error_body(status: StatusCode, kind: &str, message: &str, param: Option<&str>) -> Bytes {
    let v = serde_json::json!({
        "error": {
            "message": message,
            "type": kind,
            "param": param,
            "code": status.as_u16(),
        }
    });
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}

/// Whose fault an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The client sent something the proxy will not forward.
    Client,
    /// The upstream could not be reached or did not answer in time.
    Upstream,
}

/// An error the proxy answers on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyError {
    /// HTTP status to answer with.
    pub status: StatusCode,
    /// Whose fault it is.
    pub fault: Fault,
    /// The OpenAI-style `type`.
    pub kind: &'static str,
    /// Human-readable cause; never contains request data, keys or internal addresses.
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<&'static str>,
}

impl ProxyError {
    /// 400: the request could not be read.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            Fault::Client,
            kind::BAD_REQUEST,
            message,
        )
    }

    /// 401: a key is required and was missing or unknown.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            Fault::Client,
            kind::AUTHENTICATION,
            "Invalid or missing API key.",
        )
    }

    /// 408: the client took too long to send its body.
    pub fn body_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            Fault::Client,
            kind::REQUEST_TIMEOUT,
            "The request body was not received in time.",
        )
    }

    /// 413: the body is larger than the configured limit.
    pub fn too_large(limit: u64) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            Fault::Client,
            kind::REQUEST_TOO_LARGE,
            format!("The request body exceeds the limit of {limit} bytes."),
        )
    }

    /// 431: the request head is larger than the configured limit, or has more than 100 headers.
    pub fn header_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Fault::Client,
            kind::HEADER_TOO_LARGE,
            format!(
                "The request head exceeds the limit of {limit} bytes (max_header_bytes) or of 100 headers."
            ),
        )
    }

    /// 502: the upstream could not be reached or failed before answering.
    pub fn bad_gateway(cause: &str) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            Fault::Upstream,
            kind::BAD_GATEWAY,
            format!("The inference server is unavailable: {cause}."),
        )
    }

    /// 504: the upstream did not answer in time.
    pub fn gateway_timeout(what: &str) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            Fault::Upstream,
            kind::GATEWAY_TIMEOUT,
            format!("The inference server did not answer in time ({what})."),
        )
    }

    fn new(
        status: StatusCode,
        fault: Fault,
        kind: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ProxyError {
            status,
            fault,
            kind,
            message: message.into(),
            param: None,
        }
    }

    /// The JSON body in `shape` ([`error_body_in`]): the shape of the path's API.
    pub fn body_in(&self, shape: ErrorShape) -> Bytes {
        error_body_in(shape, self.status, self.kind, &self.message, self.param)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_openai_shaped() {
        let e = ProxyError::bad_gateway("connection refused");
        let v: serde_json::Value = serde_json::from_slice(&e.body_in(ErrorShape::OpenAi)).unwrap();
        assert_eq!(v["error"]["code"], 502);
        assert_eq!(v["error"]["type"], "BadGatewayError");
        assert!(v["error"]["param"].is_null());
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("connection refused"));
    }

    #[test]
    fn messages_body_is_vllms_messages_error() {
        let e = ProxyError::bad_gateway("connection refused");
        let body = e.body_in(ErrorShape::Messages);
        let text = std::str::from_utf8(&body).unwrap();
        assert!(
            text.starts_with(r#"{"type":"error","error":{"type":"BadGatewayError","message":"#),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 2);
        assert_eq!(v["error"].as_object().unwrap().len(), 2);
    }
}
