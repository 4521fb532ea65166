//! A fake OpenAI-compatible server with known timing, for the load generator's tests.
//!
//! Streaming: the role event and the first token leave together at `ttft` after the request
//! arrived, token k (0-based) at `ttft + k·gap` (absolute deadlines, so timer lateness does not
//! accumulate), then the usage event and `[DONE]`. A request streamed with `max_tokens = n` thus
//! takes `ttft + (n-1)·gap`: per-request rate `n / (ttft + (n-1)·gap)`. Non-streaming: the whole
//! answer after `nonstream_delay`. Response headers go out at once, as vLLM does.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// How the fake behaves.
#[derive(Clone, Debug)]
pub struct FakeConfig {
    pub ttft: Duration,
    pub gap: Duration,
    pub nonstream_delay: Duration,
    /// Requests whose prompt contains this answer 500.
    pub fail_prompt_contains: Option<String>,
    /// Serve a tokenmeter-like `/stats`.
    pub stats: bool,
    /// Leave usage out of streams.
    pub no_usage: bool,
    /// Write events with `\r\n` and split each into three frames.
    pub crlf_split: bool,
    /// Answer one JSON document even when a stream was asked for.
    pub ignore_stream: bool,
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            ttft: Duration::from_millis(20),
            gap: Duration::from_millis(10),
            nonstream_delay: Duration::from_millis(100),
            fail_prompt_contains: None,
            stats: false,
            no_usage: false,
            crlf_split: false,
            ignore_stream: false,
        }
    }
}

/// What the fake saw of one chat request.
#[derive(Clone, Debug)]
pub struct Seen {
    pub body: serde_json::Value,
    pub auth: Option<String>,
    pub user_header: Option<String>,
}

/// Shared counters.
#[derive(Default)]
pub struct FakeState {
    pub in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    pub chat_requests: AtomicUsize,
    /// TCP connections accepted.
    pub connections: AtomicUsize,
    pub seen: Mutex<Vec<Seen>>,
    /// Per chat request, in arrival order: what the fake actually did (the server-side truth
    /// when a loaded machine makes it late).
    pub timings: Mutex<Vec<ServerTiming>>,
}

/// When the fake actually sent things for one request, in ms after the request arrived.
#[derive(Clone, Debug)]
pub struct ServerTiming {
    pub prompt: String,
    /// The first event with choices was handed to the connection.
    pub first_ms: Option<f64>,
    /// The last byte was handed to the connection.
    pub wall_ms: Option<f64>,
}

/// A running fake.
pub struct Fake {
    pub url: String,
    pub state: Arc<FakeState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The model id listed by the fake.
pub const FAKE_MODEL: &str = "fake-model";
/// The proxy window rate served by the fake `/stats`.
pub const FAKE_WINDOW_TOK_S: f64 = 123.0;

type Body = BoxBody<Bytes, Infallible>;

fn full(status: u16, json: serde_json::Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(json.to_string())).boxed());
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}

/// Decrements in-flight when dropped (also when the client goes away mid-stream).
struct InFlightGuard(Arc<FakeState>);
impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn enter(state: &Arc<FakeState>) -> InFlightGuard {
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.max_in_flight.fetch_max(now, Ordering::SeqCst);
    InFlightGuard(Arc::clone(state))
}

