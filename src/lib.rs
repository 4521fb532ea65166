//! tokenmeter: a transparent measuring proxy for vLLM's OpenAI-compatible API.
//!
//! The binary's subcommands are thin wrappers over these modules; tests call them directly.

pub mod access_log;
pub mod analyze;
pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod demo;
pub mod dialect;
pub(crate) mod error;
pub mod exposition;
pub mod fleet;
pub mod fold;
pub(crate) mod health;
mod hex;
pub mod itl;
pub(crate) mod join;
pub mod load;
pub mod meter;
pub mod observe;
pub mod openai;
pub mod otlp;
pub(crate) mod probe;
pub mod proxy;
pub mod record;
pub mod scrape;
pub(crate) mod signals;
pub mod sim;
pub mod slo;
pub mod sse;
mod swar;
#[cfg(test)]
mod test_fixtures;
pub(crate) mod tls;
pub mod token_curve;
pub(crate) mod traceparent;
