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
                "not a tokenmeter proxy (GET /stats answered {status}); client-side figures only"
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
    fn window_with_nulls_parses() {
        let w: ProxyWindow = serde_json::from_str(r#"{"seconds":10,"gen_tok_s":null,"steady":null,"in_flight":{"min":null,"max":3,"mean":1.5},"extra":1}"#).unwrap();
        assert_eq!(w.gen_tok_s, None);
        assert_eq!(w.in_flight.unwrap().max, Some(3.0));
    }
}
