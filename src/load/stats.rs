//! A tokenmeter proxy in front of the server: detecting it and sampling its `/stats` windows.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::client::HttpClient;
use super::summary::{summarize, MinAvgMax};

/// In-flight requests over a proxy window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct InFlight {
    /// Fewest in flight during the window.
    pub min: Option<f64>,
    /// Most in flight during the window.
    pub max: Option<f64>,
    /// Time-weighted mean in flight.
    pub mean: Option<f64>,
}

/// The fields of one proxy throughput window this tool reads (others are ignored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxyWindow {
    /// Window length in seconds.
    #[serde(default)]
    pub seconds: Option<f64>,
    /// Generated tokens per second over the window, as the proxy counted them.
    #[serde(default)]
    pub gen_tok_s: Option<f64>,
    /// The proxy's verdict that concurrency held constant over the window.
    #[serde(default)]
    pub steady: Option<bool>,
    /// In-flight requests over the window.
    #[serde(default)]
    pub in_flight: Option<InFlight>,
}

/// One poll of the proxy's `/stats`.
#[derive(Debug, Clone, Serialize)]
pub struct ProxySample {
    /// Seconds since the load run started.
    pub t_s: f64,
    /// `windows["10s"]`; null when absent, null or not of the expected shape.
    pub window_10s: Option<ProxyWindow>,
    /// `windows["60s"]`, likewise.
    pub window_60s: Option<ProxyWindow>,
}

/// Summary of the proxy's steady 10 s windows.
#[derive(Debug, Clone, Serialize)]
pub struct SteadySummary {
    /// `gen_tok_s` over the samples whose 10 s window was steady (a window polled twice counts
    /// twice).
    pub gen_tok_s: MinAvgMax,
    /// `(max - min) / avg * 100` of those values: the run-to-run stability figure.
    pub spread_pct: Option<f64>,
}

/// What was learned from the proxy.
#[derive(Debug, Clone, Serialize)]
pub struct ProxyReport {
    /// `GET {base}/stats` answered 200 with JSON `"schema": 1`.
    pub detected: bool,
    /// One line on what was found.
    pub note: String,
    /// Every poll, during the run and one after it.
    pub samples: Vec<ProxySample>,
    /// Steady 10 s windows; null when there were none.
    pub steady_10s: Option<SteadySummary>,
    /// The proxy's production-traffic curve (`capacity_production` of `/stats`) read after the
    /// run; null when it was not available.
    pub capacity_production: Option<Vec<ProxyCapacityRow>>,
    /// The proxy's capacity at the service level (`service_level.capacity` of `/stats`) read
    /// after the run; null when it was not available.
    pub service_level: Option<ProxyServiceCapacity>,
}

/// The fields of the proxy's headline this tool reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxyServiceCapacity {
    /// The highest level served at the objective (a lower bound while not `reached`).
    #[serde(default)]
    pub in_flight: Option<u32>,
    /// Whether a level above it missed.
    #[serde(default)]
    pub reached: bool,
    /// The proxy's own sentence for it.
    pub text: String,
    /// The objective, as the proxy states it.
    #[serde(default)]
    pub objective_text: String,
}

/// TTFT percentiles of a proxy capacity row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ProxyTtft {
    /// Median, ms.
    #[serde(default)]
    pub p50: Option<f64>,
    /// 90th percentile, ms.
    #[serde(default)]
    pub p90: Option<f64>,
}

/// Per-request figures of a proxy capacity row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ProxyPerRequest {
    /// `gen_tok_s / N`.
    #[serde(default)]
    pub avg: Option<f64>,
}

/// The fields of one row of the proxy's production-traffic curve this tool reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxyCapacityRow {
    /// The level N.
    pub in_flight: u32,
    /// Clean seconds at N.
    #[serde(default)]
    pub seconds: f64,
    /// Too little time for a rate.
    #[serde(default)]
    pub thin: bool,
    /// Aggregate rate at N.
    #[serde(default)]
    pub gen_tok_s: Option<f64>,
    /// Per-request figures.
    #[serde(default)]
    pub per_request_tok_s: ProxyPerRequest,
    /// TTFT of requests that arrived at N.
    #[serde(default)]
    pub ttft_ms: ProxyTtft,
}

/// The proxy's production-traffic curve and its capacity at the service level now; each None
/// when `/stats` has none.
pub async fn capacity(
    client: &HttpClient,
) -> (Option<Vec<ProxyCapacityRow>>, Option<ProxyServiceCapacity>) {
    let Ok((200, Some(body))) = client.get_json("/stats").await else {
        return (None, None);
    };
    let rows = body
        .get("capacity_production")
        .and_then(|r| serde_json::from_value(r.clone()).ok());
    let sl = body.get("service_level");
    let headline = sl.and_then(|v| {
        let mut c: ProxyServiceCapacity =
            serde_json::from_value(v.get("capacity")?.clone()).ok()?;
        c.objective_text = v.get("objective_text")?.as_str()?.to_string();
        Some(c)
    });
    (rows, headline)
}

