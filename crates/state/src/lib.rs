//! mcpfleet-state owns everything a session leaves behind between two HTTP requests: the session record, the
//! per-session event log used to resume SSE streams, the in-flight leases, the routing of messages between
//! replicas (responses to server→client requests, cancellations, notifications and the termination broadcast),
//! the atomic counters that limits are made of (token buckets, fixed windows, leased slots), under the same
//! per-user hash tag so that one call admits a request, and what the stateless generation keeps between requests:
//! idempotency records, each principal's notice channel, and durable tasks with their work queue.
//!
//! Two implementations sit behind the [`Store`] trait: [`RedisStore`], the production one that lets any replica
//! answer any request, and [`MemoryStore`], the embedded default for a single process. One contract suite
//! (`tests/contract.rs`) runs against both.
//!
//! This crate must not depend on axum, HTTP types, auth or tools. It stores opaque strings; the transport decides
//! what they mean.

mod error;
pub mod eviction;
mod grants;
pub mod layout;
mod limits;
mod memory;
mod metrics;
mod policy;
mod redis;
mod revocation;
mod stateless;
mod tasks;
mod types;

pub use error::StateError;
pub use grants::GrantStore;
pub use limits::{
    Admission, Admitted, BucketReading, BucketSpec, Refusal, SessionOp, SlotSet, SlotSpec, TokenBucket, WindowReading,
    WindowSpec,
};
pub use memory::MemoryStore;
pub use metrics::StoreMetrics;
pub use policy::{NewPolicy, POLICY_NOTICE, PolicyStore, PutPolicy, StoredPolicy};
pub use redis::{RedisConfig, RedisStore, RedisTopology};
pub use revocation::{Listed, REVOKE_NOTICE, Revocation, RevocationStore};
pub use stateless::{Claim, ClaimSpec, IdempotencyKey};
pub use tasks::{
    AfterTake, Asked, CancelOutcome, NewTask, QueueStats, Queued, Requeue, RunCheck, TaskEnd, TaskId, TaskKey,
    TaskStatus, TaskStore, TaskView, TaskWork, UpdateOutcome,
};
pub use types::{
    AppendOptions, Delivery, EndedSession, Event, EventId, LeaseToken, NewSession, OpenStream, Ring, SessionId,
    SessionInfo, SessionKey, StreamState, UserKey,
};

use async_trait::async_trait;
use std::time::Duration;

/// Result type of every store call.
pub type Result<T, E = StateError> = std::result::Result<T, E>;

/// The stream number of a session's standalone (GET) stream. POST streams are numbered from 1.
pub const STANDALONE_STREAM: u64 = 0;

/// Session records: the per-request touch that also checks ownership, and termination. A session is created by
/// an admission ([`LimitStore::admit`] with [`SessionOp::Create`]), which checks the principal's session cap in the
/// same round trip.
#[async_trait]
pub trait SessionStore: Send + Sync + std::fmt::Debug {
    /// Checks that the session exists for this user and extends its idle TTL (and its event log's).
    /// `None` means unknown, ended, expired or owned by another user: the caller cannot tell which.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn touch_session(&self, key: &SessionKey) -> Result<Option<SessionInfo>>;

    /// Sets the session's minimum log level (`logging/setLevel`). Returns false if the session is gone.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn set_log_level(&self, key: &SessionKey, level: &str) -> Result<bool>;

    /// Ends the session for the whole fleet: removes its record, log and leases and rings [`Ring::Closed`]; says
    /// how long it lasted. `None` if there was no such session for this user.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn delete_session(&self, key: &SessionKey) -> Result<Option<EndedSession>>;
}

/// The per-session event log behind resumable SSE streams.
#[async_trait]
pub trait EventStore: Send + Sync + std::fmt::Debug {
    /// Opens a stream and commits its priming event. A POST stream gets the next stream number and a lease that
    /// its replica must renew; the standalone stream is number 0, and opening it takes it over from any earlier holder.
    ///
    /// # Errors
    /// [`StateError::SessionNotFound`] or a store failure.
    async fn open_stream(&self, key: &SessionKey, open: &OpenStream) -> Result<(u64, EventId)>;

    /// Commits one event to a stream and rings the session's doorbell. The id is valid only once this returns.
    ///
    /// # Errors
    /// [`StateError::SessionNotFound`], [`StateError::StreamFinished`] if the stream already has its final event,
    /// or a store failure.
    async fn append(&self, key: &SessionKey, stream: u64, data: &str, opts: &AppendOptions) -> Result<EventId>;

