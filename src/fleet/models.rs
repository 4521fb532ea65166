//! Learning which models each replica serves: a background task reads every replica's
//! `/v1/models` at start and then every `routing.models_refresh_s`. A failed read keeps the last
//! list (a replica that is down is the health check's business, not this one's).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{Upstream, Upstreams};
use crate::tls::UpstreamConnector;

/// Largest `/v1/models` body read.
const MAX_MODELS_BYTES: usize = 1024 * 1024;

/// The model ids of an OpenAI-shaped model list (`{"data": [{"id": ...}, ...]}`).
pub fn parse_model_ids(body: &[u8]) -> Option<HashSet<String>> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let ids = v
        .get("data")?
        .as_array()?
        .iter()
        .filter_map(|m| m.get("id")?.as_str().map(str::to_string))
        .collect();
    Some(ids)
}

type HttpClient = Client<UpstreamConnector, Empty<Bytes>>;

async fn read_models(client: &HttpClient, up: &Upstream, timeout: Duration) -> Option<()> {
    let uri: http::Uri = format!("{}/v1/models", up.base).parse().ok()?;
    let resp = tokio::time::timeout(timeout, client.get(uri))
        .await
        .ok()?
        .ok()?;
    if resp.status() != http::StatusCode::OK {
        return None;
    }
    let body = tokio::time::timeout(
        timeout,
        Limited::new(resp.into_body(), MAX_MODELS_BYTES).collect(),
    )
    .await
    .ok()?
    .ok()?
    .to_bytes();
    up.set_models(parse_model_ids(&body)?);
    Some(())
}

/// Starts the refresh task (every `interval`; one read per replica at start), connecting as the
/// proxy does (`connector`: plain or TLS by the replica's scheme). Abort the handle to stop it.
pub fn spawn_model_refresh(
    ups: Arc<Upstreams>,
    connector: UpstreamConnector,
    interval: Duration,
) -> tokio::task::JoinHandle<()> {
    let timeout = (interval / 2).clamp(Duration::from_millis(50), Duration::from_secs(5));
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for up in ups.list() {
                if read_models(&client, up, timeout).await.is_none() {
                    tracing::debug!(upstream = %up.name, "reading /v1/models failed; keeping the last list");
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ids_of_a_model_list() {
        let ids = parse_model_ids(
            br#"{"object":"list","data":[{"id":"a","object":"model"},{"id":"b"}]}"#,
        )
        .unwrap();
        assert_eq!(ids, ["a".to_string(), "b".to_string()].into());
        assert!(parse_model_ids(b"not json").is_none());
        assert!(parse_model_ids(br#"{"data":3}"#).is_none());
    }
}
