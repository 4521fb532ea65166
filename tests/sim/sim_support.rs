//! Shared helpers of the simulator's tests: a raw HTTP/1.1 client and fixture loading.

use std::time::{Duration, Instant};

use tokenmeter::sim::{spawn, SimConfig, SimHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Starts a simulator on 127.0.0.1:0.
pub async fn start(cfg: SimConfig) -> SimHandle {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    spawn(cfg, l).await.unwrap()
}

/// A quiet config: no stop rule, no stats log.
pub fn cfg() -> SimConfig {
    SimConfig {
        stop_probability_per_token: 0.0,
        log_stats_interval_s: 0.0,
        ..SimConfig::default()
    }
}

/// A parsed HTTP response; `chunks` are the body's HTTP chunks with their arrival times.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub chunks: Vec<(Instant, String)>,
    pub sent_at: Instant,
    /// When the response head (status + headers) was complete.
    pub head_at: Instant,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// `data:` payloads of an SSE body, in order.
    pub fn events(&self) -> Vec<String> {
        sse_events(&self.body)
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// Splits an SSE body into its `data:` payloads.
pub fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("bad event {e:?}"))
                .to_string()
        })
        .collect()
}

/// Sends one request on a fresh connection and reads the whole response.
pub async fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    ct: Option<&str>,
    body: &str,
) -> Resp {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    send(&mut s, method, path, ct, body).await;
    let sent_at = Instant::now();
    read_response(&mut s, sent_at).await
}

/// POSTs JSON.
pub async fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> Resp {
    request(addr, "POST", path, Some("application/json"), body).await
}

/// Writes a request.
pub async fn send(s: &mut TcpStream, method: &str, path: &str, ct: Option<&str>, body: &str) {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-length: {}\r\n",
        body.len()
    );
    if let Some(ct) = ct {
        req.push_str(&format!("content-type: {ct}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await.unwrap();
}

/// Reads a response (content-length or chunked), timing each chunk.
pub async fn read_response(s: &mut TcpStream, sent_at: Instant) -> Resp {
    let mut buf: Vec<u8> = Vec::new();
    let head_end = loop {
        if let Some(p) = find(&buf, b"\r\n\r\n") {
            break p;
        }
        read_more(s, &mut buf).await;
    };
    let head_at = Instant::now();
    let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    let mut rest = buf[head_end + 4..].to_vec();
    let get = |k: &str| headers.iter().find(|(h, _)| h == k).map(|(_, v)| v.clone());
    let mut chunks = Vec::new();
    let body = if let Some(len) = get("content-length") {
        let len: usize = len.parse().unwrap();
        while rest.len() < len {
            read_more(s, &mut rest).await;
        }
        String::from_utf8(rest[..len].to_vec()).unwrap()
    } else {
        assert_eq!(get("transfer-encoding").as_deref(), Some("chunked"));
        let mut body = String::new();
        loop {
            let line_end = loop {
                if let Some(p) = find(&rest, b"\r\n") {
                    break p;
                }
                read_more(s, &mut rest).await;
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap().trim(), 16)
                    .unwrap();
            while rest.len() < line_end + 2 + size + 2 {
                read_more(s, &mut rest).await;
            }
            let data = String::from_utf8(rest[line_end + 2..line_end + 2 + size].to_vec()).unwrap();
            rest.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break;
            }
            body.push_str(&data);
            chunks.push((Instant::now(), data));
        }
        body
    };
    Resp {
        status,
        headers,
        body,
        chunks,
        sent_at,
        head_at,
    }
}

async fn read_more(s: &mut TcpStream, buf: &mut Vec<u8>) {
    let mut tmp = [0u8; 16384];
    let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut tmp))
        .await
        .expect("read timed out")
        .unwrap();
    assert!(
        n > 0,
        "connection closed early; got {:?}",
        String::from_utf8_lossy(buf)
    );
    buf.extend_from_slice(&tmp[..n]);
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// A recorded fixture: status, headers, body.
pub fn fixture(name: &str) -> (u16, Vec<(String, String)>, String) {
    let path = format!(
        "{}/tests/fixtures/vllm/{name}.http",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    (status, headers, body.to_string())
}

/// Top-level key order of a JSON object.
pub fn keys(v: &serde_json::Value) -> Vec<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// The shape of a value: object keys recursively (in order), arrays by their elements' shapes,
/// scalars by type — ids, numbers and texts do not matter.
pub fn shape(v: &serde_json::Value) -> String {
    use serde_json::Value as V;
    match v {
        V::Object(o) => {
            let inner: Vec<String> = o.iter().map(|(k, v)| format!("{k}:{}", shape(v))).collect();
            format!("{{{}}}", inner.join(","))
        }
        V::Array(a) => format!("[{}]", a.iter().map(shape).collect::<Vec<_>>().join(",")),
        V::String(_) => "s".into(),
        V::Number(_) => "n".into(),
        V::Bool(_) => "b".into(),
        V::Null => "null".into(),
    }
}
