//! The pacemaker of a serving thread: a timer kept pending while the thread serves requests,
//! and [`Activity`], the count of requests that keeps it going.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

/// How often a serving thread's [`pacemaker`] ticks.
const PACE: Duration = Duration::from_millis(500);

/// Keeps a timer due within [`PACE`] pending on a serving thread's runtime while the thread
/// serves requests. Tokio wakes its own I/O driver (an eventfd write, then one more
/// `epoll_wait`) whenever a timer is armed that is due sooner than every pending one; hyper arms
/// its head-read timer each time a keep-alive connection waits for its next request, and the
/// request and body timers are armed per request, so without a nearer timer most requests paid
/// those two system calls (an eventfd write per streamed request, seen with strace). With this tick pending, no per-request timer is ever the soonest. A tick is not
/// free either (three `epoll_wait`s and an eventfd write per tick), so after a
/// tick with no new request it stops until the next request: an idle proxy's serving threads
/// sleep, whether or not clients keep connections open, and only the first request after a quiet
/// tick pays the two system calls.
pub(super) async fn pacemaker(activity: Arc<Activity>) {
    let mut seen = activity.requests.load(Ordering::Relaxed);
    loop {
        tokio::time::sleep(PACE).await;
        let now = activity.requests.load(Ordering::Relaxed);
        if now == seen {
            // Everything on this thread runs on this runtime, one task at a time: no request
            // can slip in between this check and the wait.
            activity.parked.store(true, Ordering::Relaxed);
            activity.wake.notified().await;
        }
        seen = activity.requests.load(Ordering::Relaxed);
    }
}

/// The requests a serving thread has started, for its [`pacemaker`].
#[derive(Default)]
pub(super) struct Activity {
    requests: AtomicU64,
    /// The pacemaker waits for the next request.
    parked: AtomicBool,
    wake: Notify,
}

impl Activity {
    /// A request started on this thread: wakes the pacemaker if it rests.
    pub(super) fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if self.parked.swap(false, Ordering::Relaxed) {
            self.wake.notify_one();
        }
    }
}
