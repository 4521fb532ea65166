//! Helpers shared by the cross-check tests: the simulator, held streams, second alignment.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenmeter::clock::{Clock, NANOS_PER_SEC};
use tokenmeter::sim::{SimConfig, SimHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::post;

/// The simulator with no early stops (every stream runs to `max_tokens`).
pub async fn sim() -> SimHandle {
    let cfg = SimConfig {
        stop_probability_per_token: 0.0,
        ..Default::default()
    };
    crate::common::start_sim(cfg).await
}

/// Keeps `n` long streams open to `addr` until `deadline`; counts streams that got a token.
pub fn hold_streams(
    addr: std::net::SocketAddr,
    n: usize,
    tag: &str,
    deadline: Instant,
    started: Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let started = started.clone();
            let body = format!(r#"{{"model":"sim-model","messages":[{{"role":"user","content":"{tag} {i}"}}],"max_tokens":3000,"stream":true}}"#);
            tokio::spawn(async move {
                let mut c = TcpStream::connect(addr).await.unwrap();
                c.write_all(&post("/v1/chat/completions", &body, &[])).await.unwrap();
                let mut buf = vec![0u8; 16 * 1024];
                let mut first = true;
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let Ok(Ok(k)) = tokio::time::timeout(left, c.read(&mut buf)).await else {
                        return;
                    };
                    if k == 0 {
                        return;
                    }
                    if first && buf[..k].windows(11).any(|w| w == b"\"content\":\"") {
                        first = false;
                        started.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect()
}

pub async fn wait_for(count: &AtomicU64, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while count.load(Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "streams did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sleeps until `margin_ms` into the second after `secs` more seconds.
pub async fn sleep_seconds(secs: u64, margin_ms: u64) {
    let into = Clock::global().now() % NANOS_PER_SEC;
    let ns = (secs + 1) * NANOS_PER_SEC - into + margin_ms * 1_000_000;
    tokio::time::sleep(Duration::from_nanos(ns)).await;
}
