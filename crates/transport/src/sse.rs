//! SSE framing and the body of every SSE response.

use crate::AppState;
use crate::metrics::GaugeGuard;
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use mcpfleet_state::EventId;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One thing to write on an SSE connection.
#[derive(Debug, Clone)]
pub(crate) enum Frame {
    /// The first event of a stream: an id, the reconnect delay, and (from 2025-11-25 on) empty data.
    Priming { id: EventId, retry: Duration, data: bool },
    /// A committed message.
    Event { id: EventId, data: String },
    /// A message that could not be committed (the store failed): sent without an id, so it cannot be resumed.
    Unsequenced { data: String },
    /// A reconnect hint; the connection closes after it.
    Retry(Duration),
}

impl Frame {
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
}

struct BodyState {
    rx: mpsc::Receiver<Frame>,
    _open: GaugeGuard,
    _slot: Option<mcpfleet_limits::SlotGuard>,
    _cancel: Option<tokio_util::sync::DropGuard>,
    keep_alive: tokio::time::Interval,
    shutdown: CancellationToken,
    retry: Duration,
    done: bool,
}

/// An SSE response fed by `rx`, counted in `mcp_sse_streams_open{kind}` while its body lives. Idle connections get keep-alive comments; on shutdown the stream ends with a
/// `retry:` hint. The body ends when `rx` closes or yields [`Frame::Retry`].
pub(crate) fn response(app: &AppState, rx: mpsc::Receiver<Frame>, kind: &'static str, held: Held) -> Response {
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
        retry,
        done: false,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        let bytes = tokio::select! {
            biased;
            f = st.rx.recv() => match f {
                Some(f @ Frame::Retry(_)) => { st.done = true; f.encode() }
                Some(f) => f.encode(),
                None => return None,
            },
            () = st.shutdown.cancelled() => { st.done = true; Frame::Retry(st.retry).encode() }
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
