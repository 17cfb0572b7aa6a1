//! GET streams: the standalone stream of a session, and the resumption of any stream of a session by
//! `Last-Event-ID`, on whichever replica the GET lands. A resumer replays the log after the cursor for that one
//! stream, then follows it live through the session's doorbell until its final event. If the replica running
//! the call dies, its lease runs out and the resumer answers the request with [`code::REQUEST_LOST`].

use crate::error::TransportError;
use crate::sse::{self, Frame};
use crate::{AppState, code, random_token};
use mcpfleet_state::{
    Event, EventId, LeaseToken, OpenStream, Ring, STANDALONE_STREAM, SessionKey, StateError, StreamState, Subscription,
};
use serde_json::Value;

/// Events read from the log at once (a replay is sent in batches of this many).
const BATCH: usize = 256;
/// How long a GET stream waits for a client that stopped reading before it drops the connection.
const STALLED_CLIENT: std::time::Duration = std::time::Duration::from_secs(10);

struct Tail {
    app: AppState,
    key: SessionKey,
    stream: u64,
    cursor: EventId,
    holder: Option<LeaseToken>,
    sub: Box<dyn Subscription>,
    tx: sse::Live,
    /// Consecutive checks that found the call's lease expired.
    abandoned_seen: u8,
    /// When this resumer last failed to reach the store.
    last_store_error: Option<tokio::time::Instant>,
}

enum Step {
    More,
    Done,
}

/// Opens a GET stream: fresh (the standalone stream) or resuming from `cursor`. Errors that the client can act
/// on (session gone, cursor gone) are returned before any byte of the stream is written, and before anything is
/// written to the store. `priming_data` is false for clients older than 2025-11-25, which cannot take an event
/// with empty data: they get the priming id and retry without a `data:` line.
pub(crate) async fn open(
    app: &AppState,
    key: SessionKey,
    cursor: Option<EventId>,
    priming_data: bool,
) -> Result<sse::Feed, TransportError> {
    // Subscribe first, read second: nothing committed in between can be missed.
    let sub = app.store.subscribe(&key).await?;
    let (tx, rx) = sse::channel();
    let stream = cursor.map_or(STANDALONE_STREAM, |c| c.stream);
    let holder = (stream == STANDALONE_STREAM).then(|| LeaseToken(random_token()));
    // Validate a cursor first, so that a stale one is refused without side effects.
    let replay = match &cursor {
        Some(c) => Some(app.store.read_after(&key, stream, c, true, BATCH).await?),
        None => None,
    };
    let mut start = cursor;
    if let Some(token) = &holder {
        // Taking the standalone stream over ends any earlier holder's connection: each message goes to one stream.
        let open = OpenStream::Standalone { token: token.clone(), lease: app.config.lease_ttl };
        let (_, priming) = app.store.open_stream(&key, &open).await?;
        if cursor.is_none() {
            tx.try_send(Frame::Priming { id: priming, retry: app.config.retry, data: priming_data });
            start = Some(priming);
        }
    }
    let Some(start) = start else { return Err(TransportError::BadCursor) };
    let mut tail = Tail {
        app: app.clone(),
        key,
        stream,
        cursor: start,
        holder,
        sub,
        tx,
        abandoned_seen: 0,
        last_store_error: None,
    };
    if let Some((events, last)) = replay {
        tail.cursor = last;
        if let Step::Done = tail.deliver(events).await {
            return Ok(rx);
        }
    }
    tokio::spawn(tail.run());
    Ok(rx)
}

impl Tail {
    /// Writes replayed or live events; `Done` once the stream's final event went out or the client left.
    async fn deliver(&mut self, events: Vec<Event>) -> Step {
        for e in events {
            // A client that stops reading for this long is dropped; it resumes from its last id.
            if !e.data.is_empty()
                && !self.tx.send_timeout(Frame::Event { id: e.id, data: e.data }, STALLED_CLIENT).await
            {
                return Step::Done;
            }
            if e.is_final {
                return Step::Done;
            }
        }
        Step::More
    }

    async fn drain(&mut self) -> Result<Step, StateError> {
        loop {
            let (events, last) = self.app.store.read_after(&self.key, self.stream, &self.cursor, false, BATCH).await?;
            let moved = last != self.cursor;
            self.cursor = last;
            if let Step::Done = self.deliver(events).await {
                return Ok(Step::Done);
            }
            if !moved {
                return Ok(Step::More);
            }
        }
    }

