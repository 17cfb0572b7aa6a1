//! The lanes' data (issue 32): what a batch of admissions shares ([`Shared`]), each admission's own part
//! ([`Entry`]), and the lanes gathering on this replica ([`Lanes`]). How a batch forms and goes to Redis is
//! [`super::batch`]'s; this file knows nothing of the store.

use crate::Result;
use redis::Value;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use tokio::sync::oneshot;

/// At most this many admissions in one `admit.lua` call (about 30k Redis instructions each: a batch blocks Redis
/// for well under a millisecond).
pub(super) const MAX_BATCH: usize = 32;

/// The values `admit.lua` returns for each admission: nine, or six when the protocol version, the capabilities and
/// the window's end are all empty (`SHORT_REPLY_LEN`).
pub(super) const REPLY_LEN: usize = 9;
pub(super) const SHORT_REPLY_LEN: usize = 6;

/// What a batch's admissions share: the keys and arguments `admit.lua` takes once.
pub(super) struct Shared {
    /// Every shared key and argument, end to end: the lane's name.
    pub(super) lane: String,
    /// The bucket, the slot set, the window, the revocations and, when the user's sessions are counted, the session
    /// index.
    pub(super) keys: Vec<String>,
    /// Capacity, per second, slot cap, slot ttl (ms), window limit, window (ms) (`''` for what is off), and the
    /// token's revocation field (`j:<jti>`, or `-`).
    pub(super) args: [String; 7],
    /// How long to remember the DPoP proofs of the lane's admissions (ms): set for a lane of admissions that each
    /// carry one (one principal's, with the same `--dpop-max-age`), none for the others.
    pub(super) proof_ttl: Option<u64>,
}

impl Shared {
    pub(super) fn new(keys: Vec<String>, args: [String; 7], proof_ttl: Option<u64>) -> Self {
        let mut lane = String::with_capacity(
            keys.iter().map(|k| k.len() + 1).sum::<usize>() + args.iter().map(|a| a.len() + 1).sum::<usize>() + 24,
        );
        for part in keys.iter().chain(args.iter()) {
            lane.push_str(part);
            // Neither a key nor an argument holds a NUL: the parts cannot run into each other.
            lane.push('\0');
        }
        // Admissions with proofs ride together, apart from those without.
        if let Some(ttl) = proof_ttl {
            lane.push_str(&ttl.to_string());
        }
        Self { lane, keys, args, proof_ttl }
    }
}

/// One admission's own part: its operation, its session's keys and its arguments, and the releases it carries.
pub(super) struct Entry {
    /// `''`, `touch`, `tap` or `create`.
    pub(super) op: &'static str,
    pub(super) sid: String,
    /// The slot's token (`''` when there is no slot).
    pub(super) token: String,
    /// The session's keys (session, events, leases) for a touch or a create.
    pub(super) keys: Option<[String; 3]>,
    /// The replay key of the DPoP proof the request came with (its lane's `proof_ttl` says how long to keep it).
    pub(super) proof: Option<String>,
    /// A create's max sessions, idle ttl (ms), protocol version and capabilities.
    pub(super) create: Option<(u64, u64, String, String)>,
    pub(super) releases: Vec<String>,
}

pub(super) struct Waiter {
    pub(super) entry: Entry,
    pub(super) tx: oneshot::Sender<Result<Vec<Value>>>,
}

/// The lanes gathering on this replica: a lane exists from its first admission's arrival until that admission has
/// let the tasks that were ready run (one yield), no longer.
#[derive(Default)]
pub(super) struct Lanes {
    /// Each open lane's admissions that joined it, by lane name ([`Shared::lane`]).
    map: Mutex<HashMap<String, Vec<Waiter>>>,
}

impl Lanes {
    pub(super) fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Waiter>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes the lane: what joined it.
    pub(super) fn close(&self, lane: &str) -> Vec<Waiter> {
        self.lock().remove(lane).unwrap_or_default()
    }
}
