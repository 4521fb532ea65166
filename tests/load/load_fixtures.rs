//! The client against byte-exact recorded vLLM responses (chunked encoding included).

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokenmeter::load::{ChatSpec, HttpClient, TokensFrom};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/vllm/");

/// Serves one connection: reads the whole request, writes `raw`, closes.
async fn replay(raw: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        // Bounded: a request larger than 1 MiB or a closed socket ends the read.
        while buf.len() < 1 << 20 {
            let n = sock.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf);
            if let Some(end) = text.find("\r\n\r\n") {
                let len = text[..end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>().unwrap())
                    })
                    .unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    break;
                }
            }
        }
        sock.write_all(&raw).await.unwrap();
        sock.shutdown().await.unwrap();
    });
    url
}

async fn chat(fixture: &str, stream: bool) -> tokenmeter::load::RequestResult {
    let raw = std::fs::read(format!("{FIXTURES}{fixture}")).unwrap();
    let url = replay(raw).await;
    let client = HttpClient::new(url, None, None, Duration::from_secs(5));
    let spec = ChatSpec {
        api: tokenmeter::load::Api::Chat,
        model: "tiny-llama".into(),
        prompt: "hi".into(),
        max_tokens: 8,
        stream,
        ignore_eos: false,
    };
    client.chat(0, &spec, &AtomicU64::new(0)).await
}

#[tokio::test]
async fn recorded_stream_with_usage() {
    let r = chat("raw_stream_usage.raw", true).await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.status, Some(200));
    assert_eq!((r.completion_tokens, r.prompt_tokens), (Some(8), Some(12)));
    assert_eq!(r.tokens_from, TokensFrom::Usage);
    assert!(r.ttft_ms.is_some());
    // 8 content deltas follow the role event in this capture.
    assert_eq!(r.content_events, 8);
}

#[tokio::test]
async fn recorded_stream_with_continuous_usage_takes_the_final_usage() {
    let r = chat("raw_stream_usage_continuous.raw", true).await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!((r.completion_tokens, r.prompt_tokens), (Some(8), Some(12)));
}

#[tokio::test]
async fn recorded_non_stream() {
    let r = chat("raw_nonstream.raw", false).await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!((r.completion_tokens, r.prompt_tokens), (Some(8), Some(12)));
    assert_eq!(r.ttft_ms, None);
}

#[tokio::test]
async fn recorded_error_before_the_stream() {
    let r = chat("raw_stream_error_400.raw", true).await;
    assert!(!r.ok);
    assert_eq!(r.status, Some(400));
    assert!(r
        .error
        .as_deref()
        .unwrap()
        .starts_with("max_tokens=100000 cannot be greater"));
    assert_eq!(r.completion_tokens, None);
    assert_eq!(r.tok_s, None);
}
