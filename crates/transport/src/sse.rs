//! SSE framing and the body of every SSE response.

use crate::AppState;
use crate::metrics::GaugeGuard;
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use mcpfleet_state::{EventId, UserKey};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

/// Most frames queued for one SSE connection whose client reads slower than the stream is written.
pub(crate) const QUEUED_FRAMES: usize = 256;
/// Most bytes of messages queued for one SSE connection. A message larger than this alone is queued only when the
/// queue is empty, so one stream never holds more than this, or one such message (docs/OPERATING.md#memory).
pub(crate) const QUEUED_BYTES: usize = 1024 * 1024;

/// The sending end of an SSE connection's queue: at most [`QUEUED_FRAMES`] frames and [`QUEUED_BYTES`] bytes wait
/// for a client that reads slowly. What a sender does when it is full is its own policy (drop the connection and let
/// the client resume from the log, drop a notification, or wait a bounded time).
#[derive(Clone, Debug)]
pub(crate) struct Live {
    tx: mpsc::Sender<Queued>,
    room: Arc<Semaphore>,
}

/// The receiving end, which [`response`] turns into the body.
#[derive(Debug)]
pub(crate) struct Feed(mpsc::Receiver<Queued>);

/// A frame and its share of the byte budget, given back when the body has taken it.
#[derive(Debug)]
struct Queued {
    frame: Frame,
    _room: OwnedSemaphorePermit,
}

/// A new connection queue.
pub(crate) fn channel() -> (Live, Feed) {
    let (tx, rx) = mpsc::channel(QUEUED_FRAMES);
    (Live { tx, room: Arc::new(Semaphore::new(QUEUED_BYTES)) }, Feed(rx))
}

impl Live {
    /// Queues `frame` if both budgets have room for it; never waits. False: full, or the client is gone.
    pub(crate) fn try_send(&self, frame: Frame) -> bool {
        let Ok(room) = self.room.clone().try_acquire_many_owned(frame.weight()) else { return false };
        self.tx.try_send(Queued { frame, _room: room }).is_ok()
    }

    /// Queues `frame`, waiting at most `wait` for room. False: still full then, or the client is gone.
    pub(crate) async fn send_timeout(&self, frame: Frame, wait: Duration) -> bool {
        let queued = async {
            let Ok(room) = self.room.clone().acquire_many_owned(frame.weight()).await else { return false };
            self.tx.send(Queued { frame, _room: room }).await.is_ok()
        };
        tokio::time::timeout(wait, queued).await.unwrap_or(false)
    }

    /// Completes when the client is gone (the body was dropped).
    pub(crate) async fn closed(&self) {
        self.tx.closed().await;
    }
}

/// One thing to write on an SSE connection.
#[derive(Debug, Clone)]
pub(crate) enum Frame {
    /// The first event of a stream: an id, the reconnect delay, and (from 2025-11-25 on) empty data.
    Priming { id: EventId, retry: Duration, data: bool },
    /// A committed message.
    Event { id: EventId, data: String },
    /// A message that could not be committed (the store failed): sent without an id, so it cannot be resumed.
    Unsequenced { data: String },
    /// The first event of a 2026-07-28 stream opened because its call ran long: empty data and no id (such a
    /// stream is never resumed), as the 2025-11-25 priming event is, so that a client or a proxy that waits for a
    /// first event sees one at once. An SSE client dispatches it as an empty message, which carries no JSON-RPC.
    Opening,
    /// A reconnect hint; the connection closes after it.
    Retry(Duration),
}

impl Frame {
    /// What the frame costs of [`QUEUED_BYTES`]: its message's length (at least 1, at most the whole budget).
    fn weight(&self) -> u32 {
        let len = match self {
            Self::Event { data, .. } | Self::Unsequenced { data } => data.len(),
            Self::Priming { .. } | Self::Retry(_) | Self::Opening => 1,
        };
        u32::try_from(len.clamp(1, QUEUED_BYTES)).unwrap_or(u32::MAX)
    }

    pub(crate) fn encode(&self) -> Bytes {
        match self {
            Self::Priming { id, retry, data: true } => {
                Bytes::from(format!("id: {id}\nretry: {}\ndata: \n\n", retry.as_millis()))
            }
            Self::Priming { id, retry, data: false } => {
                Bytes::from(format!("id: {id}\nretry: {}\n\n", retry.as_millis()))
            }
            Self::Event { id, data } => Bytes::from(format!("id: {id}\ndata: {}\n\n", one_line(data))),
            Self::Unsequenced { data } => Bytes::from(format!("data: {}\n\n", one_line(data))),
            Self::Opening => Bytes::from_static(b"data: \n\n"),
            Self::Retry(retry) => Bytes::from(format!("retry: {}\n\n", retry.as_millis())),
        }
    }
}

/// JSON never needs a raw newline; escape any that a serializer left, so one message stays one `data:` line.
fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains(['\n', '\r']) { s.replace('\n', "\\n").replace('\r', "\\r").into() } else { s.into() }
}

