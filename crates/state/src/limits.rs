//! The atomic primitives that limits are made of, kept next to the session records so that one store call admits
//! a request: a token bucket, a fixed-window counter and a capped set of leased slots, all under the user's hash
//! tag. The limits crate decides which of them apply to a request and what a refusal means; this module only
//! stores and counts.

use crate::types::{NewSession, SessionId, SessionInfo, UserKey};
use std::time::Duration;

/// A token bucket's parameters: it holds at most `capacity` tokens and gains `per_second` tokens a second.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketSpec {
    /// Which of the user's buckets: `tb` for the principal's, `tb:<peer>` for a peer's under `--auth none`.
    /// `[A-Za-z0-9_.:-]` only.
    pub name: String,
    pub capacity: f64,
    pub per_second: f64,
}

/// A fixed window: at most `limit` uses per `window`, the window starting at the first use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    /// Which counter (a tool name). `[A-Za-z0-9_.-]` only.
    pub name: String,
    pub limit: u64,
    pub window: Duration,
}

/// The user's capped sets of leased slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlotSet {
    /// Open SSE streams (GET).
    Streams,
    /// Tool calls in flight.
    Calls,
}

impl SlotSet {
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            Self::Streams => "cs",
            Self::Calls => "cc",
        }
    }
}

/// One slot in a capped set, held by `token` until released or until its lease runs out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotSpec {
    pub set: SlotSet,
    /// At most this many live slots; 0 means no cap (the slot is still leased, so it can be counted).
    pub cap: u64,
    pub token: String,
    pub ttl: Duration,
}

/// What admission does with the session the request names.
#[derive(Clone, Copy, Debug)]
pub enum SessionOp<'a> {
    /// Nothing (the request names no session).
    None,
    /// Checks it exists for this user and extends its idle TTL, like [`SessionStore::touch_session`](crate::SessionStore::touch_session).
    Touch(&'a SessionId),
    /// Creates it, unless the user already has `max_sessions` open (0: no cap).
    Create { id: &'a SessionId, session: &'a NewSession, max_sessions: u64 },
}

/// Everything one request needs admitted, checked and applied in one store call, in this order: the releases
/// (always applied), the bucket (a refusal writes nothing more), the session, then the slot and the window (taken
/// only if both are free).
#[derive(Clone, Debug)]
pub struct Admission<'a> {
    pub user: &'a UserKey,
    pub session: SessionOp<'a>,
    pub bucket: Option<&'a BucketSpec>,
    pub slot: Option<&'a SlotSpec>,
    pub window: Option<&'a WindowSpec>,
    /// Slots of the user's to free first (the ends of earlier calls, riding on this round trip). When `slot` is
    /// given, they must be of the same set.
    pub release: Option<(SlotSet, &'a [String])>,
    /// A task of the user's to read in the same round trip (a `tasks/get` poll: one round trip in all). It is read
    /// whatever the decision; the caller uses it only if admitted.
    pub read_task: Option<&'a crate::TaskKey>,
    /// Whether the user's sessions are counted for a cap. Only then does the store keep its index of them: a
    /// create with `max_sessions > 0` counts them whatever this says, and a touch refreshes the session's entry in
    /// the index only when this is set (a session opened while the cap was off enters the index on its first touch
    /// that extends its TTL). `true` by [`Admission::new`]; the limiter sets it from its session cap.
    pub count_sessions: bool,
    /// The id (`jti`) of the token the request came with, if it has one: a revocation of that one token refuses
    /// it ([`crate::RevocationStore`]).
    pub token_id: Option<&'a str>,
    /// The DPoP proof the request came with (its id, and how long to remember it): recorded in this round trip
    /// under the user's hash tag, and refused ([`Refusal::Replayed`]) if any replica recorded it before. Admissions
    /// with proofs are batched only with others with proofs (remembered as long).
    pub proof: Option<(&'a str, Duration)>,
}

impl<'a> Admission<'a> {
    /// An admission of `user` that checks nothing yet.
    #[must_use]
    pub fn new(user: &'a UserKey) -> Self {
        Self {
            user,
            session: SessionOp::None,
            bucket: None,
            slot: None,
            window: None,
            release: None,
            read_task: None,
            token_id: None,
            proof: None,
            count_sessions: true,
        }
    }
}

/// A bucket after a decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketReading {
    pub allowed: bool,
    /// Tokens left (after taking one, if allowed).
    pub tokens: f64,
    /// If refused: how long until a token is there. If allowed: how long until the bucket is full again.
    pub wait: Duration,
}

