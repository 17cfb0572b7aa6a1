//! What the memory store keeps for the fleet as a whole: the policy version in force and the fleet's notice channel
//! ([`PolicyHeld`]), and the revocations ([`RevocationsHeld`]). The stores' calls are in `policy.rs` and
//! `revocation.rs`; this file imports neither them nor the store, so that the store's state can hold these.

use crate::policy::StoredPolicy;
use crate::revocation::Revocation;
use crate::types::{Ring, UserKey};
use std::collections::{BTreeMap, HashMap};
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
