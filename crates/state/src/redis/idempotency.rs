//! Idempotency records (see `crate::stateless`): one hash per key, claimed, renewed, completed and released by
//! `idem.lua`.

use super::RedisStore;
use super::codec::{array, int, ms, string};
use crate::stateless::{Claim, ClaimSpec, IdempotencyKey};
use crate::{IdempotencyStore, Result, StateError};
use async_trait::async_trait;
use std::time::Duration;

impl RedisStore {
    fn idem_key(&self, key: &IdempotencyKey) -> String {
        format!("{}:idem:{}:{}", self.user_base(&key.user), key.tool, key.key_hash)
    }
}

#[async_trait]
impl IdempotencyStore for RedisStore {
    async fn claim(&self, key: &IdempotencyKey, spec: &ClaimSpec<'_>) -> Result<Claim> {
        let k = self.idem_key(key);
        let mut inv = self.inner.scripts.idem.key(&k);
        inv.arg("claim").arg(spec.digest).arg(spec.token).arg(ms(spec.lease));
        let reply = array(self.run("idem", inv).await?)?;
        match reply.as_slice() {
            [s] if string(s)? == "run" => Ok(Claim::Run),
            [s] if string(s)? == "running" => Ok(Claim::Running),
            [s] if string(s)? == "mismatch" => Ok(Claim::Mismatch),
            [s, r] if string(s)? == "done" => Ok(Claim::Done(string(r)?)),
            _ => Err(StateError::Protocol("bad idempotency reply")),
        }
    }

    async fn renew_claim(&self, key: &IdempotencyKey, token: &str, lease: Duration) -> Result<bool> {
        let k = self.idem_key(key);
        let mut inv = self.inner.scripts.idem.key(&k);
        inv.arg("renew").arg(token).arg(ms(lease));
        Ok(int(&self.run("idem", inv).await?)? == 1)
    }

    async fn complete_claim(&self, key: &IdempotencyKey, token: &str, result: &str, ttl: Duration) -> Result<bool> {
        let k = self.idem_key(key);
        let mut inv = self.inner.scripts.idem.key(&k);
        inv.arg("complete").arg(token).arg(result).arg(ms(ttl));
        let done = int(&self.run("idem", inv).await?)? == 1;
        if done {
            // "Runs once" is the promise: a failover must not forget the result and let a retry run it again.
            self.durable(&k).await?;
        }
        Ok(done)
    }

    async fn release_claim(&self, key: &IdempotencyKey, token: &str) -> Result<()> {
        let k = self.idem_key(key);
        let mut inv = self.inner.scripts.idem.key(&k);
        inv.arg("release").arg(token);
        self.run("idem", inv).await?;
        Ok(())
    }
}