    /// Renews a stream's lease, and with it the session's idle TTL: a live stream is activity. Returns false if
    /// the stream is finished, the session is gone, or (for the standalone stream) another holder took it over.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn renew_lease(&self, key: &SessionKey, stream: u64, token: &LeaseToken, ttl: Duration) -> Result<bool>;

    /// Renews a stream's lease as [`SessionStore::renew_lease`] does and, in the same round trip, says whether the
    /// session's log may hold an entry after `cursor` (of any stream): `None` if the lease was not renewed,
    /// `Some(false)` if the log surely holds nothing after `cursor`. The holder of the standalone stream polls
    /// with it and reads the log only when it may have missed something (an open stream's cost at rest: issue
    /// 32). A store may always answer `Some(true)`; the default does.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn renew_and_peek(
        &self,
        key: &SessionKey,
        stream: u64,
        token: &LeaseToken,
        ttl: Duration,
        cursor: &EventId,
    ) -> Result<Option<bool>> {
        let _ = cursor;
        Ok(self.renew_lease(key, stream, token, ttl).await?.then_some(true))
    }

    /// Reads up to `limit` entries of the session log after `cursor`, keeping only those of `stream`. Returns the
    /// events and the last id scanned, which is the cursor for the next read.
    ///
    /// # Errors
    /// [`StateError::CursorGone`] if `cursor` is no longer retained (trimmed, expired, or never was an event of
    /// `stream` when `check_stream` is set), [`StateError::SessionNotFound`], or a store failure.
    async fn read_after(
        &self,
        key: &SessionKey,
        stream: u64,
        cursor: &EventId,
        check_stream: bool,
        limit: usize,
    ) -> Result<(Vec<Event>, EventId)>;

    /// Whether a POST stream is finished, still held by a live lease, or abandoned (its lease expired without a
    /// final event, because its replica died).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn stream_state(&self, key: &SessionKey, stream: u64) -> Result<StreamState>;

    /// Commits `data` as the final event of an abandoned stream. Does nothing and returns `None` if the stream
    /// finished or its lease is alive again; exactly one caller wins.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn abandon_stream(&self, key: &SessionKey, stream: u64, data: &str) -> Result<Option<EventId>>;
}

/// A subscription to one session's doorbell. Created subscribed: a ring published after
/// [`Router::subscribe`] returns is never missed, except across a store reconnect, which yields [`Ring::Lagged`].
#[async_trait]
pub trait Subscription: Send + std::fmt::Debug {
    /// The next ring, or `None` once the store shuts down.
    async fn recv(&mut self) -> Option<Ring>;
}

/// Message routing between replicas.
#[async_trait]
pub trait Router: Send + Sync + std::fmt::Debug {
    /// Subscribes to the session's doorbell.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn subscribe(&self, key: &SessionKey) -> Result<Box<dyn Subscription>>;

    /// Stores a client's response to a pending server→client request and wakes the waiting replica.
    /// Returns false if no such request is pending in this session.
    ///
    /// # Errors
    /// [`StateError::SessionNotFound`] or a store failure.
    async fn deliver_response(&self, key: &SessionKey, request_id: &str, message: &str) -> Result<Delivery>;

    /// Takes a delivered response, once.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn take_response(&self, key: &SessionKey, request_id: &str) -> Result<Option<String>>;

    /// Stops waiting for a server→client request (timeout or cancellation): a later response is refused.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn forget_pending(&self, key: &SessionKey, request_id: &str) -> Result<()>;

    /// Records a client's cancellation of one of its requests and rings it to whichever replica runs it.
    /// Returns false if the session is gone.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn cancel_request(&self, key: &SessionKey, request_id: &str) -> Result<bool>;

    /// Whether a cancellation was recorded for this request (read after subscribing, to close the race).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn is_cancelled(&self, key: &SessionKey, request_id: &str) -> Result<bool>;

    /// Subscribes to the principal's notice channel: every [`Router::publish_user`] for `user`, from any replica,
    /// arrives as [`Ring::Notice`]. Delivery is at most once (a reconnect yields [`Ring::Lagged`]).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn subscribe_user(&self, user: &UserKey) -> Result<Box<dyn Subscription>>;

    /// Publishes `message` (a JSON-RPC notification) to every subscriber of the principal's notice channel.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn publish_user(&self, user: &UserKey, message: &str) -> Result<()>;

    /// Answers whether the store is reachable within its deadline.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn ping(&self) -> Result<()>;

