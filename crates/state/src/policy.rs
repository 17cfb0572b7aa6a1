//! Where the fleet's policy document (docs/POLICY.md) is kept for the replicas: the version in force, whole, with
//! who applied it, when and what it changed; and the announcement of a new version. The history of versions is
//! the database's (with PostgreSQL); the store holds only the current one. Both stores keep the text opaque: the
//! policy crate parses it.

use crate::{Result, Subscription};
use async_trait::async_trait;

/// The version in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredPolicy {
    /// Its number: 1 for the first, then one more than the one before (or the database's number).
    pub version: u64,
    /// The document as applied (YAML).
    pub text: String,
    /// Who applied it (the CLI's `--by`).
    pub by: String,
    /// When, in milliseconds since the epoch, by the store's clock.
    pub at_ms: u64,
    /// The one-line summary of what it changed.
    pub summary: String,
}

/// A version to store.
#[derive(Clone, Copy, Debug)]
pub struct NewPolicy<'a> {
    /// The version the applier read and compared against (0: none): if another version was stored since, the
    /// store refuses, so that a summary never describes a change against the wrong version.
    pub expected: u64,
    /// Its number, when the database gave it one (greater than `expected`); `None`: `expected + 1`.
    pub version: Option<u64>,
    pub text: &'a str,
    pub by: &'a str,
    pub summary: &'a str,
}

/// What [`PolicyStore::put_policy`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutPolicy {
    /// Stored and announced as this version.
    Stored(u64),
    /// Another version (this one) is in force now: nothing was stored.
    Moved(u64),
}

/// The policy message on the fleet's notice channel: [`crate::Ring::Notice`] carries `policy:<version>`.
pub const POLICY_NOTICE: &str = "policy:";

/// The fleet's policy document.
#[async_trait]
pub trait PolicyStore: Send + Sync + std::fmt::Debug {
    /// The number of the version in force; 0 when none was ever applied.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn policy_version(&self) -> Result<u64>;

    /// The version in force, whole; `None` when none was ever applied.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn policy(&self) -> Result<Option<StoredPolicy>>;

    /// Stores a version and announces it on the fleet's notice channel, in one step; with durable replicas
    /// configured, waits for them (`WAIT`) as other promises do.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn put_policy(&self, new: &NewPolicy<'_>) -> Result<PutPolicy>;

    /// Subscribes to the fleet's notice channel: every announcement from now on arrives as
    /// [`crate::Ring::Notice`] (`policy:<version>`); delivery is at most once, so a subscriber also polls.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn subscribe_fleet(&self) -> Result<Box<dyn Subscription>>;
}
