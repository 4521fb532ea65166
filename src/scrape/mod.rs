//! Cross-check against vLLM's own accounting: scrape its `/metrics`, keep a few series per
//! sample, and set them beside the proxy's windows (`server` in each `/stats` window), in the
//! access log (`server_sample` lines) and in `analyze`.

pub mod crosscheck;
pub(crate) mod kv_values;
pub mod prom_text;
pub(crate) mod sample;
pub(crate) mod scraper;

pub use crosscheck::{ServerTrack, ServerWindow};
pub use kv_values::KvValues;
pub use prom_text::{HistogramValues, VllmValues};
pub use sample::{ServerSample, SERVER_SAMPLE_SCHEMA};
pub use scraper::{spawn_scraper, SampleSink, ScrapeConfig, ScrapeCounters, ScrapeStatus};
