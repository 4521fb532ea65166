//! Joining a thread from async code without blocking the runtime, and without waiting forever.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Waits up to `within` for `thread` to end, polling every millisecond or two on the runtime's
/// timer, then joins it. False (and a warning naming `what`) if it was still running: it is then
/// left detached, so a stuck thread cannot hold up shutdown.
pub async fn join_within(thread: JoinHandle<()>, within: Duration, what: &str) -> bool {
    let deadline = Instant::now() + within;
    while !thread.is_finished() {
        if Instant::now() >= deadline {
            tracing::warn!(
                thread = what,
                ?within,
                "thread did not end in time; left running"
            );
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    if thread.join().is_err() {
        tracing::error!(thread = what, "thread panicked");
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn joins_an_ended_thread_and_gives_up_on_a_stuck_one() {
        let quick = std::thread::spawn(|| {});
        assert!(join_within(quick, Duration::from_secs(5), "quick").await);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let stuck = std::thread::spawn(move || {
            let _ = rx.recv();
        });
        let t = Instant::now();
        assert!(!join_within(stuck, Duration::from_millis(30), "stuck").await);
        assert!(t.elapsed() >= Duration::from_millis(30));
        drop(tx);
    }
}
