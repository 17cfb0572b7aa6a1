//! URL-mode grants in Redis ([`crate::GrantStore`]): `{u:<user>}:dg:<downstream>` (the sealed grant, a string with
//! a TTL), `{u:<user>}:dgl:<downstream>` (its refresh lock, `SET NX PX`), `{az:<id>}` (an authorization in
//! progress; taken with `GETDEL`).

use super::RedisStore;
use super::codec::{cat, int};
use crate::Result;
use crate::grants::GrantStore;
use crate::types::UserKey;
use async_trait::async_trait;
use std::time::Duration;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl RedisStore {
    fn grant_key(&self, user: &UserKey, downstream: &str, kind: &str) -> String {
        cat(&[&self.user_base(user), kind, downstream])
    }

    fn authorization_key(&self, id: &str) -> String {
        cat(&[&self.inner.cfg.prefix, "{az:", id, "}"])
    }

    async fn compare_delete(&self, key: &str, value: &[u8]) -> Result<bool> {
        let mut inv = self.inner.scripts.grant.key(key);
        inv.arg(value);
        Ok(int(&self.run_pooled("grant", inv).await?)? == 1)
    }
}

#[async_trait]
impl GrantStore for RedisStore {
    async fn grant(&self, user: &UserKey, downstream: &str) -> Result<Option<Vec<u8>>> {
        let key = self.grant_key(user, downstream, ":dg:");
        self.query("grant", redis::cmd("GET").arg(&key)).await
    }

    async fn put_grant(&self, user: &UserKey, downstream: &str, sealed: &[u8], ttl: Duration) -> Result<()> {
        let key = self.grant_key(user, downstream, ":dg:");
        let () = self.query("grant", redis::cmd("SET").arg(&key).arg(sealed).arg("PX").arg(ms(ttl))).await?;
        self.durable(&key).await
    }

    async fn drop_grant(&self, user: &UserKey, downstream: &str, sealed: Option<&[u8]>) -> Result<bool> {
        let key = self.grant_key(user, downstream, ":dg:");
        self.compare_delete(&key, sealed.unwrap_or_default()).await
    }

    async fn lock_grant(&self, user: &UserKey, downstream: &str, holder: &str, ttl: Duration) -> Result<bool> {
        let key = self.grant_key(user, downstream, ":dgl:");
        let set: Option<String> =
            self.query("grant", redis::cmd("SET").arg(&key).arg(holder).arg("NX").arg("PX").arg(ms(ttl))).await?;
        Ok(set.is_some())
    }

    async fn unlock_grant(&self, user: &UserKey, downstream: &str, holder: &str) -> Result<()> {
        let key = self.grant_key(user, downstream, ":dgl:");
        self.compare_delete(&key, holder.as_bytes()).await.map(drop)
    }

    async fn put_authorization(&self, id: &str, record: &str, ttl: Duration) -> Result<()> {
        let key = self.authorization_key(id);
        let () = self.query("grant", redis::cmd("SET").arg(&key).arg(record).arg("PX").arg(ms(ttl))).await?;
        Ok(())
    }

    async fn authorization(&self, id: &str) -> Result<Option<String>> {
        self.query("grant", redis::cmd("GET").arg(self.authorization_key(id))).await
    }

    async fn take_authorization(&self, id: &str) -> Result<Option<String>> {
        self.query("grant", redis::cmd("GETDEL").arg(self.authorization_key(id))).await
    }
}
