//! The HTTP/1.1 front end: routing, vLLM's status codes and bodies, streaming hand-off to the engine.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use tokio::sync::{mpsc, watch};

use super::api::SimApi;
use super::body::{FixedBody, SseBody};
use super::config::{ms_to_ns, SimConfig};
use super::engine::{Ev, Finish, Job};
use super::metrics::{self, Stats};
use super::prompt::token_text;
use super::request::{self, ApiError, GenRequest};
use super::request_log::{TruthLog, TruthRecord};
use super::scheduler::ChannelJob;
use super::truth::KvTruth;
use super::wire_parts::{Answering, ChoiceOut};
use super::{wire_messages, wire_openai, wire_responses};
use crate::clock::{Clock, NANOS_PER_SEC};
use crate::dialect::Api;

/// How the simulator serves `api` (each declared in the API's wire file).
pub fn sim_api(api: Api) -> &'static SimApi {
    match api {
        Api::Chat => &wire_openai::CHAT,
        Api::Completions => &wire_openai::COMPLETIONS,
        Api::Responses => &wire_responses::RESPONSES,
        Api::Messages => &wire_messages::MESSAGES,
    }
}

/// Response body type of every route.
pub type SimBody = UnsyncBoxBody<Bytes, Infallible>;

/// What every request handler shares.
#[derive(Debug)]
pub struct App {
    /// The configuration.
    pub cfg: SimConfig,
    /// Where finished requests' records go (`truth_log`), if anywhere.
    pub truth: Option<Arc<TruthLog>>,
    /// Live statistics and ground truth.
    pub stats: Arc<Stats>,
    /// Job queue into the engine task.
    pub jobs: mpsc::UnboundedSender<ChannelJob>,
    /// Unix seconds at start (`created` of the model card).
    pub started_s: u64,
}

/// Accepts connections until `shutdown` flips; each connection also ends on shutdown.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.changed() => return,
        };
        let Ok((stream, _peer)) = accepted else {
            // Accept errors (e.g. EMFILE) are transient: back off briefly instead of spinning.
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = Arc::clone(&app);
        let mut conn_shutdown = shutdown.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let app = Arc::clone(&app);
                async move { Ok::<_, Infallible>(handle(app, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = conn_shutdown.changed() => {}
            }
        });
    }
}

