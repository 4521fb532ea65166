//! The process signals of a long-running command: SIGTERM and SIGINT stop it, SIGHUP (where the
//! command asks for it) reloads it.
//!
//! The handlers are installed before the command prints its "listening on" line. A supervisor
//! may send SIGTERM as soon as it sees that line; if the handler were installed only after it,
//! such a signal would meet the default action, which ends the process at once, without the
//! drain and with a failed exit status.

use tokio::signal::unix::{signal, Signal, SignalKind};

/// The installed handlers; [`Signals::wait`] consumes them.
pub struct Signals {
    /// SIGTERM and SIGINT, or `None` when either could not be installed (then Ctrl-C is waited
    /// for through tokio's portable handler instead).
    stop: Option<(Signal, Signal)>,
    /// SIGHUP, when the command reloads on it and the handler could be installed.
    hup: Option<Signal>,
}

impl Signals {
    /// Installs the stop handlers, and the SIGHUP handler when `reload_on_hup` is set (otherwise
    /// SIGHUP keeps its default action).
    pub fn install(reload_on_hup: bool) -> Self {
        let stop = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Some((term, int)),
            _ => None,
        };
        let hup = if reload_on_hup {
            signal(SignalKind::hangup()).ok()
        } else {
            None
        };
        Self { stop, hup }
    }

    /// Waits for SIGTERM or SIGINT, calling `on_hup` at every SIGHUP.
    pub async fn wait(self, on_hup: impl Fn()) {
        let Some((mut term, mut int)) = self.stop else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        let mut hup = self.hup;
        loop {
            tokio::select! {
                _ = term.recv() => return,
                _ = int.recv() => return,
                () = next_hup(hup.as_mut()) => on_hup(),
            }
        }
    }
}

/// The next SIGHUP; never, when there is no handler (or its stream has ended).
async fn next_hup(hup: Option<&mut Signal>) {
    if let Some(h) = hup {
        if h.recv().await.is_some() {
            return;
        }
    }
    std::future::pending::<()>().await;
}
