//! Agent-like load: N closed-loop agents that think between requests, or open-loop Poisson
//! arrivals; prompt and output lengths drawn from distributions. This is production-shaped
//! traffic: the in-flight level changes all the time, which is what the proxy's
//! production-traffic curve is built to measure.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{rngs::SmallRng, Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::api::Api;
use super::client::{ChatSpec, HttpClient};
use super::dist::Dist;
use super::progress::{Progress, ProgressEvent};
use super::prompts::prompt_for;
use super::report::{AgentSpec, AgentsReport, Arrivals, ClientTick, RequestFigures};
use super::result::RequestResult;
use super::session::{Session, SessionsTally};

/// Upper bound on requests started in one run.
const MAX_STARTED: usize = 10_000_000;

/// A prompt of about `words` words, distinct per `seq`.
pub fn prompt_of(seq: usize, words: u64) -> String {
    let mut p = prompt_for(seq);
    p.push_str(" Context:");
    for w in 0..words {
        p.push_str(if w % 7 == 0 { " fn" } else { " code" });
    }
    p
}

/// Agent `i`'s instructions: the same in all its sessions (as a coding agent's system prompt),
/// about 300 words.
fn agent_instructions(i: usize) -> String {
    let mut s =
        format!("You are coding agent {i}. Work in the repository, use the tools, report briefly.");
    for w in 0..300 {
        s.push_str(if w % 5 == 0 { " rule" } else { " guide" });
    }
    s
}

/// The API of agent (or Poisson request) `i`: the spec's mix in turn, else the run's.
fn api_of(spec: &AgentSpec, base: &ChatSpec, i: usize) -> Api {
    match spec.apis.len() {
        0 => base.api,
        n => spec.apis[i % n],
    }
}

/// What one request in `api` asks for, drawn from `spec`.
fn draw(spec: &AgentSpec, base: &ChatSpec, api: Api, seq: usize, rng: &mut SmallRng) -> ChatSpec {
    ChatSpec {
        api,
        prompt: prompt_of(seq, spec.prompt_words.sample(rng)),
        max_tokens: spec.output_tokens.sample(rng).clamp(1, u32::MAX as u64) as u32,
        stream: rng.gen_bool(spec.stream_share.clamp(0.0, 1.0)),
        ..base.clone()
    }
}

/// A client of its own per agent, so each is a distinct user (`agent-<i>`) unless `user` is set.
fn agent_client(client: &HttpClient, user: Option<&str>, name: String) -> HttpClient {
    client.with_user(Some(user.map_or(name, str::to_owned)))
}

/// Agent-like traffic under way: dropping it (or [`Traffic::stop`]) cancels its requests.
#[derive(Debug)]
pub struct Traffic {
    tasks: JoinSet<()>,
    /// One result per finished request, in finishing order.
    pub results: mpsc::UnboundedReceiver<RequestResult>,
    live: Arc<AtomicU64>,
    in_flight: Arc<AtomicU64>,
    started_n: Arc<AtomicU64>,
    skipped_n: Arc<AtomicU64>,
}

