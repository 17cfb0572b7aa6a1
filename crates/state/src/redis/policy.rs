//! The fleet's policy document in Redis ([`crate::PolicyStore`]): one hash, `<p>{fleet}:policy`, and the fleet's
//! notice channel `<p>{fleet}:nb`, in the `{fleet}` slot with the membership keys.

use super::RedisStore;
use super::codec::{cat, int};
use crate::policy::{NewPolicy, PolicyStore, PutPolicy, StoredPolicy};
use crate::{Result, StateError, Subscription};
use async_trait::async_trait;
use redis::Value;
use std::collections::HashMap;

impl RedisStore {
    fn policy_keys(&self) -> (String, String) {
        let p = &self.inner.cfg.prefix;
        (cat(&[p, "{fleet}:policy"]), cat(&[p, "{fleet}:nb"]))
    }
}

#[async_trait]
impl PolicyStore for RedisStore {
    async fn policy_version(&self) -> Result<u64> {
        let (key, _) = self.policy_keys();
        let v: Option<u64> = self.query("policy", redis::cmd("HGET").arg(&key).arg("v")).await?;
        Ok(v.unwrap_or(0))
    }

    async fn policy(&self) -> Result<Option<StoredPolicy>> {
        let (key, _) = self.policy_keys();
        let mut h: HashMap<String, String> = self.query("policy", redis::cmd("HGETALL").arg(&key)).await?;
        let Some(version) = h.get("v").and_then(|v| v.parse().ok()) else { return Ok(None) };
        let mut take = |k: &str| h.remove(k).unwrap_or_default();
        Ok(Some(StoredPolicy {
            version,
            text: take("doc"),
            by: take("by"),
            at_ms: take("at").parse().unwrap_or(0),
            summary: take("sum"),
        }))
    }

    async fn put_policy(&self, new: &NewPolicy<'_>) -> Result<PutPolicy> {
        let (key, channel) = self.policy_keys();
        let mut inv = self.inner.scripts.policy.key(&key);
        inv.key(&channel).arg(new.expected).arg(new.version.unwrap_or(0)).arg(new.text).arg(new.by).arg(new.summary);
        let reply = self.run_pooled("policy", inv).await?;
        let Value::Array(items) = reply else { return Err(StateError::Protocol("bad policy reply")) };
        let (stored, version) = match items.as_slice() {
            [a, b] => (int(a)?, u64::try_from(int(b)?).map_err(|_| StateError::Protocol("bad policy version"))?),
            _ => return Err(StateError::Protocol("bad policy reply")),
        };
        if stored == 1 {
            self.durable(&key).await?;
            Ok(PutPolicy::Stored(version))
        } else {
            Ok(PutPolicy::Moved(version))
        }
    }

    async fn subscribe_fleet(&self) -> Result<Box<dyn Subscription>> {
        let (_, channel) = self.policy_keys();
        Ok(Box::new(self.inner.subscriber.subscribe(channel, super::subscriber::NOTICE_BUFFER).await?))
    }
}
