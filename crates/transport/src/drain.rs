//! Request bodies that a refusal did not read are drained, not abandoned.
//!
//! A request refused before its body is read (413 for a declared size over the limit, 401/403 before the
//! body, 405, a limit) gets its answer while the client, or a proxy in front of us, is still sending the body.
//! If the server then closed the connection with unread bytes in its socket, the kernel would answer them with
//! a reset, which destroys the response in flight: behind nginx the client sees 502 instead of the refusal, and
//! nginx marks the replica down (`max_fails=1`), so a few anonymous oversized POSTs take every replica out.
//!
//! So every request body is wrapped in a [`DrainOnDrop`]: when it is dropped before its end, the rest is read
//! and thrown away in the background, while hyper writes the response, up to [`DRAIN_MAX_BYTES`] and for at
//! most [`DRAIN_MAX_TIME`]. A body within those bounds ends cleanly and the connection stays usable; a larger
//! or slower one is cut off after them (the refusal has long been written by then).

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// The most bytes of a refused request's body that are read and discarded.
pub const DRAIN_MAX_BYTES: u64 = 8 * 1024 * 1024;
/// The longest a refused request's body is read for.
pub const DRAIN_MAX_TIME: Duration = Duration::from_secs(10);

/// A request body that drains itself if dropped unfinished.
#[derive(Debug)]
pub(crate) struct DrainOnDrop {
    inner: Option<Incoming>,
    ended: bool,
}

impl DrainOnDrop {
    pub(crate) fn new(inner: Incoming) -> Self {
        Self { inner: Some(inner), ended: false }
    }
}

impl Body for DrainOnDrop {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let Some(inner) = self.inner.as_mut() else { return Poll::Ready(None) };
        let polled = Pin::new(inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.ended = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.as_ref().map(Body::size_hint).unwrap_or_default()
    }
}

impl Drop for DrainOnDrop {
    fn drop(&mut self) {
        let Some(body) = self.inner.take() else { return };
        if self.ended || body.is_end_stream() {
            return;
        }
        // A declared length over the bound: reading part of it would not save the response anyway.
        if body.size_hint().lower() > DRAIN_MAX_BYTES {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = tokio::time::timeout(DRAIN_MAX_TIME, drain(body)).await;
            });
        }
    }
}

/// Reads `body` to its end, or to [`DRAIN_MAX_BYTES`], throwing the data away.
async fn drain(mut body: Incoming) {
    let mut read = 0u64;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let Ok(frame) = frame else { return };
        if let Some(data) = frame.data_ref() {
            read += data.len() as u64;
            if read > DRAIN_MAX_BYTES {
                tracing::debug!(read, "refused request body larger than the drain bound: closing");
                return;
            }
        }
    }
}