impl Traffic {
    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed) as usize
    }

    /// Cancels the agents and their requests (the server sees the clients leave).
    pub async fn stop(&mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Starts agent-like traffic through `client`: `arrivals` shaped by `spec`, requests built on
/// `base` (model, API, ignore_eos). Runs until stopped or dropped.
pub fn start_traffic(
    client: &HttpClient,
    base: &ChatSpec,
    user: Option<&str>,
    arrivals: Arrivals,
    spec: &AgentSpec,
) -> Traffic {
    let live = Arc::new(AtomicU64::new(0));
    let in_flight = Arc::new(AtomicU64::new(0));
    let started_n = Arc::new(AtomicU64::new(0));
    let skipped_n = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::unbounded_channel::<RequestResult>();
    let mut tasks: JoinSet<()> = JoinSet::new();
    match arrivals {
        Arrivals::Agents { agents } => {
            for i in 0..agents.max(1) {
                let client = agent_client(client, user, format!("agent-{i}"));
                let (tx, live, in_flight, started_n) = (
                    tx.clone(),
                    live.clone(),
                    in_flight.clone(),
                    started_n.clone(),
                );
                let base = base.clone();
                let spec = spec.clone();
                let api = api_of(&spec, &base, i);
                tasks.spawn(async move {
                    let mut rng = SmallRng::seed_from_u64(spec.seed ^ ((i as u64 + 1) * 0x9E37));
                    // Agents start spread over one mean think time, not all in the same instant.
                    let first = rng.gen_range(0.0..=spec.think_ms.mean().max(1.0));
                    tokio::time::sleep(Duration::from_secs_f64(first / 1e3)).await;
                    let system = agent_instructions(i);
                    let device: String = (0..4)
                        .map(|_| format!("{:016x}", rng.gen::<u64>()))
                        .collect();
                    // One session after another (turnover): each of some turns, each turn of
                    // some calls, every call resending the conversation it extends.
                    for _ in 0..spec.sessions_per_agent.unwrap_or(u64::MAX) {
                        let mut session =
                            Session::new(api, system.clone(), device.clone(), &mut rng);
                        let turns = spec.turns_per_session.sample(&mut rng).max(1);
                        'session: for turn in 0..turns {
                            let words = spec.prompt_words.sample(&mut rng);
                            let seq = started_n.load(Ordering::Relaxed) as usize;
                            // The first turn brings the long task; later ones a short follow-up.
                            let ask = if turn == 0 {
                                prompt_of(seq, words)
                            } else {
                                prompt_of(seq, words / 10)
                            };
                            session.user(ask, &mut rng);
                            let calls = spec.calls_per_turn.sample(&mut rng).max(1);
                            for call in 0..calls {
                                if call > 0 {
                                    let words = spec.prompt_words.sample(&mut rng) / 4;
                                    session.tool_result(
                                        format!("Tool output:{}", &prompt_of(seq, words)[..]),
                                        &mut rng,
                                    );
                                }
                                let seq = started_n.fetch_add(1, Ordering::Relaxed) as usize;
                                if seq >= MAX_STARTED {
                                    return;
                                }
                                let chat = draw(&spec, &base, api, seq, &mut rng);
                                in_flight.fetch_add(1, Ordering::Relaxed);
                                let (mut r, heard) =
                                    client.converse(seq, &chat, &session, &live).await;
                                in_flight.fetch_sub(1, Ordering::Relaxed);
                                r.session_id = Some(session.id.clone());
                                r.session_api = Some(api.as_str());
                                r.turn = Some(session.turns);
                                r.cached_tokens = heard.cached_tokens;
                                let ok = r.ok;
                                let _ = tx.send(r);
                                let think = spec.think_ms.sample(&mut rng);
                                tokio::time::sleep(Duration::from_millis(think)).await;
                                if !ok {
                                    // A failed call ends its session; the agent starts anew.
                                    break 'session;
                                }
                                session.assistant(heard.text);
                            }
                        }
                    }
                });
            }
        }
        Arrivals::Poisson {
            rate_per_s,
            max_in_flight,
        } => {
            let client = agent_client(client, user, "poisson".into());
            let (tx, live, in_flight, started_n, skipped_n) = (
                tx.clone(),
                live.clone(),
                in_flight.clone(),
                started_n.clone(),
                skipped_n.clone(),
            );
            let base = base.clone();
            let spec = spec.clone();
            tasks.spawn(async move {
                let mut rng = SmallRng::seed_from_u64(spec.seed);
                let gap = Dist::Exponential {
                    mean: 1e6 / rate_per_s.max(1e-9),
                };
                let mut requests: JoinSet<()> = JoinSet::new();
                let mut next = tokio::time::Instant::now();
                loop {
                    next += Duration::from_micros(gap.sample(&mut rng));
                    tokio::time::sleep_until(next).await;
                    while requests.try_join_next().is_some() {}
                    if in_flight.load(Ordering::Relaxed) as usize >= max_in_flight {
                        skipped_n.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let seq = started_n.fetch_add(1, Ordering::Relaxed) as usize;
                    if seq >= MAX_STARTED {
                        return;
                    }
                    let chat = draw(&spec, &base, api_of(&spec, &base, seq), seq, &mut rng);
                    let (client, tx, live, in_flight) =
                        (client.clone(), tx.clone(), live.clone(), in_flight.clone());
                    in_flight.fetch_add(1, Ordering::Relaxed);
                    requests.spawn(async move {
                        let r = client.chat(seq, &chat, &live).await;
                        in_flight.fetch_sub(1, Ordering::Relaxed);
                        let _ = tx.send(r);
                    });
                }
            });
        }
    }
    Traffic {
        tasks,
        results: rx,
        live,
        in_flight,
        started_n,
        skipped_n,
    }
}

/// Runs agent-like load for `duration`; at the deadline the requests in flight are cancelled.
#[allow(clippy::too_many_arguments)]
pub async fn run_agents(
    client: &HttpClient,
    base: &ChatSpec,
    user: Option<&str>,
    arrivals: Arrivals,
    spec: AgentSpec,
    duration: Duration,
    tick_interval: Duration,
    progress: &dyn Progress,
) -> AgentsReport {
    let start = Instant::now();
    let deadline = tokio::time::Instant::from_std(start + duration);
    let mut traffic = start_traffic(client, base, user, arrivals, &spec);
    let (live, in_flight) = (traffic.live.clone(), traffic.in_flight.clone());
    let mut results = Vec::new();
    let mut ticks = Vec::new();
    let mut max_in_flight = 0usize;
    let tick_interval = tick_interval.max(Duration::from_millis(10));
    let mut ticker =
        tokio::time::interval_at(tokio::time::Instant::now() + tick_interval, tick_interval);
    let (mut last_t, mut last_events) = (0.0_f64, 0u64);
    let sleep = tokio::time::sleep_until(deadline);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            biased;
            _ = &mut sleep => break,
            r = traffic.results.recv() => {
                // None: every agent has run its sessions.
                let Some(r) = r else { break };
                max_in_flight = max_in_flight.max(in_flight.load(Ordering::Relaxed) as usize + 1);
                results.push(r);
            }
            _ = ticker.tick() => {
                let t_s = start.elapsed().as_secs_f64();
                let events = live.load(Ordering::Relaxed);
                let dt = t_s - last_t;
                let now_in_flight = in_flight.load(Ordering::Relaxed) as usize;
                max_in_flight = max_in_flight.max(now_in_flight);
                let tick = ClientTick {
                    t_s,
                    done: results.len(),
                    in_flight: now_in_flight,
                    events_per_s: if dt > 0.0 { (events - last_events) as f64 / dt } else { 0.0 },
                };
                (last_t, last_events) = (t_s, events);
                progress.report(&ProgressEvent::SustainedTick(&tick));
                ticks.push(tick);
            }
        }
    }
    let wall_s = start.elapsed().as_secs_f64();
    let cancelled_at_deadline = traffic.in_flight();
    // Dropping the tasks drops their requests' futures: the proxy sees the clients leave.
    traffic.stop().await;
    while let Ok(r) = traffic.results.try_recv() {
        results.push(r);
    }
    let figures = RequestFigures::of(&results);
    let sessions = SessionsTally::of(&results);
    AgentsReport {
        arrivals,
        spec,
        duration_s: duration.as_secs_f64(),
        wall_s,
        started: traffic.started_n.load(Ordering::Relaxed) as usize,
        cancelled_at_deadline,
        skipped: traffic.skipped_n.load(Ordering::Relaxed) as usize,
        client_aggregate_tok_s: (wall_s > 0.0).then(|| figures.completion_tokens as f64 / wall_s),
        figures,
        sessions,
        max_in_flight,
        ticks,
        results,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_have_the_drawn_length_and_differ() {
        let a = prompt_of(0, 100);
        let b = prompt_of(1, 100);
        assert_ne!(a, b);
        let words = a.split_whitespace().count();
        assert!((100..120).contains(&words), "{words}");
    }
}