/// What an SSE body holds while it lives, and how it ends.
#[derive(Default)]
pub(crate) struct Held {
    /// The caller's stream slot (GET and listen streams), freed when the body drops.
    pub(crate) slot: Option<mcpfleet_limits::SlotGuard>,
    /// Fired when the body drops: the client closed the stream, which cancels its request (2026-07-28).
    pub(crate) cancel_on_drop: Option<tokio_util::sync::DropGuard>,
    /// The feeder ends the stream itself on shutdown (with a final response) instead of the body's `retry:`.
    pub(crate) feeder_handles_shutdown: bool,
    /// A 2025 `GET` stream: `notifications/tools/list_changed` when a policy version changes what its principal's
    /// plan lists.
    pub(crate) list: Option<crate::policy::listed::ListWatch>,
}

struct BodyState {
    rx: Feed,
    _open: GaugeGuard,
    _slot: Option<mcpfleet_limits::SlotGuard>,
    _cancel: Option<tokio_util::sync::DropGuard>,
    keep_alive: tokio::time::Interval,
    shutdown: CancellationToken,
    /// Cancelled when the stream's principal is revoked: the stream ends at once, without `retry:`.
    watch: crate::streams::StreamWatch,
    list: Option<crate::policy::listed::ListWatch>,
    retry: Duration,
    done: bool,
}

/// An SSE response of `user`'s fed by `rx`, counted in `mcp_sse_streams_open{kind}` while its body lives. Idle
/// connections get keep-alive comments; on shutdown the stream ends with a `retry:` hint. The body ends when `rx`
/// closes or yields [`Frame::Retry`], and at once when `user` is revoked.
pub(crate) fn response(app: &AppState, rx: Feed, kind: &'static str, held: Held, user: &UserKey) -> Response {
    let (keep_alive, retry) = (app.config.keep_alive, app.config.retry);
    // A feeder that ends the stream itself is waited for; otherwise the body ends it with `retry:`.
    let shutdown = if held.feeder_handles_shutdown { CancellationToken::new() } else { app.shutdown.clone() };
    let mut ka = tokio::time::interval_at(tokio::time::Instant::now() + keep_alive, keep_alive);
    ka.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let state = BodyState {
        rx,
        _open: app.metrics.stream_guard(kind),
        _slot: held.slot,
        _cancel: held.cancel_on_drop,
        keep_alive: ka,
        shutdown,
        watch: app.streams.open(user),
        list: held.list,
        retry,
        done: false,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        let bytes = tokio::select! {
            biased;
            f = st.rx.0.recv() => match f.map(|q| q.frame) {
                Some(f @ Frame::Retry(_)) => { st.done = true; f.encode() }
                Some(f) => f.encode(),
                None => return None,
            },
            () = st.shutdown.cancelled() => { st.done = true; Frame::Retry(st.retry).encode() }
            () = st.watch.revoked.cancelled() => return None,
            data = async {
                match st.list.as_mut() {
                    Some(l) => l.changed().await,
                    None => std::future::pending().await,
                }
            } => Frame::Unsequenced { data }.encode(),
            _ = st.keep_alive.tick() => Bytes::from_static(b": keep-alive\n\n"),
        };
        Some((Ok::<_, Infallible>(bytes), st))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store, no-transform"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(bytes: usize) -> Frame {
        Frame::Unsequenced { data: "x".repeat(bytes) }
    }

    #[tokio::test]
    async fn a_slow_reader_holds_at_most_the_frame_and_byte_budgets() {
        let (tx, mut rx) = channel();
        for _ in 0..QUEUED_FRAMES {
            assert!(tx.try_send(event(10)));
        }
        assert!(!tx.try_send(event(10)), "frame budget");
        assert!(rx.0.recv().await.is_some());
        assert!(tx.try_send(event(10)), "a frame taken by the body frees its place");

        let (tx, mut rx) = channel();
        assert!(tx.try_send(event(QUEUED_BYTES / 2)));
        assert!(tx.try_send(event(QUEUED_BYTES / 2 - 10)));
        assert!(!tx.try_send(event(11)), "byte budget");
        assert!(tx.try_send(event(10)), "what fits still goes");
        assert!(!tx.send_timeout(event(100), Duration::from_millis(20)).await, "waits, then gives up");
        drop(rx.0.recv().await);
        assert!(tx.send_timeout(event(100), Duration::from_millis(20)).await, "room again once the body took one");

        // A message larger than the whole budget goes only into an empty queue, alone.
        let (tx, mut rx) = channel();
        assert!(tx.try_send(event(10)));
        assert!(!tx.try_send(event(3 * QUEUED_BYTES)));
        drop(rx.0.recv().await);
        assert!(tx.try_send(event(3 * QUEUED_BYTES)));
        assert!(!tx.try_send(event(1)));
        drop(rx);
        assert!(!tx.try_send(event(1)), "the client is gone");
        tx.closed().await;
    }
}
