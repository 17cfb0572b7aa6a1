//! The audit table's monthly partitions: created ahead ([`ensure`]), and dropped whole by retention ([`prune`]),
//! after each chain's last row in the dropped month is kept in `audit_checkpoints` (where `verify` resumes).

use crate::{Database, DbError, Month};
use std::time::SystemTime;

/// Serialises partition changes across replicas (transaction-scoped advisory lock).
const LOCK: i64 = 0x6d63_7061_7274_6e73; // "mcpartns"

/// Creates the partitions of the month of `now` and of the `ahead` months after it, when missing; returns the
/// ones it created.
///
/// # Errors
/// The database is unreachable or refuses.
pub async fn ensure(db: &Database, now: SystemTime, ahead: u32) -> Result<Vec<String>, DbError> {
    let mut c = db.get().await?;
    let tx = c.transaction().await.map_err(|e| DbError::of(&e))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK]).await.map_err(|e| DbError::of(&e))?;
    let mut created = Vec::new();
    let first = Month::of(now);
    for m in 0..=ahead {
        let month = first.plus(i32::try_from(m).unwrap_or(0));
        let name = month.partition();
        let exists: bool =
            tx.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name]).await.map_err(|e| DbError::of(&e))?.get(0);
        if exists {
            continue;
        }
        // Names and bounds come from `Month`, never from input.
        tx.batch_execute(&format!(
            "CREATE TABLE {name} PARTITION OF audit_events FOR VALUES FROM ('{}') TO ('{}')",
            month.start_literal(),
            month.plus(1).start_literal()
        ))
        .await
        .map_err(|e| DbError::of(&e))?;
        created.push(name);
    }
    tx.commit().await.map_err(|e| DbError::of(&e))?;
    for name in &created {
        tracing::info!(partition = %name, "audit partition created");
    }
    Ok(created)
}

/// The audit partitions, by month, oldest first.
///
/// # Errors
/// The database is unreachable or refuses.
pub async fn list(db: &Database) -> Result<Vec<Month>, DbError> {
    let c = db.get().await?;
    let rows = c
        .query(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = 'audit_events'::regclass",
            &[],
        )
        .await
        .map_err(|e| DbError::of(&e))?;
    let mut months: Vec<Month> = rows.iter().filter_map(|r| Month::of_partition(r.get(0))).collect();
    months.sort();
    Ok(months)
}

/// Retention: drops every partition of a month more than `keep` months before the month of `now` (with `keep =
/// 12` in December 2026, November 2025 and older go), after writing each chain's last row in it to
/// `audit_checkpoints`, in one transaction per partition. Returns the months dropped.
///
/// # Errors
/// The database is unreachable or refuses.
pub async fn prune(db: &Database, now: SystemTime, keep: u32) -> Result<Vec<Month>, DbError> {
    let oldest_kept = Month::of(now).plus(-i32::try_from(keep).unwrap_or(i32::MAX));
    let mut dropped = Vec::new();
    for month in list(db).await?.into_iter().filter(|m| *m < oldest_kept) {
        let mut c = db.get().await?;
        let tx = c.transaction().await.map_err(|e| DbError::of(&e))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK]).await.map_err(|e| DbError::of(&e))?;
        let name = month.partition();
        let exists: bool =
            tx.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name]).await.map_err(|e| DbError::of(&e))?.get(0);
        if !exists {
            continue; // another replica pruned it while this one waited
        }
        let kept = tx
            .execute(
                &format!(
                    "INSERT INTO audit_checkpoints (chain_id, seq, hash, at, ended, partition) \
                     SELECT DISTINCT ON (chain_id) chain_id, seq, hash, at, kind = 'end', '{name}' FROM {name} \
                     ORDER BY chain_id, seq DESC ON CONFLICT (chain_id, seq) DO NOTHING"
                ),
                &[],
            )
            .await
            .map_err(|e| DbError::of(&e))?;
        tx.batch_execute(&format!("DROP TABLE {name}")).await.map_err(|e| DbError::of(&e))?;
        tx.commit().await.map_err(|e| DbError::of(&e))?;
        tracing::info!(partition = %name, checkpoints = kept, "audit partition dropped by retention");
        dropped.push(month);
    }
    Ok(dropped)
}

/// Creates the partitions ahead and applies retention (`keep` months; none when `None`) now and every hour,
/// until `stop` fires. Failures are logged and retried at the next turn.
pub async fn maintain(db: Database, keep: Option<u32>, stop: tokio_util::sync::CancellationToken) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = ensure(&db, SystemTime::now(), 2).await {
            tracing::warn!(error = %e, "cannot create the audit partitions ahead; retrying in an hour");
        }
        if let Some(keep) = keep
            && let Err(e) = prune(&db, SystemTime::now(), keep).await
        {
            tracing::warn!(error = %e, "audit retention failed; retrying in an hour");
        }
    }
}