    /// The declarations of the Redis layout ([`layout`]) of the replicas with a live membership record (`None` for
    /// one that records none: a build from before declarations). Empty for a store one process holds.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn fleet_layouts(&self) -> Result<Vec<Option<String>>> {
        Ok(Vec::new())
    }

    /// Renews `replica`'s declaration of `fact` (a fixed name, like `skills`) as `value` for `ttl` (a zero `ttl`
    /// withdraws it), and returns the value of every replica with a live declaration of it, this one's included,
    /// in no order. A store one process holds answers this replica's value alone.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn declare(&self, fact: &str, replica: &str, value: &str, ttl: Duration) -> Result<Vec<String>> {
        let _ = (fact, replica);
        Ok(if ttl.is_zero() { Vec::new() } else { vec![value.to_owned()] })
    }

    /// The `maxmemory-policy` of every node that holds keys (each distinct value once; `INFO memory` on Redis,
    /// every master of a cluster). Empty for a store that evicts nothing (the in-memory store). See
    /// [`eviction`].
    ///
    /// # Errors
    /// A store failure or timeout; `NOPERM` when the ACL user may not run `INFO`.
    async fn eviction_policies(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}

/// The counters limits are made of. The limits crate decides what they mean.
#[async_trait]
pub trait LimitStore: Send + Sync + std::fmt::Debug {
    /// Checks and applies everything one request needs, atomically and in one round trip (see [`Admission`]).
    ///
    /// # Errors
    /// A store failure or timeout; nothing is applied then (or, after a timeout, possibly all of it).
    async fn admit(&self, admission: &Admission<'_>) -> Result<Admitted>;

    /// Extends a slot's lease. Returns false if the slot is gone (released, or its lease ran out).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn renew_slot(&self, user: &UserKey, set: SlotSet, token: &str, ttl: Duration) -> Result<bool>;

    /// Frees slots of one set (and drops the set's expired ones).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn release_slots(&self, user: &UserKey, set: SlotSet, tokens: &[String]) -> Result<()>;

    /// Gives back one use of a window (a call admitted, then refused before it ran).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn refund_window(&self, user: &UserKey, name: &str) -> Result<()>;

    /// Leases up to `want` uses of a window shared by a tenant's principals (`name`, `limit` uses per `window`),
    /// never more than the window has left: the uses leased, and how long until the window ends. The tenant's
    /// counter is under a hash tag of its own (`{t:<hash of tenant>}`), never on a request's round trip: a replica
    /// leases a slice and spends it locally (the limits crate's `TenantLeases`).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn lease_window(
        &self,
        tenant: &str,
        name: &str,
        want: u64,
        limit: u64,
        window: Duration,
    ) -> Result<(u64, Duration)>;

    /// Fleet membership: renews `replica`'s record for `ttl` (a zero `ttl` removes it: the replica leaves) and
    /// returns how many replicas have a live record. A store one process holds counts that process alone.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn heartbeat(&self, replica: &str, ttl: Duration) -> Result<u64> {
        let _ = (replica, ttl);
        Ok(1)
    }
}

/// Idempotency records: a call re-issued with the same key runs once, and every repeat gets the first result.
#[async_trait]
pub trait IdempotencyStore: Send + Sync + std::fmt::Debug {
    /// Claims the record for a call, atomically: [`Claim::Run`] makes the caller its runner (with a lease),
    /// [`Claim::Done`] returns the stored result, [`Claim::Running`] says another call holds it, and
    /// [`Claim::Mismatch`] says the key was used with other arguments.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn claim(&self, key: &IdempotencyKey, spec: &ClaimSpec<'_>) -> Result<Claim>;

    /// Extends a running claim. Returns false if the claim is no longer the caller's.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn renew_claim(&self, key: &IdempotencyKey, token: &str, lease: Duration) -> Result<bool>;

    /// Stores the result of the call for `ttl`. Returns false (and stores nothing) if the claim is no longer the
    /// caller's.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn complete_claim(&self, key: &IdempotencyKey, token: &str, result: &str, ttl: Duration) -> Result<bool>;

    /// Drops a running claim (the call was cancelled or refused), so that a repeat runs.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn release_claim(&self, key: &IdempotencyKey, token: &str) -> Result<()>;
}

/// Everything the transport needs from shared state.
pub trait Store:
    SessionStore
    + EventStore
    + Router
    + LimitStore
    + IdempotencyStore
    + TaskStore
    + PolicyStore
    + RevocationStore
    + GrantStore
{
}
impl<
    T: SessionStore
        + EventStore
        + Router
        + LimitStore
        + IdempotencyStore
        + TaskStore
        + PolicyStore
        + RevocationStore
        + GrantStore,
> Store for T
{
}
