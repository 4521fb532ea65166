//! The live shell: one thread owns the [`Meter`]; the data path sends it events through a
//! queue and never waits. The queue is bounded by a count of the data events in it
//! ([`MAX_QUEUED_EVENTS`]): beyond, new events are dropped and counted
//! (`meter_events_dropped` in `/stats`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::Thread;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::access_log::AccessLogCounters;
use crate::clock::{Clock, UnixNanos};
use crate::itl::Gaps;
use crate::observe::Observer;
use crate::record::RequestRecord;
use crate::scrape::ServerSample;

use super::config::MeterConfig;
use super::engine::Meter;
use super::recent_seconds::Timeline;
use super::snapshot::{AccessLogView, SnapshotError, SnapshotQuery, StatsSnapshot};

enum Event {
    Start {
        now: UnixNanos,
        id: u64,
        user: Arc<str>,
        model: Option<Arc<str>>,
    },
    Tokens {
        now: UnixNanos,
        id: u64,
        delta: u64,
        gaps: Gaps,
    },
    Prompt {
        id: u64,
        prompt_tokens: u64,
    },
    Finish {
        now: UnixNanos,
        id: u64,
        record: Arc<RequestRecord>,
    },
    // Boxed: rare, and it would otherwise widen every channel slot.
    Snapshot(Box<SnapshotRequest>),
    Prometheus {
        now: UnixNanos,
        reply: oneshot::Sender<String>,
    },
    Timeline {
        now: UnixNanos,
        seconds: u64,
        reply: oneshot::Sender<Timeline>,
    },
    ServerEnable {
        threshold_pct: f64,
    },
    // Boxed like snapshots: one every scrape interval.
    ServerSample(Box<ServerSample>),
    /// Ends the thread once every event queued before it is taken in.
    Stop,
}

struct SnapshotRequest {
    now: UnixNanos,
    query: SnapshotQuery,
    reply: oneshot::Sender<Result<StatsSnapshot, SnapshotError>>,
}

/// How long data events may wait in the queue before the meter thread drains them, while events
/// keep coming. Events carry their own timestamps and every query drains the queue first, so this
/// bounds only the queue's memory, never what `/stats` shows.
const DRAIN_INTERVAL: Duration = Duration::from_millis(50);

/// The longest sleep between drains: after each empty drain the interval doubles up to this, so
/// an idle proxy wakes the meter once a second instead of twenty times.
const IDLE_DRAIN_INTERVAL: Duration = Duration::from_secs(1);

/// Data events (starts, tokens, finishes) the queue may hold; beyond, new ones are dropped and
/// counted. At most 56 bytes each, so about 15 MB; at the 50 ms drain interval this is room for
/// five million events a second, far beyond what one proxy sees (2,000 streams at 100 tokens/s
/// are 200,000), so only a meter thread starved of CPU for seconds drops anything.
pub const MAX_QUEUED_EVENTS: usize = 1 << 18;

/// The bound on the queue: data events in it now, and those refused because it was full.
#[derive(Debug)]
struct Bound {
    queued: AtomicUsize,
    dropped: AtomicU64,
    max: usize,
}

impl Bound {
    fn new(max: usize) -> Self {
        Bound {
            queued: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            max,
        }
    }
}

/// A cheap, cloneable handle to the meter thread. Sending never blocks, locks or logs; events sent
/// after the thread ended are dropped.
#[derive(Clone, Debug)]
pub struct MeterHandle {
    tx: mpsc::UnboundedSender<Event>,
    /// The meter thread, woken for queries only: waking it for every token event cost a futex
    /// call and a context switch per streamed chunk (`benches/overhead.rs` measures the CPU per
    /// event).
    thread: Option<Thread>,
    bound: Arc<Bound>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("meter event")
    }
}

/// Starts the meter on a thread of its own, its timeline starting now. Validate the config first
/// ([`MeterConfig::validate`]); bad values are clamped.
pub fn spawn_meter(config: MeterConfig) -> MeterHandle {
    spawn_meter_at(config, Clock::global().now())
}

/// Starts the meter thread with its timeline starting at `origin` (tests inject time this way).
/// The thread is detached: it ends when the last handle is dropped.
pub fn spawn_meter_at(config: MeterConfig, origin: UnixNanos) -> MeterHandle {
    start(config, origin).0
}

/// Starts the meter like [`spawn_meter`], and returns the one owner of its thread beside the
/// handle: [`MeterThread::stop`] ends and joins it (the proxy's shutdown does).
pub fn spawn_meter_owned(config: MeterConfig) -> (MeterHandle, MeterThread) {
    let (handle, join) = start(config, Clock::global().now());
    let thread = MeterThread {
        handle: handle.clone(),
        join,
    };
    (handle, thread)
}

/// The single owner of the meter thread's `JoinHandle`.
#[derive(Debug)]
pub struct MeterThread {
    handle: MeterHandle,
    join: Option<std::thread::JoinHandle<()>>,
}