/// A window after a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowReading {
    /// Uses counted in the current window (including this one, if allowed).
    pub used: u64,
    /// How long until the window ends: always known on a refusal (for `Retry-After`); on an admission only where
    /// the store knows it without another command (the memory store; Redis reads it only to refuse).
    pub reset: Option<Duration>,
}

/// Why admission stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The bucket is empty (see the bucket reading).
    Bucket,
    /// `Touch`: no such session for this user.
    SessionNotFound,
    /// `Create`: the id is taken.
    SessionConflict,
    /// `Create`: the user already has this many sessions open.
    Sessions { open: u64 },
    /// The slot set is full.
    Slots { used: u64 },
    /// The window is used up (see the window reading).
    Window,
    /// The principal, or the token the request came with, is revoked ([`crate::RevocationStore`]): nothing was
    /// taken.
    Revoked,
    /// The DPoP proof the request came with was recorded before (a replay, on this replica or another): nothing
    /// was taken.
    Replayed,
}

/// The result of one admission.
#[derive(Clone, Debug, PartialEq)]
pub struct Admitted {
    /// `None` if everything was admitted (and applied).
    pub refused: Option<Refusal>,
    pub bucket: Option<BucketReading>,
    /// The touched session, when admitted.
    pub session: Option<SessionInfo>,
    /// Live slots in the set after the decision.
    pub slots_used: Option<u64>,
    pub window: Option<WindowReading>,
    /// The task asked for by [`Admission::read_task`] (`Some(None)`: no such task).
    pub task: Option<Option<crate::TaskView>>,
}

/// Token-bucket maths, shared by the in-memory store and the limits crate's local bucket (the Redis script does
/// the same in Lua). Time is whatever monotonic clock the caller uses, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenBucket {
    pub tokens: f64,
    pub updated: f64,
}

impl TokenBucket {
    /// A full bucket at time `now`.
    #[must_use]
    pub fn full(capacity: f64, now: f64) -> Self {
        Self { tokens: capacity, updated: now }
    }

    /// Refills for the time elapsed since the last update, then takes `cost` tokens if there are enough.
    pub fn take(&mut self, now: f64, capacity: f64, per_second: f64, cost: f64) -> BucketReading {
        let elapsed = (now - self.updated).max(0.0);
        let tokens = (self.tokens + elapsed * per_second).min(capacity);
        if tokens < cost {
            // Refused: nothing changes, so a refused flood does not push the refill back.
            return BucketReading { allowed: false, tokens, wait: secs((cost - tokens) / per_second) };
        }
        self.tokens = tokens - cost;
        self.updated = now;
        BucketReading { allowed: true, tokens: self.tokens, wait: secs((capacity - self.tokens) / per_second) }
    }
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_gives_its_capacity_then_its_rate() {
        let mut b = TokenBucket::full(3.0, 0.0);
        for left in [2.0, 1.0, 0.0] {
            let r = b.take(0.0, 3.0, 0.5, 1.0);
            assert!(r.allowed);
            assert!((r.tokens - left).abs() < 1e-9);
        }
        let r = b.take(0.0, 3.0, 0.5, 1.0);
        assert!(!r.allowed);
        assert_eq!(r.wait, Duration::from_secs(2));
        // 1.5 s later half a token is missing: 1 s to wait, and the refusal did not move the refill.
        let r = b.take(1.5, 3.0, 0.5, 1.0);
        assert!(!r.allowed);
        assert_eq!(r.wait, Duration::from_millis(500));
        assert!(b.take(2.0, 3.0, 0.5, 1.0).allowed);
        // Never more than the capacity, however long it rests.
        let r = b.take(1000.0, 3.0, 0.5, 1.0);
        assert!((r.tokens - 2.0).abs() < 1e-9);
        assert_eq!(r.wait, Duration::from_secs(2));
    }
}