/// Whether `base` is a tokenmeter proxy, with a one-line note.
pub async fn probe(client: &HttpClient) -> (bool, String) {
    match client.get_json("/stats").await {
        Ok((200, Some(v))) if v.get("schema").and_then(serde_json::Value::as_u64) == Some(1) => (
            true,
            "tokenmeter proxy detected: /stats windows sampled".into(),
        ),
        Ok((status, _)) => (
            false,
            format!(
                "not a tokenmeter proxy (GET /stats answered {status}); client-side figures only. \
                 A proxy with admin_listen serves /stats there: pass --stats-url http://ADMIN_ADDRESS"
            ),
        ),
        Err(e) => (
            false,
            format!("not a tokenmeter proxy (GET /stats failed: {e}); client-side figures only"),
        ),
    }
}

/// One poll; None when `/stats` did not answer with JSON.
pub async fn sample(client: &HttpClient, start: Instant) -> Option<ProxySample> {
    let (status, body) = client.get_json("/stats").await.ok()?;
    let body = body.filter(|_| status == 200)?;
    let window = |name: &str| {
        let w = body.get("windows")?.get(name)?;
        serde_json::from_value::<ProxyWindow>(w.clone()).ok()
    };
    Some(ProxySample {
        t_s: start.elapsed().as_secs_f64(),
        window_10s: window("10s"),
        window_60s: window("60s"),
    })
}

/// Polls every `interval` until `stop` fires; bounded by the stop signal and a poll cap.
pub async fn poll_until(
    client: HttpClient,
    start: Instant,
    interval: Duration,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> Vec<ProxySample> {
    const MAX_POLLS: usize = 100_000;
    let mut out = Vec::new();
    let interval = interval.max(Duration::from_millis(10));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while out.len() < MAX_POLLS {
        tokio::select! {
            _ = &mut stop => break,
            _ = ticker.tick() => {
                if let Some(s) = sample(&client, start).await {
                    out.push(s);
                }
            }
        }
    }
    out
}

/// Adds the sample taken after the run; it replaces a poll taken just before it, less than
/// half the poll `interval` (and less than a second) earlier: the meter's windows move by whole
/// seconds, so that poll showed the same window, and a run as long as the poll interval printed
/// its last row twice.
pub fn push_final(samples: &mut Vec<ProxySample>, last: ProxySample, interval: Duration) {
    let near = (interval.as_secs_f64() / 2.0).min(1.0);
    if samples
        .last()
        .is_some_and(|prev| last.t_s - prev.t_s < near)
    {
        samples.pop();
    }
    samples.push(last);
}

/// Summary of the steady 10 s windows of `samples`.
pub fn steady_summary(samples: &[ProxySample]) -> Option<SteadySummary> {
    let values = samples
        .iter()
        .filter_map(|s| s.window_10s.as_ref())
        .filter(|w| w.steady == Some(true))
        .filter_map(|w| w.gen_tok_s);
    let gen_tok_s = summarize(values)?;
    let spread_pct =
        (gen_tok_s.avg > 0.0).then(|| (gen_tok_s.max - gen_tok_s.min) / gen_tok_s.avg * 100.0);
    Some(SteadySummary {
        gen_tok_s,
        spread_pct,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(steady: Option<bool>, tok: Option<f64>) -> ProxySample {
        ProxySample {
            t_s: 0.0,
            window_10s: Some(ProxyWindow {
                seconds: Some(10.0),
                gen_tok_s: tok,
                steady,
                in_flight: None,
            }),
            window_60s: None,
        }
    }

    #[test]
    fn only_steady_windows_with_a_rate_count() {
        let samples = [
            s(Some(true), Some(100.0)),
            s(Some(false), Some(5.0)),
            s(None, Some(7.0)),
            s(Some(true), None),
            s(Some(true), Some(102.0)),
        ];
        let sum = steady_summary(&samples).unwrap();
        assert_eq!(sum.gen_tok_s.n, 2);
        assert!((sum.spread_pct.unwrap() - 2.0 / 101.0 * 100.0).abs() < 1e-9);
        assert!(steady_summary(&samples[1..4]).is_none());
    }

    #[test]
    fn the_final_sample_replaces_a_poll_of_the_same_second() {
        let at = |t_s: f64| ProxySample {
            t_s,
            ..s(Some(true), Some(1.0))
        };
        let mut v = vec![at(5.0), at(10.0)];
        push_final(&mut v, at(10.2), Duration::from_secs(10));
        assert_eq!(v.iter().map(|s| s.t_s).collect::<Vec<_>>(), [5.0, 10.2]);
        push_final(&mut v, at(11.5), Duration::from_secs(10));
        assert_eq!(v.len(), 3);
        // Polled every 0.5 s: only a poll within 0.25 s is the same one.
        let mut fast = vec![at(1.5)];
        push_final(&mut fast, at(1.9), Duration::from_millis(500));
        assert_eq!(fast.len(), 2);
        let mut empty = Vec::new();
        push_final(&mut empty, at(0.5), Duration::from_secs(10));
        assert_eq!(empty.len(), 1);
    }

    #[test]
    fn window_with_nulls_parses() {
        let w: ProxyWindow = serde_json::from_str(r#"{"seconds":10,"gen_tok_s":null,"steady":null,"in_flight":{"min":null,"max":3,"mean":1.5},"extra":1}"#).unwrap();
        assert_eq!(w.gen_tok_s, None);
        assert_eq!(w.in_flight.as_ref().unwrap().max, Some(3.0));
    }
}