fn full(
    status: u16,
    content_type: Option<&'static str>,
    body: impl Into<Bytes>,
) -> Response<SimBody> {
    let mut resp = Response::new(Full::new(body.into()).boxed_unsync());
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = resp.headers_mut();
    h.insert(header::SERVER, HeaderValue::from_static("tokenmeter-sim"));
    if let Some(ct) = content_type {
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    h.insert(header::VARY, HeaderValue::from_static("Origin"));
    resp
}

fn json(status: u16, body: impl Into<Bytes>) -> Response<SimBody> {
    full(status, Some("application/json"), body)
}

fn api_error(e: ApiError) -> Response<SimBody> {
    json(e.status, e.body)
}

fn method_not_allowed(allow: &'static str) -> Response<SimBody> {
    let mut r = json(405, r#"{"detail":"Method Not Allowed"}"#);
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

/// Routes one request.
pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<SimBody> {
    let path = req.uri().path().to_string();
    let get = req.method() == Method::GET;
    let post = req.method() == Method::POST;
    match path.as_str() {
        "/health" | "/version" | "/v1/models" | "/metrics" | "/sim/truth" if !get => {
            method_not_allowed("GET")
        }
        "/sim/truth" => json(
            200,
            serde_json::to_string(&KvTruth::read(&app.stats, &app.cfg)).unwrap_or_default(),
        ),
        "/health" => full(200, None, Bytes::new()),
        "/version" => json(200, r#"{"version":"0.32.0-sim"}"#),
        "/v1/models" => json(200, models_body(&app)),
        "/metrics" => full(
            200,
            Some("text/plain; version=0.0.4; charset=utf-8"),
            metrics::render(&app.stats, &app.cfg),
        ),
        "/v1/messages/count_tokens" if !post => method_not_allowed("POST"),
        "/v1/messages/count_tokens" => count_tokens(app, req).await,
        p => match Api::ALL.into_iter().find(|a| a.path() == p) {
            Some(_) if !post => method_not_allowed("POST"),
            Some(api) => generate(app, api, sim_api(api), req).await,
            None => json(404, r#"{"detail":"Not Found"}"#),
        },
    }
}

fn models_body(app: &App) -> String {
    let c = app.started_s;
    serde_json::json!({
        "object": "list",
        "data": [{
            "id": app.cfg.served_model_name, "object": "model", "created": c, "owned_by": "vllm",
            "root": app.cfg.served_model_name, "parent": null, "max_model_len": app.cfg.max_model_len,
            "permission": [{
                "id": format!("modelperm-{:016x}", rand::random::<u64>()), "object": "model_permission",
                "created": c, "allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true,
                "allow_search_indices": false, "allow_view": true, "allow_fine_tuning": false,
                "organization": "*", "group": null, "is_blocking": false
            }]
        }]
    })
    .to_string()
}

/// The request's content type and body (at most `max_body_bytes`).
async fn read_body(app: &App, req: Request<Incoming>) -> Result<(Option<String>, Bytes), ApiError> {
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match Limited::new(req.into_body(), app.cfg.max_body_bytes)
        .collect()
        .await
    {
        Ok(b) => Ok((ct, b.to_bytes())),
        Err(_) => Err(request::error(
            400,
            "BadRequestError",
            "Request body unreadable or too large.",
            None,
        )),
    }
}

/// An error in the shape of `api`'s.
fn endpoint_error(api: &SimApi, e: ApiError) -> Response<SimBody> {
    api_error((api.error)(e))
}

/// `POST /v1/messages/count_tokens`: the prompt estimate; nothing is generated or counted.
async fn count_tokens(app: Arc<App>, req: Request<Incoming>) -> Response<SimBody> {
    let counted = match read_body(&app, req).await {
        Ok((ct, body)) => wire_messages::count_tokens(ct.as_deref(), &body, &app.cfg),
        Err(e) => Err(e),
    };
    match counted {
        Ok(n) => json(200, wire_messages::count_tokens_body(n)),
        Err(e) => endpoint_error(&wire_messages::MESSAGES, e),
    }
}

async fn generate(
    app: Arc<App>,
    endpoint: Api,
    api: &'static SimApi,
    req: Request<Incoming>,
) -> Response<SimBody> {
    let arrival_ns = Clock::global().now();
    let parsed = match read_body(&app, req).await {
        Ok((ct, body)) => request::parse(endpoint, &api.request, ct.as_deref(), &body, &app.cfg),
        Err(e) => Err(e),
    };
    let mut gen = match parsed {
        Ok(g) => g,
        Err(e) => return endpoint_error(api, e),
    };
    let answering = Answering {
        model: app.cfg.served_model_name.as_str(),
        created_s: arrival_ns / NANOS_PER_SEC,
        per_request_metrics: app.cfg.per_request_metrics,
        stamp: app.cfg.stamp_events,
        prompt_tokens_details: app.cfg.enable_prompt_tokens_details,
    };
    if app.cfg.fixed_pace {
        return fixed_pace(&app, api, &gen, arrival_ns, &answering).await;
    }
    // Room for every event the request can produce, so the engine's try_send never finds it full.
    let capacity = (u64::from(gen.n) * gen.max_tokens + 2).min(1 << 40) as usize;
    let (tx, mut rx) = mpsc::channel::<Ev>(capacity);
    let job = Job {
        n: gen.n,
        prompt_tokens: gen.prompt_tokens,
        max_tokens: gen.max_tokens,
        stop_after: gen.stop_after.clone(),
        arrival_ns,
        prompt_ids: std::mem::take(&mut gen.prompt_ids),
        sink: tx,
    };
    app.stats
        .inflight
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if app.jobs.send(job).is_err() {
        app.stats
            .inflight
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        return endpoint_error(
            api,
            request::error(
                503,
                "ServiceUnavailableError",
                "The engine is shut down.",
                None,
            ),
        );
    }
    if gen.stream {
        let writer = (api.writer)(&gen, &answering);
        let mut body = SseBody::new(rx, writer);
        if let Some(log) = &app.truth {
            body = body.with_truth(Arc::clone(log), arrival_ns, gen.prompt_tokens);
        }
        return sse_response(body.boxed_unsync());
    }
    // Non-streaming: if the client leaves, hyper drops this future and with it `rx`: the engine aborts.
    let mut outs: Vec<ChoiceOut> = (0..gen.n)
        .map(|_| ChoiceOut {
            text: String::new(),
            tokens: 0,
            finish: Finish::Length,
        })
        .collect();
    while let Some(ev) = rx.recv().await {
        match ev {
            Ev::Token { choice, finish } => {
                let Some(c) = outs.get_mut(choice as usize) else {
                    continue;
                };
                if finish != Some(Finish::Stop) {
                    c.text.push_str(token_text(c.tokens));
                }
                c.tokens += 1;
                if let Some(f) = finish {
                    c.finish = f;
                }
            }
            Ev::Done(t) => {
                if let Some(log) = &app.truth {
                    let tokens = outs.iter().map(|c| c.tokens).sum();
                    log.write(&TruthRecord::of(
                        arrival_ns,
                        &t,
                        gen.prompt_tokens,
                        tokens,
                        false,
                    ));
                }
                return json(200, (api.full_response)(&gen, &answering, &outs, Some(&t)));
            }
        }
    }
    api_error(request::error(
        503,
        "ServiceUnavailableError",
        "The engine is shut down.",
        None,
    ))
}

fn sse_response(body: SimBody) -> Response<SimBody> {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(header::SERVER, HeaderValue::from_static("tokenmeter-sim"));
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(header::VARY, HeaderValue::from_static("Origin"));
    resp
}

async fn fixed_pace(
    app: &App,
    api: &SimApi,
    gen: &GenRequest,
    arrival_ns: u64,
    answering: &Answering<'_>,
) -> Response<SimBody> {
    let ttft = Duration::from_nanos(ms_to_ns(app.cfg.fixed_ttft_ms));
    let gap = Duration::from_nanos(ms_to_ns(app.cfg.fixed_gap_ms));
    let stats = Arc::clone(&app.stats);
    if gen.stream {
        let writer = (api.writer)(gen, answering);
        let body = FixedBody::new(
            writer,
            stats,
            arrival_ns,
            ttft,
            gap,
            gen.max_tokens,
            gen.n,
            gen.prompt_tokens,
        );
        return sse_response(body.boxed_unsync());
    }
    // Non-streaming fixed pace: answer at the time the last event would have been sent; all tokens
    // are attributed to that second.
    let events = gen.max_tokens;
    let total =
        ttft + Duration::from_nanos(ms_to_ns(app.cfg.fixed_gap_ms) * events.saturating_sub(1));
    stats
        .running
        .fetch_add(u64::from(gen.n), std::sync::atomic::Ordering::Relaxed);
    let guard = RunningGuard {
        stats: &stats,
        n: u64::from(gen.n),
        done: false,
    };
    tokio::time::sleep(total).await;
    let mut guard = guard;
    guard.done = true;
    let tokens = events * u64::from(gen.n);
    stats
        .prompt_tokens_total
        .fetch_add(gen.prompt_tokens, std::sync::atomic::Ordering::Relaxed);
    stats.record_generated(Clock::global().now() / NANOS_PER_SEC, tokens);
    stats
        .finished
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    stats.lock().finished_by_reason[1] += 1;
    let outs: Vec<ChoiceOut> = (0..gen.n)
        .map(|_| ChoiceOut {
            text: (0..events).map(token_text).collect(),
            tokens: events,
            finish: Finish::Length,
        })
        .collect();
    json(200, (api.full_response)(gen, answering, &outs, None))
}

/// Keeps the running gauge right for a non-streaming fixed-pace request, aborted or not.
struct RunningGuard<'a> {
    stats: &'a Stats,
    n: u64,
    done: bool,
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.stats
            .running
            .fetch_sub(self.n, std::sync::atomic::Ordering::Relaxed);
        if !self.done {
            self.stats
                .aborted
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.stats.lock().finished_by_reason[2] += 1;
        }
    }
}
