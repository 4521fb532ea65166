//! The live meter: vLLM-server-style accounting of generation requests, per second, per user and
//! per model, with windows, a capacity curve, `/stats` and Prometheus exposition.
//!
//! The pure pieces ([`histogram`], [`timeline`], [`capacity`], [`replay`]) carry no live or async
//! concern and are shared with `analyze`.

pub mod capacity;
pub mod histogram;
pub mod replay;
pub mod summary;
pub mod timeline;
