//! Revocations in a store one process holds ([`RevocationStore`]): the same contract as Redis's.

use super::MemoryStore;
use crate::Result;
use crate::revocation::{Listed, Revocation, RevocationStore};
use crate::types::UserKey;
use async_trait::async_trait;
use std::collections::{BTreeMap, HashMap};

/// Revocations by principal (field → until, ms), and the registry (`<user>:<field>` → record).
#[derive(Debug, Default)]
pub(super) struct Held {
    by_user: HashMap<UserKey, HashMap<String, u64>>,
    registry: BTreeMap<String, String>,
}

impl Held {
    /// Whether `user` (or its token `token_id`) is revoked now.
    pub(super) fn refuses(&self, user: &UserKey, token_id: Option<&str>) -> bool {
        let Some(fields) = self.by_user.get(user) else { return false };
        let now = mcpfleet_core::time::epoch_ms();
        let live = |f: &str| fields.get(f).is_some_and(|until| *until > now);
        live("*") || token_id.is_some_and(|j| live(&Revocation::field(Some(j))))
    }
}

#[async_trait]
impl RevocationStore for MemoryStore {
    async fn revoke(&self, r: &Revocation) -> Result<()> {
        let mut g = self.lock();
        let field = Revocation::field(r.token_id.as_deref());
        g.revocations.by_user.entry(r.user.clone()).or_default().insert(field.clone(), r.until_ms);
        g.revocations.registry.insert(format!("{}:{field}", r.user.as_str()), r.record.clone());
        g.policy.announce(format!("{}{}", crate::REVOKE_NOTICE, r.user.as_str()));
        Ok(())
    }

    async fn lift(&self, user: &UserKey, token_id: Option<&str>) -> Result<bool> {
        let mut g = self.lock();
        let field = Revocation::field(token_id);
        let had = g.revocations.by_user.get_mut(user).and_then(|f| f.remove(&field)).is_some();
        g.revocations.registry.remove(&format!("{}:{field}", user.as_str()));
        g.policy.announce(format!("{}{}", crate::REVOKE_NOTICE, user.as_str()));
        Ok(had)
    }

    async fn revocations(&self) -> Result<Vec<Listed>> {
        let g = self.lock();
        Ok(g.revocations
            .registry
            .iter()
            .filter_map(|(entry, record)| {
                let (user, field) = entry.split_once(':')?;
                Some(Listed { user: user.to_owned(), field: field.to_owned(), record: record.clone() })
            })
            .collect())
    }
}
