//! TLS on both sides with certificates made at test time: curl and the proxy's own upstream
//! client go through the TLS listener, a wrong CA is a clear 502, plain HTTP to the TLS port is
//! closed without an answer.

use std::time::Duration;

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MODELS: &str = "{\"object\":\"list\",\"data\":[]}";

fn models_script() -> Script {
    let body = MODELS;
    Script {
        steps: vec![Step::Raw(
            Duration::ZERO,
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        )],
    }
}

/// A proxy with a TLS listener in front of a plain fake upstream.
async fn tls_proxy(certs: &TestCerts) -> (TestProxy, FakeUpstream) {
    let upstream = FakeUpstream::start(vec![models_script()]).await;
    let (cert, key) = (certs.cert.clone(), certs.key.clone());
    let proxy = TestProxy::start(&upstream.url(), move |c| {
        c.tls.cert_file = Some(cert);
        c.tls.key_file = Some(key);
    })
    .await;
    (proxy, upstream)
}

fn curl(args: &[&str]) -> std::process::Output {
    std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl runs")
}

#[tokio::test]
async fn curl_reaches_the_upstream_through_the_tls_listener_with_http_1_1() {
    let dir = TempDir::new("tls-curl");
    let certs = TestCerts::generate(&dir.0, "a");
    let (proxy, _upstream) = tls_proxy(&certs).await;
    let url = format!("https://localhost:{}/v1/models", proxy.addr.port());
    let ca = certs.ca.display().to_string();
    let resolve = format!("localhost:{}:127.0.0.1", proxy.addr.port());
    let out = tokio::task::spawn_blocking(move || {
        curl(&["-v", "--cacert", &ca, "--resolve", &resolve, &url])
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), MODELS);
    assert!(
        stderr.contains("ALPN: server accepted http/1.1")
            || stderr.contains("ALPN, server accepted to use http/1.1"),
        "{stderr}"
    );
    // Without the CA, curl refuses the certificate: the listener is really TLS with that chain.
    let url = format!("https://127.0.0.1:{}/v1/models", proxy.addr.port());
    let out = tokio::task::spawn_blocking(move || curl(&[&url]))
        .await
        .unwrap();
    assert!(!out.status.success());
    let lines = proxy.log_lines(1).await;
    assert_eq!(lines[0]["status"], 200);
    proxy.stop().await;
}

#[tokio::test]
async fn plain_http_to_the_tls_port_is_closed_without_an_answer() {
    let dir = TempDir::new("tls-plain");
    let certs = TestCerts::generate(&dir.0, "a");
    let (proxy, _upstream) = tls_proxy(&certs).await;
    let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the connection is closed promptly");
    assert!(
        !got.starts_with(b"HTTP/"),
        "no HTTP answer on a TLS port: {:?}",
        String::from_utf8_lossy(&got)
    );
    // The listener goes on serving TLS clients, and nothing was logged as a request.
    let url = format!("https://127.0.0.1:{}/v1/models", proxy.addr.port());
    let ca = certs.ca.display().to_string();
    let out = tokio::task::spawn_blocking(move || curl(&["--cacert", &ca, &url]))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = proxy.log_lines(1).await;
    assert_eq!(lines.len(), 1);
    proxy.stop().await;
}

