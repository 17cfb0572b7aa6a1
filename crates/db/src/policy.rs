//! The history of the fleet's policy (docs/POLICY.md, migration 0003): every version applied, stored whole with who
//! applied it, when, and what it changed, and each change appended to the audit trail, in one transaction with the
//! write that puts the version in force ([`record`]); the versions listed ([`history`]) and one read back whole
//! ([`version`]) for a rollback.

use crate::audit::admin::{self, Change};
use crate::{Database, DbError};
use sha2::{Digest as _, Sha256};
use std::time::SystemTime;

/// Serialises the numbering of versions (transaction-scoped advisory lock).
const LOCK: i64 = 0x6d63_706f_6c69_6379; // "mcpolicy"

/// One version, without its document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyVersion {
    pub version: i64,
    /// SHA-256 of the document, hex.
    pub sha256: String,
    pub applied_by: String,
    pub applied_at: SystemTime,
    pub summary: String,
    /// The version a rollback restored.
    pub rollback_of: Option<i64>,
}

/// A version to record.
#[derive(Clone, Copy, Debug)]
pub struct NewVersion<'a> {
    pub document: &'a str,
    pub by: &'a str,
    pub summary: &'a str,
    pub rollback_of: Option<i64>,
    /// The version in force in the store: the new one is numbered above it and above every recorded one.
    pub in_force: i64,
    /// The audit chain's writer name (the CLI's: `policy@<host>`).
    pub writer: &'a str,
}

/// SHA-256 of a document, hex.
#[must_use]
pub fn digest(document: &str) -> String {
    mcpfleet_core::hex(&Sha256::digest(document.as_bytes()))
}

/// Records `new` as the next version with its audit rows (a `policy` row and the chain's `end`), then runs
/// `publish(version)` (the store write that puts it in force) before committing: the history and the store agree,
/// or nothing is recorded. Returns the version, or `publish`'s error (and nothing recorded).
///
/// # Errors
/// The database is unreachable or refuses.
pub async fn record<F, Fut, E>(db: &Database, new: &NewVersion<'_>, publish: F) -> Result<Result<i64, E>, DbError>
where
    F: FnOnce(i64) -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
{
    crate::audit::partitions::ensure(db, SystemTime::now(), 1).await?;
    let mut c = db.get().await?;
    let tx = c.transaction().await.map_err(|e| DbError::of(&e))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK]).await.map_err(|e| DbError::of(&e))?;
    let last: i64 = tx
        .query_one("SELECT coalesce(max(version), 0) FROM policy_versions", &[])
        .await
        .map_err(|e| DbError::of(&e))?
        .get(0);
    let version = last.max(new.in_force) + 1;
    let sha = digest(new.document);
    tx.execute(
        "INSERT INTO policy_versions (version, document, sha256, applied_by, summary, rollback_of) \
         VALUES ($1, $2, $3, $4, $5, $6)",
        &[&version, &new.document, &sha, &new.by, &new.summary, &new.rollback_of],
    )
    .await
    .map_err(|e| DbError::of(&e))?;
    let change = Change {
        writer: new.writer,
        kind: "policy",
        by: new.by,
        outcome: if new.rollback_of.is_some() { "rolled_back" } else { "applied" },
        digest: Some(sha),
        size: Some(i64::try_from(new.document.len()).unwrap_or(i64::MAX)),
        detail: format!("version {version}: {}", new.summary),
    };
    crate::audit::insert_in(&tx, &admin::rows(&change)).await?;
    if let Err(e) = publish(version).await {
        // Dropping the transaction rolls it back.
        return Ok(Err(e));
    }
    tx.commit().await.map_err(|e| DbError::of(&e))?;
    Ok(Ok(version))
}

/// Every version, newest first.
///
/// # Errors
/// The database is unreachable or refuses.
pub async fn history(db: &Database) -> Result<Vec<PolicyVersion>, DbError> {
    let c = db.get().await?;
    let rows = c
        .query(
            "SELECT version, sha256, applied_by, applied_at, summary, rollback_of FROM policy_versions \
             ORDER BY version DESC",
            &[],
        )
        .await
        .map_err(|e| DbError::of(&e))?;
    Ok(rows.iter().map(row).collect())
}

/// One version and its document; `None` if it was never recorded.
///
/// # Errors
/// The database is unreachable or refuses.
pub async fn version(db: &Database, v: i64) -> Result<Option<(PolicyVersion, String)>, DbError> {
    let c = db.get().await?;
    let r = c
        .query_opt(
            "SELECT version, sha256, applied_by, applied_at, summary, rollback_of, document FROM policy_versions \
             WHERE version = $1",
            &[&v],
        )
        .await
        .map_err(|e| DbError::of(&e))?;
    Ok(r.map(|r| (row(&r), r.get(6))))
}

fn row(r: &tokio_postgres::Row) -> PolicyVersion {
    PolicyVersion {
        version: r.get(0),
        sha256: r.get(1),
        applied_by: r.get(2),
        applied_at: r.get(3),
        summary: r.get(4),
        rollback_of: r.get(5),
    }
}
