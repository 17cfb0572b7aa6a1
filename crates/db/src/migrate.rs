//! The schema: the numbered SQL files of the top-level `migrations/` folder, embedded in the binary, and the runner
//! that applies them.
//!
//! [`apply`] takes a session advisory lock first, so two replicas or two Jobs racing apply each migration once: one
//! applies, the other waits for the lock and then finds nothing to do. Each migration runs in its own transaction
//! with its row in `mcpfleet_migrations` (version, name, SHA-256 of the file, when, by whom); a file changed after
//! it was applied is refused by its checksum. Migrations are expand-only between releases, so a replica runs
//! against a schema ahead of it ([`Status::ahead`]) and a rolling upgrade works.

use crate::{Database, DbError};
use sha2::{Digest as _, Sha256};

/// One embedded migration.
#[derive(Clone, Copy, Debug)]
pub struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: &'static str,
}

impl Migration {
    /// SHA-256 of its SQL, hex.
    #[must_use]
    pub fn checksum(&self) -> String {
        mcpfleet_core::hex(&Sha256::digest(self.sql.as_bytes()))
    }
}

/// Every migration this binary carries, in order. A new one is a new file and a new line here.
pub const MIGRATIONS: &[Migration] = &[
    Migration { version: 1, name: "reference", sql: include_str!("../../../migrations/0001_reference.sql") },
    Migration { version: 2, name: "audit", sql: include_str!("../../../migrations/0002_audit.sql") },
    Migration { version: 3, name: "policy", sql: include_str!("../../../migrations/0003_policy.sql") },
    Migration { version: 4, name: "downstream", sql: include_str!("../../../migrations/0004_downstream.sql") },
];

/// The key of the advisory lock `migrate` holds (`hashtext('mcpfleet.migrate')` would do; a constant is plainer).
const LOCK: i64 = 0x6d63_7066_6c65_6574; // "mcpfleet"

const BOOKKEEPING: &str = "CREATE TABLE IF NOT EXISTS mcpfleet_migrations (
    version    bigint PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    applied_by text NOT NULL DEFAULT current_user
)";

/// Where the schema stands against this binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Versions applied that this binary knows.
    pub applied: Vec<i64>,
    /// Versions this binary carries that are not applied: the schema is behind.
    pub pending: Vec<i64>,
    /// Versions applied that this binary does not know: a newer release migrated (expand-only, so this one runs).
    pub ahead: Vec<i64>,
}

impl Status {
    /// The highest version applied (0 for an empty database).
    #[must_use]
    pub fn current(&self) -> i64 {
        self.applied.iter().chain(&self.ahead).copied().max().unwrap_or(0)
    }

    /// The highest version this binary needs.
    #[must_use]
    pub fn needed() -> i64 {
        MIGRATIONS.iter().map(|m| m.version).max().unwrap_or(0)
    }
}

async fn applied(c: &tokio_postgres::Client) -> Result<Vec<(i64, String)>, DbError> {
    let exists = c
        .query_one("SELECT to_regclass('mcpfleet_migrations') IS NOT NULL", &[])
        .await
        .map_err(|e| DbError::of(&e))?
        .get::<_, bool>(0);
    if !exists {
        return Ok(Vec::new());
    }
    let rows = c
        .query("SELECT version, checksum FROM mcpfleet_migrations ORDER BY version", &[])
        .await
        .map_err(|e| DbError::of(&e))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

fn status_of(done: &[(i64, String)]) -> Result<Status, DbError> {
    for (version, sum) in done {
        if let Some(m) = MIGRATIONS.iter().find(|m| m.version == *version)
            && m.checksum() != *sum
        {
            return Err(DbError::Checksum { version: m.version, name: m.name });
        }
    }
    let known = |v: i64| MIGRATIONS.iter().any(|m| m.version == v);
    Ok(Status {
        applied: done.iter().map(|(v, _)| *v).filter(|v| known(*v)).collect(),
        pending: MIGRATIONS.iter().map(|m| m.version).filter(|v| !done.iter().any(|(d, _)| d == v)).collect(),
        ahead: done.iter().map(|(v, _)| *v).filter(|v| !known(*v)).collect(),
    })
}

/// Where the schema stands, without changing anything.
///
/// # Errors
/// The database is unreachable, or an applied migration's checksum differs.
pub async fn status(db: &Database) -> Result<Status, DbError> {
    let c = db.get().await?;
    status_of(&applied(&c).await?)
}

/// Applies every pending migration under the advisory lock, in order; returns the ones this call applied (none
/// when the schema is current, or when another process applied them while this one waited).
///
/// # Errors
/// The database is unreachable, a migration fails (its transaction rolls back; the ones before it stay), or an
/// applied migration's checksum differs.
pub async fn apply(db: &Database) -> Result<Vec<Migration>, DbError> {
    let mut c = db.get().await?;
    c.execute("SELECT pg_advisory_lock($1)", &[&LOCK]).await.map_err(|e| DbError::of(&e))?;
    let result = apply_locked(&mut c).await;
    // The lock is the session's: give it back before the connection returns to the pool.
    let unlocked = c.execute("SELECT pg_advisory_unlock($1)", &[&LOCK]).await;
    if unlocked.is_err() {
        // A connection that may still hold the lock must not be reused.
        let _ = deadpool_postgres::Object::take(c);
    }
    result
}

async fn apply_locked(c: &mut deadpool_postgres::Object) -> Result<Vec<Migration>, DbError> {
    c.batch_execute(BOOKKEEPING).await.map_err(|e| DbError::of(&e))?;
    let status = status_of(&applied(c).await?)?;
    let mut done = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| status.pending.contains(&m.version)) {
        let tx = c.transaction().await.map_err(|e| DbError::of(&e))?;
        tx.batch_execute(m.sql).await.map_err(|e| migration_failed(m, &e))?;
        tx.execute(
            "INSERT INTO mcpfleet_migrations (version, name, checksum) VALUES ($1, $2, $3)",
            &[&m.version, &m.name, &m.checksum()],
        )
        .await
        .map_err(|e| DbError::of(&e))?;
        tx.commit().await.map_err(|e| DbError::of(&e))?;
        tracing::info!(version = m.version, name = m.name, "migration applied");
        done.push(*m);
    }
    Ok(done)
}

fn migration_failed(m: &Migration, e: &tokio_postgres::Error) -> DbError {
    match DbError::of(e) {
        DbError::Query(msg) => DbError::Query(format!("migration {:04} ({}): {msg}", m.version, m.name)),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_increasing_and_files_are_numbered() {
        let versions: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
        assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
        assert_eq!(Status::needed(), *versions.last().unwrap());
    }

    #[test]
    fn status_tells_behind_from_ahead_and_catches_edits() {
        let m1 = &MIGRATIONS[0];
        let s = status_of(&[(m1.version, m1.checksum()), (99, "x".into())]).unwrap();
        assert_eq!((s.applied, s.ahead), (vec![1], vec![99]));
        assert_eq!(s.pending, MIGRATIONS[1..].iter().map(|m| m.version).collect::<Vec<_>>());
        let e = status_of(&[(1, "0".repeat(64))]).unwrap_err();
        assert!(e.to_string().starts_with("migration 0001 (reference) was changed after it was applied"), "{e}");
    }
}