impl MeterThread {
    /// Asks the thread to end after the events queued so far and waits up to `within` for it;
    /// false if it did not end in time (it is then left detached). Handles kept elsewhere get
    /// "meter stopped" answers afterwards.
    pub async fn stop(self, within: Duration) -> bool {
        let Some(join) = self.join else {
            return true;
        };
        let _ = self.handle.send_now(Event::Stop);
        crate::join::join_within(join, within, "tokenmeter-meter").await
    }
}

fn start(
    config: MeterConfig,
    origin: UnixNanos,
) -> (MeterHandle, Option<std::thread::JoinHandle<()>>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
    let bound = Arc::new(Bound::new(MAX_QUEUED_EVENTS));
    let taken = bound.clone();
    let mut meter = Meter::new(config, origin);
    // A thread of its own, not a task: as one task among thousands of busy connections, the
    // meter would get one cooperative budget of events per scheduler round and fall behind the
    // events it is sent, and `/stats` would queue behind that backlog under many streams.
    // It never registers a waker on the channel (try_recv only), so senders never wake it; it
    // drains on a timer and whenever a query unparks it.
    let mut interval = DRAIN_INTERVAL;
    let run = move || loop {
        let ev = match rx.try_recv() {
            Ok(ev) => {
                interval = DRAIN_INTERVAL;
                ev
            }
            Err(mpsc::error::TryRecvError::Empty) => {
                std::thread::park_timeout(interval);
                interval = (interval * 2).min(IDLE_DRAIN_INTERVAL);
                continue;
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        };
        if matches!(
            ev,
            Event::Start { .. }
                | Event::Tokens { .. }
                | Event::Prompt { .. }
                | Event::Finish { .. }
        ) {
            taken.queued.fetch_sub(1, Ordering::Relaxed);
        }
        match ev {
            Event::Start {
                now,
                id,
                user,
                model,
            } => meter.request_started(now, id, &user, model.as_deref()),
            Event::Tokens {
                now,
                id,
                delta,
                gaps,
            } => meter.tokens_with_gaps(now, id, delta, gaps),
            Event::Prompt { id, prompt_tokens } => meter.prompt_tokens(id, prompt_tokens),
            Event::Finish { now, id, record } => meter.request_finished_id(now, Some(id), &record),
            Event::Snapshot(req) => {
                let _ = req.reply.send(meter.snapshot(req.now, &req.query));
            }
            Event::Prometheus { now, reply } => {
                let _ = reply.send(meter.prometheus(now));
            }
            Event::Timeline {
                now,
                seconds,
                reply,
            } => {
                let _ = reply.send(meter.timeline(now, seconds));
            }
            Event::ServerEnable { threshold_pct } => meter.enable_server(threshold_pct),
            Event::ServerSample(s) => meter.server_sample(*s),
            Event::Stop => break,
        }
    };
    let join = match std::thread::Builder::new()
        .name("tokenmeter-meter".into())
        .spawn(run)
    {
        Ok(handle) => Some(handle),
        // Without a meter thread the proxy still serves; /stats answers that the meter stopped.
        Err(e) => {
            tracing::error!(error = %e, "cannot start the meter thread");
            None
        }
    };
    let thread = join.as_ref().map(|j| j.thread().clone());
    (MeterHandle { tx, thread, bound }, join)
}

impl MeterHandle {
    /// Generation request `id` of `user` for `model` arrived at `now`.
    pub fn started(&self, id: u64, now: UnixNanos, user: Arc<str>, model: Option<Arc<str>>) {
        self.send_data(Event::Start {
            now,
            id,
            user,
            model,
        });
    }

    /// `delta` completion tokens of request `id` passed the proxy at `now`.
    pub fn tokens(&self, id: u64, now: UnixNanos, delta: u64) {
        self.tokens_with_gaps(id, now, delta, Gaps::default());
    }

    /// The same, with the ITL `gaps` measured since the request's previous report.
    pub fn tokens_with_gaps(&self, id: u64, now: UnixNanos, delta: u64, gaps: Gaps) {
        self.send_data(Event::Tokens {
            now,
            id,
            delta,
            gaps,
        });
    }

    /// Request `id` reported its prompt size before its end (a streamed usage).
    pub fn prompt_tokens(&self, id: u64, prompt_tokens: u64) {
        self.send_data(Event::Prompt { id, prompt_tokens });
    }

    /// Request `id` finished at `now`. If it was [`started`](MeterHandle::started) (with this
    /// id), its open state closes; a record never started is accounted without changing the
    /// in-flight level.
    pub fn finished(&self, id: u64, now: UnixNanos, record: impl Into<Arc<RequestRecord>>) {
        self.send_data(Event::Finish {
            now,
            id,
            record: record.into(),
        });
    }

    /// Queues a data event unless the queue is full; then it is dropped and counted. Two relaxed
    /// atomic operations, no lock, no wakeup.
    fn send_data(&self, ev: Event) {
        // Reserve the slot first, so the count never exceeds the bound and neither does the queue.
        if self.bound.queued.fetch_add(1, Ordering::Relaxed) >= self.bound.max {
            self.bound.queued.fetch_sub(1, Ordering::Relaxed);
            self.bound.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self.tx.send(ev).is_err() {
            // The thread has ended: nothing will take it off the queue.
            self.bound.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Data events dropped because the queue was full, since start.
    pub fn events_dropped(&self) -> u64 {
        self.bound.dropped.load(Ordering::Relaxed)
    }

    /// Sends a query or setting and wakes the thread so it is answered now, after every event
    /// queued before it.
    fn send_now(&self, ev: Event) -> Result<(), ()> {
        self.tx.send(ev).map_err(|_| ())?;
        if let Some(t) = &self.thread {
            t.unpark();
        }
        Ok(())
    }

    /// Turns on the cross-check: windows get a `server` object, disagreements beyond
    /// `threshold_pct` are flagged. Without it, `server` stays `null` and samples are ignored.
    pub fn enable_server_crosscheck(&self, threshold_pct: f64) {
        let _ = self.send_now(Event::ServerEnable { threshold_pct });
    }

    /// A scrape sample of the upstream's `/metrics`.
    pub fn server_sample(&self, sample: ServerSample) {
        let _ = self.send_now(Event::ServerSample(Box::new(sample)));
    }

    /// The `/stats` document at `now`, with `upstream` and the access-log counters filled in.
    pub async fn snapshot(
        &self,
        now: UnixNanos,
        query: SnapshotQuery,
        upstream: &str,
        access_log: &AccessLogCounters,
    ) -> Result<StatsSnapshot, SnapshotError> {
        let (reply, rx) = oneshot::channel();
        let req = Box::new(SnapshotRequest { now, query, reply });
        self.send_now(Event::Snapshot(req))
            .map_err(|_| SnapshotError::Stopped)?;
        let mut snap = rx.await.map_err(|_| SnapshotError::Stopped)??;
        snap.upstream = upstream.to_string();
        snap.access_log = AccessLogView::read(access_log);
        snap.meter_events_dropped = self.events_dropped();
        Ok(snap)
    }

    /// Prometheus exposition at `now` (empty when the meter task is gone).
    pub async fn prometheus(&self, now: UnixNanos) -> String {
        let (reply, rx) = oneshot::channel();
        if self.send_now(Event::Prometheus { now, reply }).is_err() {
            return String::new();
        }
        rx.await.unwrap_or_default()
    }

    /// The aggregate's last `seconds` complete seconds at `now`.
    pub async fn timeline(&self, now: UnixNanos, seconds: u64) -> Result<Timeline, SnapshotError> {
        let (reply, rx) = oneshot::channel();
        self.send_now(Event::Timeline {
            now,
            seconds,
            reply,
        })
        .map_err(|_| SnapshotError::Stopped)?;
        rx.await.map_err(|_| SnapshotError::Stopped)
    }
}

impl Observer for MeterHandle {
    fn started(&self, id: u64, now: UnixNanos, user: &Arc<str>, model: Option<&Arc<str>>) {
        MeterHandle::started(self, id, now, user.clone(), model.cloned());
    }

    fn tokens(&self, id: u64, now: UnixNanos, completion_tokens: u64, gaps: Gaps) {
        MeterHandle::tokens_with_gaps(self, id, now, completion_tokens, gaps);
    }

    fn prompt_tokens(&self, id: u64, prompt_tokens: u64) {
        MeterHandle::prompt_tokens(self, id, prompt_tokens);
    }

    fn finished(&self, id: u64, now: UnixNanos, record: &Arc<RequestRecord>, _: bool) {
        if record.is_generation() {
            MeterHandle::finished(self, id, now, record.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_new_events_and_counts_them() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let h = MeterHandle {
            tx,
            thread: None,
            bound: Arc::new(Bound::new(3)),
        };
        for i in 0..5 {
            h.tokens(1, i, 1);
        }
        assert_eq!(h.events_dropped(), 2);
        let mut queued = 0;
        while rx.try_recv().is_ok() {
            queued += 1;
        }
        assert_eq!(queued, 3);
        // Queries are never refused: a full queue must not hide itself from /stats.
        assert!(h
            .send_now(Event::ServerEnable { threshold_pct: 1.0 })
            .is_ok());
    }

    #[tokio::test]
    async fn stop_takes_the_queued_events_in_then_ends_and_joins_the_thread() {
        let (h, thread) = spawn_meter_owned(MeterConfig::default());
        let now = Clock::global().now();
        h.started(1, now, Arc::from("u"), None);
        h.tokens(1, now, 3);
        let counters = AccessLogCounters::default();
        let q = SnapshotQuery::default();
        assert!(h.snapshot(now, q.clone(), "up", &counters).await.is_ok());
        assert!(thread.stop(Duration::from_secs(5)).await, "joined in time");
        // The handle outlives the thread: queries get the "meter stopped" answer, not a hang.
        assert!(matches!(
            h.snapshot(now, q, "up", &counters).await,
            Err(SnapshotError::Stopped)
        ));
    }

    #[test]
    fn events_stay_small() {
        // Every channel slot is as large as the largest event; keep it at a start's size.
        assert!(
            std::mem::size_of::<Event>() <= 56,
            "{}",
            std::mem::size_of::<Event>()
        );
    }
}
