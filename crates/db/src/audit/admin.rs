//! The audit rows of an operator's change (a policy version, a revocation): a chain of its own, written by the
//! command that made the change, one row and the chain's `end` ([`rows`]); appended alone ([`append`]) or inside the
//! caller's transaction (the policy history's).

use super::chain::{Chain, Row};
use crate::{Database, DbError};
use std::borrow::Cow;
use std::time::SystemTime;

/// One change, as its audit row records it.
#[derive(Clone, Debug)]
pub struct Change<'a> {
    /// The chain's writer name (`policy-cli`, `revoke-cli`).
    pub writer: &'a str,
    /// `policy` or `revoke`.
    pub kind: &'static str,
    /// Who made it (the CLI's `--by`).
    pub by: &'a str,
    /// What happened: `applied`, `rolled_back`, `revoked`, `lifted`.
    pub outcome: &'static str,
    /// A digest of what was applied (a document's SHA-256), if any.
    pub digest: Option<String>,
    /// Its size in bytes, if any.
    pub size: Option<i64>,
    /// One line: what changed (at most 1000 characters kept).
    pub detail: String,
}

/// The change's row and its chain's end, linked.
pub(crate) fn rows(c: &Change<'_>) -> [Row; 2] {
    let mut chain = Chain::new(c.writer);
    let mut row = chain.blank(c.kind, SystemTime::now());
    row.principal = Some(c.by.to_owned());
    row.outcome = Some(Cow::Borrowed(c.outcome));
    row.args_sha256.clone_from(&c.digest);
    row.result_bytes = c.size;
    row.detail = Some(c.detail.chars().take(1000).collect());
    let row = chain.link(row);
    let end = chain.link(chain.blank("end", SystemTime::now()));
    [row, end]
}

/// Appends a change to the audit trail (its month's partition made if missing).
///
/// # Errors
/// The database is unreachable or refuses.
pub async fn append(db: &Database, c: &Change<'_>) -> Result<(), DbError> {
    super::partitions::ensure(db, SystemTime::now(), 1).await?;
    let mut conn = db.get().await?;
    let tx = conn.transaction().await.map_err(|e| DbError::of(&e))?;
    super::insert_in(&tx, &rows(c)).await?;
    tx.commit().await.map_err(|e| DbError::of(&e))
}