    async fn run(mut self) {
        let poll_every = self.app.config.lease_ttl / 2;
        // The first poll comes half a lease after the initial check, never right after it: two checks that find a
        // lease expired are always that far apart.
        let mut poll = tokio::time::interval_at(tokio::time::Instant::now() + poll_every, poll_every);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Anything committed between the first read and the subscription going live is in the log. A POST
        // stream that already finished (its final event was at or before the cursor) ends at once.
        let mut step = match self.drain().await {
            Ok(Step::More) if self.holder.is_none() => self.check_owner().await,
            other => other,
        };
        loop {
            match step {
                Ok(Step::Done) => return,
                Ok(Step::More) => {}
                Err(StateError::SessionNotFound) => return,
                Err(StateError::CursorGone) => {
                    // Events were trimmed under us: say so and end, the client restarts.
                    self.tx.try_send(Frame::Retry(self.app.config.retry));
                    return;
                }
                Err(e) => {
                    self.store_failed();
                    tracing::warn!(error = %e, "stream read failed; the next ring or poll retries");
                }
            }
            step = tokio::select! {
                () = self.tx.closed() => return,
                ring = self.sub.recv() => match ring {
                    Some(Ring::Event(k)) if k == self.stream => self.drain().await,
                    Some(Ring::Lagged) => self.drain().await,
                    Some(Ring::Closed) | None => return,
                    // Takeover rings of two GETs racing can arrive in either order: the store says who holds it.
                    Some(Ring::Takeover(t)) if self.holder.as_ref().is_some_and(|h| h.0 != t) => self.check_owner().await,
                    Some(_) => Ok(Step::More),
                },
                _ = poll.tick() => self.check_owner().await,
            };
        }
    }

    /// Periodic check, which also drains the log in case a ring was lost: the standalone holder renews its
    /// claim; a POST-stream resumer checks that the call's replica is alive and answers the request itself if it
    /// is not.
    async fn check_owner(&mut self) -> Result<Step, StateError> {
        let store = self.app.store.clone();
        if let Some(token) = &self.holder {
            // The log is read only if it may hold what a lost ring would have announced: most polls are one
            // round trip (issue 32: an open stream's cost at rest).
            let ttl = self.app.config.lease_ttl;
            return match store.renew_and_peek(&self.key, self.stream, token, ttl, &self.cursor).await? {
                Some(true) => self.drain().await,
                Some(false) => Ok(Step::More),
                None => {
                    self.tx.try_send(Frame::Retry(self.app.config.retry));
                    Ok(Step::Done)
                }
            };
        }
        // A store error propagates to `run`, which records it (`store_failed`).
        let state = store.stream_state(&self.key, self.stream).await?;
        if !matches!(state, StreamState::Abandoned { .. }) {
            self.abandoned_seen = 0;
        }
        match state {
            StreamState::Running => self.drain().await,
            // The final event is committed: deliver whatever is left of the stream, then end it.
            StreamState::Finished => self.drain().await.map(|_| Step::Done),
            // The call's replica stopped renewing. Declare the call lost only on the second check in a row, and not
            // within a lease of this resumer's own last store failure: after an outage the replica's renewer must
            // get the chance to renew before anyone gives up on it.
            StreamState::Abandoned { request_id } => {
                // Reading may work while writing does not (the replica could not renew either): probe with a write
                // of our own, which also keeps the session alive, so that such an outage counts as a store error.
                if store.touch_session(&self.key).await?.is_none() {
                    return Ok(Step::Done);
                }
                if !self.may_abandon() {
                    return self.drain().await;
                }
                let id: Value = serde_json::from_str(&request_id).unwrap_or(Value::Null);
                let msg = crate::jsonrpc::error(
                    Some(&id),
                    crate::jsonrpc::error_object(
                        code::REQUEST_LOST,
                        "the server handling this request stopped before it answered; send the request again",
                        None,
                    ),
                );
                store.abandon_stream(&self.key, self.stream, &msg.to_string()).await?;
                self.drain().await
            }
        }
    }

    fn store_failed(&mut self) {
        self.abandoned_seen = 0;
        self.last_store_error = Some(tokio::time::Instant::now());
    }

    fn may_abandon(&mut self) -> bool {
        self.abandoned_seen = self.abandoned_seen.saturating_add(1);
        let calm = self.last_store_error.is_none_or(|t| t.elapsed() >= self.app.config.lease_ttl);
        self.abandoned_seen >= 2 && calm
    }
}
