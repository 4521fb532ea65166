//! A client's request body as the handler reads it: from hyper's server, or read by the proxy's
//! own HTTP/1 front (`front_h1.rs`), whole or still arriving.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::sync::oneshot;

use super::body::BoxError;

/// The request body handed to `forward::handle`.
pub enum ClientBody {
    /// Read by hyper's server (connections the front handed over).
    Hyper(Incoming),
    /// Read whole by the front; `None` once yielded.
    Read(Option<Bytes>),
    /// Being read by the front, which sends it whole when its last byte arrives. Dropped unsent
    /// when the client closes first, which reads as an error, as hyper's body does.
    Arriving(oneshot::Receiver<Bytes>),
}

/// The client closed its connection before its body's end.
#[derive(Debug, thiserror::Error)]
#[error("the client closed the connection before the request body's end")]
struct Incomplete;

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let me = self.get_mut();
        match me {
            ClientBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            ClientBody::Read(b) => Poll::Ready(b.take().map(|d| Ok(Frame::data(d)))),
            ClientBody::Arriving(rx) => match Pin::new(rx).poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(d)) => {
                    *me = ClientBody::Read(None);
                    Poll::Ready(Some(Ok(Frame::data(d))))
                }
                Poll::Ready(Err(_)) => {
                    *me = ClientBody::Read(None);
                    Poll::Ready(Some(Err(Box::new(Incomplete))))
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper(b) => b.is_end_stream(),
            ClientBody::Read(b) => b.is_none(),
            ClientBody::Arriving(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Hyper(b) => b.size_hint(),
            ClientBody::Read(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ClientBody::Read(None) => SizeHint::with_exact(0),
            ClientBody::Arriving(_) => SizeHint::default(),
        }
    }
}
