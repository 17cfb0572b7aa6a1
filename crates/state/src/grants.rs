//! Third parties' grants for URL-mode downstreams (docs/DOWNSTREAM.md, "URL mode"): for each user and downstream,
//! the tokens the third party issued after the user's consent, **sealed by the caller** (AES-GCM in
//! `mcpfleet-downstream`; this store never sees a token in clear), a lock that makes one replica at a time spend a
//! rotating refresh token, and the authorizations in progress, each under a single-use id.
//!
//! A grant lives in its user's hash slot (`{u:<user>}:dg:<downstream>`, its lock `{u:<user>}:dgl:<downstream>`);
//! an authorization in progress under its own id (`{az:<id>}`), which is random and unguessable.

use crate::Result;
use crate::types::UserKey;
use async_trait::async_trait;
use std::time::Duration;

/// Where URL-mode grants and authorizations in progress are kept.
#[async_trait]
pub trait GrantStore: Send + Sync + std::fmt::Debug {
    /// The sealed grant of `user` for `downstream`, if any.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn grant(&self, user: &UserKey, downstream: &str) -> Result<Option<Vec<u8>>>;

    /// Stores a sealed grant for `ttl` (the refresh token's life, or the access token's when there is none).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn put_grant(&self, user: &UserKey, downstream: &str, sealed: &[u8], ttl: Duration) -> Result<()>;

    /// Drops the grant if it is still `sealed` (a 401 on an old token never drops one a refresh just stored);
    /// `None` drops whatever is there. Returns whether one was dropped.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn drop_grant(&self, user: &UserKey, downstream: &str, sealed: Option<&[u8]>) -> Result<bool>;

    /// Takes the grant's refresh lock for `holder` for `ttl`; `false` while another holds it.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn lock_grant(&self, user: &UserKey, downstream: &str, holder: &str, ttl: Duration) -> Result<bool>;

    /// Releases the lock if `holder` still holds it.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn unlock_grant(&self, user: &UserKey, downstream: &str, holder: &str) -> Result<()>;

    /// Stores an authorization in progress under `id` for `ttl` (replacing what was there).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn put_authorization(&self, id: &str, record: &str, ttl: Duration) -> Result<()>;

    /// The authorization in progress under `id`, if it has not expired or been taken.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn authorization(&self, id: &str) -> Result<Option<String>>;

    /// Takes the authorization under `id`: it is gone for everyone after (single use).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn take_authorization(&self, id: &str) -> Result<Option<String>>;
}
