//! What the memory store keeps for the fleet as a whole: the policy version in force and the fleet's notice channel
//! ([`PolicyHeld`]), the revocations ([`RevocationsHeld`]) and the URL-mode grants ([`GrantsHeld`]). The stores'
//! calls are in `policy.rs`, `revocation.rs` and `grants.rs`; this file imports neither them nor the store, so that
//! the store's state can hold these.

use crate::policy::StoredPolicy;
use crate::revocation::Revocation;
use crate::types::{Ring, UserKey};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;
use tokio::sync::broadcast;

/// The version in force and the fleet's notice channel.
#[derive(Debug, Default)]
pub(super) struct PolicyHeld {
    pub(super) current: Option<StoredPolicy>,
    pub(super) fleet: Option<broadcast::Sender<Ring>>,
}

impl PolicyHeld {
    /// Rings the fleet's notice channel, if anyone listens.
    pub(super) fn announce(&self, message: String) {
        if let Some(tx) = &self.fleet {
            let _ = tx.send(Ring::Notice(message));
        }
    }
}

/// Revocations by principal (field → until, ms), and the registry (`<user>:<field>` → record).
#[derive(Debug, Default)]
pub(super) struct RevocationsHeld {
    pub(super) by_user: HashMap<UserKey, HashMap<String, u64>>,
    pub(super) registry: BTreeMap<String, String>,
}

impl RevocationsHeld {
    /// Whether `user` (or its token `token_id`) is revoked now.
    pub(super) fn refuses(&self, user: &UserKey, token_id: Option<&str>) -> bool {
        let Some(fields) = self.by_user.get(user) else { return false };
        let now = mcpfleet_core::time::epoch_ms();
        let live = |f: &str| fields.get(f).is_some_and(|until| *until > now);
        live("*") || token_id.is_some_and(|j| live(&Revocation::field(Some(j))))
    }
}

/// What the memory store holds of grants: by (user, downstream), the sealed grant and its lock; by id, the
/// authorizations in progress. Each value with the instant it expires.
#[derive(Debug, Default)]
pub(super) struct GrantsHeld {
    pub(super) grants: HashMap<(UserKey, String), (Vec<u8>, Instant)>,
    pub(super) locks: HashMap<(UserKey, String), (String, Instant)>,
    pub(super) authorizations: HashMap<String, (String, Instant)>,
}

/// The value of `map` at `key` if it has not expired (an expired one is dropped).
pub(super) fn live<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, (V, Instant)>, key: &K) -> Option<V>
where
    V: Clone,
{
    match map.get(key) {
        Some((v, until)) if *until > Instant::now() => Some(v.clone()),
        Some(_) => {
            map.remove(key);
            None
        }
        None => None,
    }
}
