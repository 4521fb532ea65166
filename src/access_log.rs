//! JSON-lines access log: one line per finished request, written by a background task behind a
//! bounded channel. The data path never waits: when the channel is full the record is dropped and
//! counted. Lines are written in batches: while lines keep coming the writer looks at its queue
//! on a timer and does not wait on it, so no sender wakes it (a wake is a futex call on the
//! serving thread, just before the response's last chunk, and a context switch). After a batch
//! it rests [`BATCH_INTERVAL`]; each empty look doubles the rest, and past [`IDLE_INTERVAL`] it
//! waits on the queue, so an idle writer sleeps. Reopen (SIGHUP) and shutdown end a rest at once
//! and flush.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Notify};

use crate::clock::UnixNanos;
use crate::observe::Observer;
use crate::record::RequestRecord;
use crate::scrape::ServerSample;

/// How long the writer rests after writing a batch: the most a line waits for its write while
/// lines keep coming.
pub const BATCH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);

/// The longest rest: each look that finds nothing doubles the rest, and once it would pass this
/// (after about 1.3 s without a line) the writer waits on the queue itself, so an idle proxy's
/// writer sleeps until the next line, and only that line's sender wakes it.
pub const IDLE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(640);

/// One line of the access log: a request record, or a sample of the upstream's own metrics.
#[derive(Debug, Clone)]
pub enum LogLine {
    /// `"type": "request"`.
    Request(Arc<RequestRecord>),
    /// `"type": "server_sample"`.
    ServerSample(Arc<ServerSample>),
}

impl LogLine {
    fn write_json_line(&self, out: &mut impl Write) -> std::io::Result<()> {
        match self {
            LogLine::Request(r) => r.write_json_line(out),
            LogLine::ServerSample(s) => out.write_all(&s.to_json_line()),
        }
    }
}

/// Counters the access-log writer keeps, shown in `/stats` and the process log.
#[derive(Debug, Default)]
pub struct AccessLogCounters {
    /// Lines written to the file (flushed).
    pub written: AtomicU64,
    /// Records dropped because the queue was full or the writer had stopped.
    pub dropped: AtomicU64,
    /// Lines lost to write errors (full disk, unwritable file).
    pub failed: AtomicU64,
}