#[tokio::test]
async fn the_proxy_reaches_an_https_upstream_and_a_wrong_ca_is_a_clear_502() {
    let dir = TempDir::new("tls-upstream");
    let certs = TestCerts::generate(&dir.0, "a");
    let other = TestCerts::generate(&dir.0, "other");
    // The https upstream is a tokenmeter with a TLS listener (in front of the fake vLLM).
    let (inner, mut upstream) = tls_proxy(&certs).await;
    let https = format!("https://127.0.0.1:{}", inner.addr.port());
    let ca = certs.ca.clone();
    let outer = TestProxy::start(&https, move |c| c.upstream_tls.ca_file = Some(ca)).await;
    let r = raw_request(
        outer.addr,
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.body, MODELS.as_bytes());
    let seen = upstream.seen.recv().await.unwrap();
    assert!(seen.request_line().starts_with("GET /v1/models "));

    let ca = other.ca.clone();
    let wrong = TestProxy::start(&https, move |c| c.upstream_tls.ca_file = Some(ca)).await;
    let r = raw_request(
        wrong.addr,
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 502);
    let body = r.json();
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("TLS certificate is not trusted"), "{msg}");
    let lines = wrong.log_lines(1).await;
    assert_eq!(lines[0]["outcome"], "proxy_error");
    assert!(lines[0]["error"].as_str().unwrap().contains("not trusted"));
    // The default roots (public CAs) do not trust a private CA either.
    let public = TestProxy::start(&https, |_| {}).await;
    let r = raw_request(
        public.addr,
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 502);
    for p in [outer, wrong, public, inner] {
        p.stop().await;
    }
}

#[tokio::test]
async fn admin_listen_serves_the_probes_over_tls_too() {
    let dir = TempDir::new("tls-admin");
    let certs = TestCerts::generate(&dir.0, "a");
    let upstream = FakeUpstream::start(vec![models_script()]).await;
    let (cert, key) = (certs.cert.clone(), certs.key.clone());
    let proxy = TestProxy::start(&upstream.url(), move |c| {
        c.tls.cert_file = Some(cert);
        c.tls.key_file = Some(key);
        c.admin_listen = Some("127.0.0.1:0".into());
    })
    .await;
    let admin = proxy.handle.as_ref().unwrap().admin_addr().unwrap();
    let ca = certs.ca.display().to_string();
    let url = format!("https://127.0.0.1:{}/healthz", admin.port());
    let out = tokio::task::spawn_blocking(move || curl(&["--cacert", &ca, &url]))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "{\"status\":\"alive\"}"
    );
    let url = format!("http://127.0.0.1:{}/healthz", admin.port());
    let out = tokio::task::spawn_blocking(move || curl(&[&url]))
        .await
        .unwrap();
    assert!(
        !out.status.success(),
        "plain HTTP is not answered on the TLS admin port"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn a_reload_serves_the_new_certificate_and_keeps_the_old_one_when_the_files_are_bad() {
    let dir = TempDir::new("tls-reload");
    let first = TestCerts::generate(&dir.0, "first");
    let (proxy, _upstream) = tls_proxy(&first).await;
    let port = proxy.addr.port();
    let fetch = move |ca: std::path::PathBuf| async move {
        let url = format!("https://127.0.0.1:{port}/v1/models");
        let ca = ca.display().to_string();
        tokio::task::spawn_blocking(move || curl(&["--cacert", &ca, &url]))
            .await
            .unwrap()
            .status
            .success()
    };
    assert!(fetch(first.ca.clone()).await);
    // New files under the same names, then a reload.
    let second = TestCerts::generate(&dir.0, "second");
    std::fs::copy(&second.cert, &first.cert).unwrap();
    std::fs::copy(&second.key, &first.key).unwrap();
    let mut config = tokenmeter::config::ServeConfig::default();
    config.tls.cert_file = Some(first.cert.clone());
    config.tls.key_file = Some(first.key.clone());
    let handle = proxy.handle.as_ref().unwrap();
    let report = handle.reload(&config);
    assert_eq!(report.tls_error, None);
    assert!(
        fetch(second.ca.clone()).await,
        "the new certificate is served"
    );
    assert!(!fetch(first.ca.clone()).await, "the old one is gone");
    // A broken key file: the reload says why, and the certificate in use stays.
    std::fs::write(&first.key, "not a key").unwrap();
    let report = handle.reload(&config);
    assert!(report.tls_error.unwrap().contains("private key"));
    assert!(fetch(second.ca.clone()).await);
    proxy.stop().await;
}
