//! The live meter: vLLM-server-style accounting of generation requests, per second, per user and
//! per model, with windows, a capacity curve, `/stats` and Prometheus exposition.
//!
//! The pure pieces ([`histogram`], [`timeline`], [`capacity`], [`replay`]) carry no live or async
//! concern and are shared with `analyze`. [`Meter`] is the single-threaded core (time passed in);
//! [`live`] runs it on a thread of its own behind a [`MeterHandle`]; [`http`] serves it.

pub mod capacity;
pub mod config;
pub mod engine;
pub mod gauges;
pub mod histogram;
pub mod http;
pub mod inflight;
pub mod kv;
pub mod labels;
pub mod level_batches;
pub mod level_time;
pub mod levels;
pub mod live;
pub mod process;
pub mod production_rows;
pub mod prometheus;
pub mod recent_seconds;
pub mod replay;
pub mod ring;
pub mod saturation;
pub mod scope;
mod scope_slots;
pub mod self_metrics;
pub mod service_level;
pub mod session_metrics;
pub mod snapshot;
mod stats;
pub mod step_model;
pub mod summary;
pub mod timeline;
pub mod ui;
pub mod window;

pub use config::MeterConfig;
pub use engine::Meter;
pub use http::{admin_router, stats_router, FleetStats, StatsContext, StatsToken};
pub use live::{spawn_meter, spawn_meter_owned, MeterHandle, MeterThread};
pub use snapshot::{SnapshotError, SnapshotQuery, StatsSnapshot};
