//! What the stateless generation (2026-07-28) keeps between requests: idempotency records, so that a re-issued
//! side-effecting call runs once on whichever replica it lands, and the per-principal notice channel that carries
//! notifications to `subscriptions/listen` streams on any replica.

use crate::types::UserKey;
use std::time::Duration;

/// One idempotency record: a principal's key for one tool. The client's key is hashed before it names anything.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey {
    pub user: UserKey,
    pub tool: String,
    /// Hex SHA-256 of the client's key.
    pub key_hash: String,
}

impl IdempotencyKey {
    /// Keys `key` (the client's idempotency key) for `user` and `tool`.
    #[must_use]
    pub fn new(user: &UserKey, tool: &str, key: &str) -> Self {
        use sha2::Digest as _;
        let d = sha2::Sha256::digest(key.as_bytes());
        Self { user: user.clone(), tool: tool.to_owned(), key_hash: mcpfleet_core::hex(&d) }
    }
}

/// What a claim on an idempotency record found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// No record (or an abandoned one): the claimant runs the call and must complete or release it.
    Run,
    /// The first call finished; this is its stored result.
    Done(String),
    /// Another call holds the record and is still running: wait and claim again.
    Running,
    /// The key was used with other arguments.
    Mismatch,
}

/// How a record is claimed.
#[derive(Clone, Debug)]
pub struct ClaimSpec<'a> {
    /// A digest of the call's arguments: a repeat must match it.
    pub digest: &'a str,
    /// The claimant's token: only it can renew, complete or release the record.
    pub token: &'a str,
    /// How long the claim lasts without renewal; a claim whose holder died lapses after this.
    pub lease: Duration,
}
