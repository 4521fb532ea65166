//! The admin listener: `/stats*`, `/metrics`, the dashboard and the health probes on a thread
//! and runtime of their own.

use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::tls::ListenerTls;

/// Serves `/stats*` on `listener` from a thread and runtime of its own, so the answer does not
/// wait behind busy proxy connections (on the shared runtime it waited behind thousands of
/// streams); through TLS when `tls` is set. Returns the switch that stops it.
pub(super) fn serve_stats_on_own_thread(
    listener: std::net::TcpListener,
    router: axum::Router,
    tls: Option<Arc<ListenerTls>>,
) -> anyhow::Result<(oneshot::Sender<()>, std::thread::JoinHandle<()>)> {
    let (stop, mut stopped) = oneshot::channel::<()>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let thread = std::thread::Builder::new()
        .name("tokenmeter-stats".into())
        .spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = TcpListener::from_std(listener) else {
                    return;
                };
                let mut conns = JoinSet::new();
                loop {
                    let (stream, _) = tokio::select! {
                        _ = &mut stopped => break,
                        accepted = listener.accept() => match accepted {
                            Ok(x) => x,
                            Err(_) => {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                continue;
                            }
                        },
                    };
                    while conns.try_join_next().is_some() {}
                    let svc = hyper_util::service::TowerToHyperService::new(router.clone());
                    let acceptor = tls.as_ref().map(|t| t.acceptor());
                    conns.spawn(async move {
                        let mut builder = http1::Builder::new();
                        builder.timer(TokioTimer::new());
                        builder.header_read_timeout(Duration::from_secs(10));
                        match acceptor {
                            None => {
                                let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                            }
                            Some(acceptor) => {
                                let hs = tokio::time::timeout(
                                    Duration::from_secs(10),
                                    acceptor.accept(stream),
                                );
                                if let Ok(Ok(tls)) = hs.await {
                                    let io = TokioIo::new(tls);
                                    let _ = builder.serve_connection(io, svc).await;
                                }
                            }
                        }
                    });
                }
            });
        })?;
    Ok((stop, thread))
}
