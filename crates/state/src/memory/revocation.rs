//! Revocations in a store one process holds ([`RevocationStore`]): the same contract as Redis's.

use super::MemoryStore;
use crate::Result;
use crate::revocation::{Listed, Revocation, RevocationStore};
use crate::types::UserKey;
use async_trait::async_trait;

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
