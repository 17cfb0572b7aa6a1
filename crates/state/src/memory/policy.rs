//! The policy document of a store one process holds ([`PolicyStore`]): the same contract as Redis's, so that the
//! contract suite checks both; the server itself reads a document from a file (`--policy FILE`) in that setup.

use super::{MemoryStore, MemorySubscription};
use crate::policy::{NewPolicy, PolicyStore, PutPolicy, StoredPolicy};
use crate::{Result, Subscription};
use async_trait::async_trait;
use tokio::sync::broadcast;

#[async_trait]
impl PolicyStore for MemoryStore {
    async fn policy_version(&self) -> Result<u64> {
        Ok(self.lock().policy.current.as_ref().map_or(0, |p| p.version))
    }

    async fn policy(&self) -> Result<Option<StoredPolicy>> {
        Ok(self.lock().policy.current.clone())
    }

    async fn put_policy(&self, new: &NewPolicy<'_>) -> Result<PutPolicy> {
        let mut g = self.lock();
        let held = &mut g.policy;
        let current = held.current.as_ref().map_or(0, |p| p.version);
        let version = new.version.unwrap_or(new.expected + 1);
        if current != new.expected || version <= current {
            return Ok(PutPolicy::Moved(current));
        }
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        held.current = Some(StoredPolicy {
            version,
            text: new.text.to_owned(),
            by: new.by.to_owned(),
            at_ms,
            summary: new.summary.to_owned(),
        });
        held.announce(format!("{}{version}", crate::POLICY_NOTICE));
        Ok(PutPolicy::Stored(version))
    }

    async fn subscribe_fleet(&self) -> Result<Box<dyn Subscription>> {
        let mut g = self.lock();
        let tx = g.policy.fleet.get_or_insert_with(|| broadcast::channel(256).0);
        Ok(Box::new(MemorySubscription(tx.subscribe())))
    }
}
