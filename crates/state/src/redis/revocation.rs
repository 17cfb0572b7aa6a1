//! Revocations in Redis ([`crate::RevocationStore`]): the principal's hash `{u:<user>}:rv` (read by `admit.lua`),
//! and the fleet's registry `{fleet}:revoked` with its announcement on `{fleet}:nb`.

use super::RedisStore;
use super::codec::{cat, int};
use crate::Result;
use crate::revocation::{Listed, Revocation, RevocationStore};
use crate::types::UserKey;
use async_trait::async_trait;
use std::collections::HashMap;

impl RedisStore {
    fn registry_keys(&self) -> (String, String) {
        let p = &self.inner.cfg.prefix;
        (cat(&[p, "{fleet}:revoked"]), cat(&[p, "{fleet}:nb"]))
    }

    async fn announce(&self, entry: &str, record: &str, user: &UserKey) -> Result<()> {
        let (registry, channel) = self.registry_keys();
        let mut inv = self.inner.scripts.revoked.key(&registry);
        inv.key(&channel).arg(entry).arg(record).arg(user.as_str());
        self.run_pooled("revoked", inv).await?;
        Ok(())
    }
}

#[async_trait]
impl RevocationStore for RedisStore {
    async fn revoke(&self, r: &Revocation) -> Result<()> {
        let key = cat(&[&self.user_base(&r.user), ":rv"]);
        let field = Revocation::field(r.token_id.as_deref());
        let mut inv = self.inner.scripts.revoke.key(&key);
        inv.arg(&field).arg(r.until_ms);
        self.run_pooled("revoke", inv).await?;
        self.durable(&key).await?;
        self.announce(&cat(&[r.user.as_str(), ":", &field]), &r.record, &r.user).await
    }

    async fn lift(&self, user: &UserKey, token_id: Option<&str>) -> Result<bool> {
        let key = cat(&[&self.user_base(user), ":rv"]);
        let field = Revocation::field(token_id);
        let mut inv = self.inner.scripts.revoke.key(&key);
        inv.arg(&field).arg("");
        let had = int(&self.run_pooled("revoke", inv).await?)? == 1;
        self.durable(&key).await?;
        self.announce(&cat(&[user.as_str(), ":", &field]), "", user).await?;
        Ok(had)
    }

    async fn revocations(&self) -> Result<Vec<Listed>> {
        let (registry, _) = self.registry_keys();
        let all: HashMap<String, String> = self.query("revoked", redis::cmd("HGETALL").arg(&registry)).await?;
        let mut out: Vec<Listed> = all
            .into_iter()
            .filter_map(|(entry, record)| {
                let (user, field) = entry.split_once(':')?;
                Some(Listed { user: user.to_owned(), field: field.to_owned(), record })
            })
            .collect();
        out.sort_by(|a, b| (&a.user, &a.field).cmp(&(&b.user, &b.field)));
        Ok(out)
    }
}
