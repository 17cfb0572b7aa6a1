//! The revocations a replica knows (the fleet's registry, read by its follower): refused by the limiter when the
//! store cannot decide, so that failing open never admits a principal known to be revoked.

use mcpfleet_state::UserKey;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// Revocations as a replica knows them: by principal, the token ids revoked (`None`: every token) and until when
/// (ms since the epoch).
pub type KnownRevoked = HashMap<UserKey, Vec<(Option<String>, u64)>>;

#[derive(Debug, Default)]
pub(crate) struct Revoked(Mutex<KnownRevoked>);

impl Revoked {
    pub(crate) fn set(&self, known: KnownRevoked) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = known;
    }

    /// Whether `user` (or its token `token_id`) is revoked now.
    pub(crate) fn refuses(&self, user: &UserKey, token_id: Option<&str>) -> bool {
        let now = mcpfleet_core::time::epoch_ms();
        let g = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        g.get(user)
            .is_some_and(|r| r.iter().any(|(j, until)| *until > now && (j.is_none() || j.as_deref() == token_id)))
    }
}