impl AccessLogCounters {
    /// (written, dropped, failed) now.
    pub fn get(&self) -> (u64, u64, u64) {
        (
            self.written.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

/// The data-path side: queues lines without waiting.
#[derive(Clone)]
pub struct AccessLogSink {
    tx: mpsc::Sender<LogLine>,
    counters: Arc<AccessLogCounters>,
}

impl AccessLogSink {
    /// Queues a line without waiting; a full queue drops it and counts it in `dropped`.
    pub fn send(&self, line: LogLine) {
        if self.tx.try_send(line).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Queues a `server_sample` line.
    pub fn server_sample(&self, sample: Arc<ServerSample>) {
        self.send(LogLine::ServerSample(sample));
    }
}

impl Observer for AccessLogSink {
    fn started(&self, _: u64, _: UnixNanos, _: &Arc<str>, _: Option<&Arc<str>>) {}

    fn tokens(&self, _: u64, _: UnixNanos, _: u64, _: crate::itl::Gaps) {}

    fn finished(&self, _: u64, _: UnixNanos, record: &Arc<RequestRecord>, _: bool) {
        self.send(LogLine::Request(record.clone()));
    }
}

/// The writer's thread: the switch that stops it, word that it finished, the thread to join.
type WriterThread = (
    oneshot::Sender<()>,
    oneshot::Receiver<()>,
    std::thread::JoinHandle<()>,
);

/// Control of the writer.
pub struct AccessLogWriter {
    reopen: Arc<Notify>,
    close: std::sync::Mutex<Option<WriterThread>>,
    counters: Arc<AccessLogCounters>,
}

impl AccessLogWriter {
    /// Asks the writer to reopen its file (after logrotate moved it).
    pub fn reopen(&self) {
        self.reopen.notify_one();
    }

    /// The writer's counters.
    pub fn counters(&self) -> Arc<AccessLogCounters> {
        self.counters.clone()
    }

    /// Stops taking records, writes what is queued, flushes, and joins the writer thread (once).
    pub async fn close(&self) {
        let pending = self.close.lock().ok().and_then(|mut c| c.take());
        if let Some((stop, finished, thread)) = pending {
            let _ = stop.send(());
            let _ = finished.await;
            // It sent `finished` as its last act, so this returns at once.
            let _ = thread.join();
        }
    }
}

/// Opens `path` for appending (created if missing) and starts the writer on a thread of its own:
/// its file writes block, and must not stall a runtime's worker thread (the accept loop and the
/// scraper run on the caller's runtime).
pub fn spawn(
    path: &Path,
    queue: usize,
    counters: Arc<AccessLogCounters>,
) -> std::io::Result<(AccessLogSink, AccessLogWriter)> {
    let file = open(path)?;
    let (tx, rx) = mpsc::channel(queue);
    let reopen = Arc::new(Notify::new());
    let (close_tx, close_rx) = oneshot::channel();
    let (finished_tx, finished) = oneshot::channel();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let writer = write_loop(
        path.to_path_buf(),
        file,
        rx,
        reopen.clone(),
        close_rx,
        counters.clone(),
    );
    let thread = std::thread::Builder::new()
        .name("tokenmeter-log".into())
        .spawn(move || {
            runtime.block_on(writer);
            let _ = finished_tx.send(());
        })?;
    Ok((
        AccessLogSink {
            tx,
            counters: counters.clone(),
        },
        AccessLogWriter {
            reopen,
            close: std::sync::Mutex::new(Some((close_tx, finished, thread))),
            counters,
        },
    ))
}

fn open(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// Buffered lines not yet known to be on disk.
struct Output {
    path: PathBuf,
    file: Option<std::io::BufWriter<std::fs::File>>,
    unflushed: u64,
    counters: Arc<AccessLogCounters>,
}

impl Output {
    fn write(&mut self, record: &LogLine) {
        if self.file.is_none() {
            self.reopen();
        }
        match self.file.as_mut().map(|f| record.write_json_line(f)) {
            Some(Ok(())) => self.unflushed += 1,
            Some(Err(e)) => {
                let lost = self.unflushed + 1;
                self.fail(&e, lost);
            }
            None => self.lose(1),
        }
    }

    fn flush(&mut self) {
        let Some(f) = self.file.as_mut() else { return };
        match f.flush() {
            Ok(()) => {
                self.counters
                    .written
                    .fetch_add(self.unflushed, Ordering::Relaxed);
                self.unflushed = 0;
            }
            Err(e) => {
                let n = self.unflushed;
                self.fail(&e, n);
            }
        }
    }

    fn reopen(&mut self) {
        self.flush();
        match open(&self.path) {
            Ok(f) => self.file = Some(std::io::BufWriter::with_capacity(64 * 1024, f)),
            Err(e) => {
                tracing::warn!(error = %e, path = %self.path.display(), "access log: cannot open; records are counted as failed until it can");
                self.file = None;
            }
        }
    }

    /// A write error: `lines` are lost; drop the handle (unflushed) so the next record reopens.
    fn fail(&mut self, e: &std::io::Error, lines: u64) {
        let before = self.counters.failed.fetch_add(lines, Ordering::Relaxed);
        if before == 0 || (before + lines).is_power_of_two() {
            tracing::warn!(error = %e, lost_so_far = before + lines, "access log: write failed; serving continues");
        }
        self.unflushed = 0;
        if let Some(f) = self.file.take() {
            // Dropping a BufWriter would retry the flush; the lines are already counted as lost.
            let _ = f.into_parts();
        }
    }

    fn lose(&mut self, lines: u64) {
        self.counters.failed.fetch_add(lines, Ordering::Relaxed);
    }
}

async fn write_loop(
    path: PathBuf,
    file: std::fs::File,
    mut rx: mpsc::Receiver<LogLine>,
    reopen: Arc<Notify>,
    mut close: oneshot::Receiver<()>,
    counters: Arc<AccessLogCounters>,
) {
    let mut drops = DropReporter::default();
    let mut out = Output {
        path,
        file: Some(std::io::BufWriter::with_capacity(64 * 1024, file)),
        unflushed: 0,
        counters,
    };
    let mut rest = BATCH_INTERVAL;
    loop {
        // `try_recv` registers no waker: while the writer looks on a timer, a sender never wakes
        // this thread (a futex call on the serving thread, then this thread competing for a
        // core while the next request starts).
        let mut wrote = false;
        let mut ended = false;
        loop {
            match rx.try_recv() {
                Ok(r) => {
                    out.write(&r);
                    wrote = true;
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    ended = true;
                    break;
                }
            }
        }
        if wrote {
            out.flush();
            rest = BATCH_INTERVAL;
        } else {
            rest *= 2;
        }
        drops.report(&out.counters);
        if ended {
            break;
        }
        if rest > IDLE_INTERVAL {
            // Quiet: wait on the queue (the next sender wakes this thread), then look again.
            tokio::select! {
                biased;
                _ = &mut close => break,
                _ = reopen.notified() => out.reopen(),
                rec = rx.recv() => match rec {
                    Some(r) => {
                        out.write(&r);
                        out.flush();
                        rest = BATCH_INTERVAL;
                        // Rest before looking again, as after any batch.
                        tokio::select! {
                            biased;
                            _ = &mut close => break,
                            _ = reopen.notified() => out.reopen(),
                            _ = tokio::time::sleep(rest) => {}
                        }
                    }
                    None => break,
                },
            }
            continue;
        }
        tokio::select! {
            biased;
            _ = &mut close => break,
            _ = reopen.notified() => out.reopen(),
            _ = tokio::time::sleep(rest) => {}
        }
    }
    rx.close();
    while let Some(r) = rx.recv().await {
        out.write(&r);
    }
    out.flush();
    drops.report(&out.counters);
}

/// Tells the process log about dropped records, at most once a second.
#[derive(Default)]
struct DropReporter {
    reported: u64,
    last: Option<std::time::Instant>,
}

impl DropReporter {
    fn report(&mut self, counters: &AccessLogCounters) {
        let dropped = counters.dropped.load(Ordering::Relaxed);
        if dropped > self.reported
            && self
                .last
                .is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(1))
        {
            tracing::warn!(
                dropped_total = dropped,
                "access log: queue full, records dropped (raise access_log_buffer)"
            );
            self.reported = dropped;
            self.last = Some(std::time::Instant::now());
        }
    }
}
