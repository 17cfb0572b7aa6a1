//! The open SSE streams of each principal on this replica ([`OpenStreams`]), so that a revocation closes them at
//! once: every stream's body watches its principal's token, and [`OpenStreams::close`] (the follower, on a
//! `revoke:<user>` announcement) cancels it. The connection then closes without a `retry:` hint; a client that
//! comes back is refused by its admission.

use mcpfleet_core::UserKey;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use tokio_util::sync::CancellationToken;

/// The principals with open streams here: a token each, and how many streams watch it.
#[derive(Debug, Default)]
pub struct OpenStreams {
    map: Mutex<HashMap<UserKey, (CancellationToken, usize)>>,
}

/// One stream's watch on its principal: cancelled when the principal is revoked; counted until it drops.
#[derive(Debug)]
pub(crate) struct StreamWatch {
    pub(crate) revoked: CancellationToken,
    user: UserKey,
    owner: Arc<OpenStreams>,
}

impl OpenStreams {
    /// A watch for a new stream of `user`.
    pub(crate) fn open(self: &Arc<Self>, user: &UserKey) -> StreamWatch {
        let mut g = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = g.entry(user.clone()).or_insert_with(|| (CancellationToken::new(), 0));
        entry.1 += 1;
        StreamWatch { revoked: entry.0.clone(), user: user.clone(), owner: self.clone() }
    }

    /// Closes every open stream of `user` here; returns how many there were.
    pub fn close(&self, user: &UserKey) -> usize {
        let mut g = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        match g.remove(user) {
            Some((token, n)) => {
                token.cancel();
                n
            }
            None => 0,
        }
    }
}

impl Drop for StreamWatch {
    fn drop(&mut self) {
        let mut g = self.owner.map.lock().unwrap_or_else(PoisonError::into_inner);
        // The entry may be a newer one (the old was closed): only the watch's own token's count goes down.
        if let Some(entry) = g.get_mut(&self.user)
            && entry.0.is_cancelled() == self.revoked.is_cancelled()
        {
            entry.1 = entry.1.saturating_sub(1);
            if entry.1 == 0 {
                g.remove(&self.user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closing_a_principal_cancels_its_streams_and_forgets_them() {
        let s = Arc::new(OpenStreams::default());
        let (alice, bob) = (UserKey::new("alice").expect("key"), UserKey::new("bob").expect("key"));
        let (a1, a2, b1) = (s.open(&alice), s.open(&alice), s.open(&bob));
        assert_eq!(s.close(&alice), 2);
        assert!(a1.revoked.is_cancelled() && a2.revoked.is_cancelled() && !b1.revoked.is_cancelled());
        let a3 = s.open(&alice);
        assert!(!a3.revoked.is_cancelled(), "a stream opened after the close has a fresh watch");
        drop((a1, a2));
        assert_eq!(s.close(&alice), 1, "the old watches did not count down the new entry");
        drop(b1);
        assert_eq!(s.close(&bob), 0, "the last watch gone, the entry is gone");
        drop(a3);
    }
}