/// Starts a fake on 127.0.0.1, port 0.
pub async fn spawn(cfg: FakeConfig) -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let state = Arc::new(FakeState::default());
    let st = Arc::clone(&state);
    let task = tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            // As uvicorn does; without it Nagle holds small events back for the client's ACK.
            let _ = sock.set_nodelay(true);
            st.connections.fetch_add(1, Ordering::SeqCst);
            let (cfg, st) = (cfg.clone(), Arc::clone(&st));
            tokio::spawn(async move {
                let svc = service_fn(move |req| handle(req, cfg.clone(), Arc::clone(&st)));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
    Fake {
        url: format!("http://{addr}"),
        state,
        task,
    }
}

async fn handle(
    req: Request<hyper::body::Incoming>,
    cfg: FakeConfig,
    st: Arc<FakeState>,
) -> Result<Response<Body>, Infallible> {
    let arrived = tokio::time::Instant::now();
    let path = req.uri().path().to_owned();
    match (req.method().as_str(), path.as_str()) {
        ("GET", "/v1/models") => {
            return Ok(full(
                200,
                serde_json::json!({"object":"list","data":[{"id":FAKE_MODEL,"object":"model"}]}),
            ))
        }
        ("GET", "/stats") if cfg.stats => {
            let w = serde_json::json!({"seconds":10,"gen_tok_s":FAKE_WINDOW_TOK_S,"steady":true,
                "in_flight":{"min":4,"max":4,"mean":4.0}});
            return Ok(full(
                200,
                serde_json::json!({"schema":1,"windows":{"10s":w,"60s":null}}),
            ));
        }
        ("POST", "/v1/chat/completions") => {}
        _ => return Ok(full(404, serde_json::json!({"detail":"Not Found"}))),
    }
    let guard = enter(&st);
    st.chat_requests.fetch_add(1, Ordering::SeqCst);
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (auth, user_header) = (header("authorization"), header("x-tokenmeter-user"));
    let bytes = req.into_body().collect().await.unwrap().to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    st.seen.lock().unwrap().push(Seen {
        body: body.clone(),
        auth,
        user_header,
    });
    let prompt = body["messages"][0]["content"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    if cfg
        .fail_prompt_contains
        .as_deref()
        .is_some_and(|m| prompt.contains(m))
    {
        return Ok(full(
            500,
            serde_json::json!({"error":{"message":"injected failure","type":"InternalServerError","param":null,"code":500}}),
        ));
    }
    let idx = {
        let mut t = st.timings.lock().unwrap();
        t.push(ServerTiming {
            prompt: prompt.clone(),
            first_ms: None,
            wall_ms: None,
        });
        t.len() - 1
    };
    let record = {
        let st = Arc::clone(&st);
        move |first: bool| {
            let ms = Some(arrived.elapsed().as_secs_f64() * 1e3);
            let mut t = st.timings.lock().unwrap();
            if first {
                t[idx].first_ms = ms;
            } else {
                t[idx].wall_ms = ms;
            }
        }
    };
    let n = body["max_tokens"].as_u64().unwrap_or(16);
    let usage = serde_json::json!({"prompt_tokens":12,"total_tokens":12+n,"completion_tokens":n});
    if body["stream"] != serde_json::Value::Bool(true) || cfg.ignore_stream {
        tokio::time::sleep_until(arrived + cfg.nonstream_delay).await;
        record(false);
        drop(guard);
        return Ok(full(
            200,
            serde_json::json!({"id":"x","object":"chat.completion","model":FAKE_MODEL,
            "choices":[{"index":0,"message":{"role":"assistant","content":"tok ".repeat(n as usize)},"finish_reason":"length"}],
            "usage":usage}),
        ));
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        let guard = guard;
        let send = |s: String| {
            let tx = tx.clone();
            let crlf = cfg.crlf_split;
            async move {
                let ev = if crlf {
                    format!("data: {s}\r\n\r\n")
                } else {
                    format!("data: {s}\n\n")
                };
                if !crlf {
                    return tx.send(Bytes::from(ev)).await.is_ok();
                }
                let b = Bytes::from(ev);
                let (a, c) = (b.len() / 3, 2 * b.len() / 3);
                for part in [b.slice(..a), b.slice(a..c), b.slice(c..)] {
                    if tx.send(part).await.is_err() {
                        return false;
                    }
                }
                true
            }
        };
        let chunk = |delta: serde_json::Value, fin: Option<&str>| {
            serde_json::json!({"id":"x","object":"chat.completion.chunk","model":FAKE_MODEL,
                "choices":[{"index":0,"delta":delta,"finish_reason":fin}]})
            .to_string()
        };
        tokio::time::sleep_until(arrived + cfg.ttft).await;
        if !send(chunk(
            serde_json::json!({"role":"assistant","content":""}),
            None,
        ))
        .await
        {
            return;
        }
        record(true);
        for k in 0..n {
            tokio::time::sleep_until(arrived + cfg.ttft + cfg.gap * k as u32).await;
            let fin = (k + 1 == n).then_some("length");
            if !send(chunk(serde_json::json!({"content":"tok"}), fin)).await {
                return;
            }
        }
        if !cfg.no_usage {
            let ev = serde_json::json!({"id":"x","object":"chat.completion.chunk","model":FAKE_MODEL,"choices":[],"usage":usage});
            if !send(ev.to_string()).await {
                return;
            }
        }
        // Leave the in-flight count before the last bytes, so a client that starts its next
        // request after this one ended can never be seen as one too many.
        drop(guard);
        if send("[DONE]".to_owned()).await {
            record(false);
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert(
        "content-type",
        "text/event-stream; charset=utf-8".parse().unwrap(),
    );
    Ok(r)
}
