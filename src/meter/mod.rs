//! The live meter: vLLM-server-style accounting of generation requests, per second, per user and
//! per model, with windows, a capacity curve, `/stats` and Prometheus exposition.
//!
//! The pure pieces ([`histogram`], [`timeline`], [`capacity`], [`replay`]) carry no live or async
//! concern and are shared with `analyze`. [`Meter`] is the single-threaded core (time passed in);
//! [`live`] runs it on a thread of its own behind a [`MeterHandle`]; [`http`] serves it.

pub mod capacity;
pub(crate) mod config;
pub mod engine;
pub(crate) mod gauges;
pub mod histogram;
pub(crate) mod http;
mod id_hash;
pub mod inflight;
pub mod kv;
pub(crate) mod labels;
pub(crate) mod level_batches;
pub(crate) mod level_time;
pub mod levels;
pub mod live;
pub mod prefix_audit;
pub(crate) mod process;
pub(crate) mod production_rows;
pub(crate) mod prometheus;
pub(crate) mod recent_seconds;
pub mod replay;
pub mod ring;
pub mod saturation;
pub(crate) mod scope;
mod scope_slots;
pub(crate) mod self_metrics;
pub mod service_level;
pub(crate) mod session_metrics;
pub mod sessions;
pub(crate) mod snapshot;
pub mod spread;
mod stats;
pub(crate) mod step_model;
pub(crate) mod summary;
pub mod timeline;
pub mod ttft_queueing;
pub(crate) mod ui;
pub(crate) mod window;

pub use config::MeterConfig;
pub use engine::Meter;
pub use http::{admin_router, stats_router, FleetStats, StatsContext, StatsToken};
pub use live::{spawn_meter, spawn_meter_owned, MeterHandle, MeterThread};
pub use snapshot::{SnapshotError, SnapshotQuery, StatsSnapshot};
