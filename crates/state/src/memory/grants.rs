//! URL-mode grants in a store one process holds ([`GrantStore`]): the same contract as Redis's, each entry with its
//! expiry (what is held is `fleet::GrantsHeld`).

use super::MemoryStore;
use super::fleet::live;
use crate::Result;
use crate::grants::GrantStore;
use crate::types::UserKey;
use async_trait::async_trait;
use std::time::{Duration, Instant};

fn of(user: &UserKey, downstream: &str) -> (UserKey, String) {
    (user.clone(), downstream.to_owned())
}

#[async_trait]
impl GrantStore for MemoryStore {
    async fn grant(&self, user: &UserKey, downstream: &str) -> Result<Option<Vec<u8>>> {
        Ok(live(&mut self.lock().grants.grants, &of(user, downstream)))
    }

    async fn put_grant(&self, user: &UserKey, downstream: &str, sealed: &[u8], ttl: Duration) -> Result<()> {
        self.lock().grants.grants.insert(of(user, downstream), (sealed.to_vec(), Instant::now() + ttl));
        Ok(())
    }

    async fn drop_grant(&self, user: &UserKey, downstream: &str, sealed: Option<&[u8]>) -> Result<bool> {
        let mut g = self.lock();
        let key = of(user, downstream);
        match (live(&mut g.grants.grants, &key), sealed) {
            (Some(held), Some(want)) if held != want => Ok(false),
            (Some(_), _) => Ok(g.grants.grants.remove(&key).is_some()),
            (None, _) => Ok(false),
        }
    }

    async fn lock_grant(&self, user: &UserKey, downstream: &str, holder: &str, ttl: Duration) -> Result<bool> {
        let mut g = self.lock();
        let key = of(user, downstream);
        if live(&mut g.grants.locks, &key).is_some() {
            return Ok(false);
        }
        g.grants.locks.insert(key, (holder.to_owned(), Instant::now() + ttl));
        Ok(true)
    }

    async fn unlock_grant(&self, user: &UserKey, downstream: &str, holder: &str) -> Result<()> {
        let mut g = self.lock();
        let key = of(user, downstream);
        if live(&mut g.grants.locks, &key).as_deref() == Some(holder) {
            g.grants.locks.remove(&key);
        }
        Ok(())
    }

    async fn put_authorization(&self, id: &str, record: &str, ttl: Duration) -> Result<()> {
        self.lock().grants.authorizations.insert(id.to_owned(), (record.to_owned(), Instant::now() + ttl));
        Ok(())
    }

    async fn authorization(&self, id: &str) -> Result<Option<String>> {
        Ok(live(&mut self.lock().grants.authorizations, &id.to_owned()))
    }

    async fn take_authorization(&self, id: &str) -> Result<Option<String>> {
        let mut g = self.lock();
        let held = live(&mut g.grants.authorizations, &id.to_owned());
        g.grants.authorizations.remove(id);
        Ok(held)
    }
}
