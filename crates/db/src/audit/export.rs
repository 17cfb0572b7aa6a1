//! `mcpfleet audit export`: the call rows of a time range (optionally of one principal) as JSON lines, oldest
//! first, streamed from the database.

use crate::{Database, DbError};
use futures::StreamExt as _;
use std::io::Write;

/// Which rows to export.
#[derive(Clone, Debug)]
pub struct ExportFilter {
    /// Inclusive lower bound, as PostgreSQL reads a `timestamptz` (`2026-12-01`, `2026-12-01T10:00:00Z`).
    pub since: String,
    /// Exclusive upper bound, the same way.
    pub until: String,
    /// The principal's key (the hash of issuer and subject the server keys on).
    pub principal: Option<String>,
}

/// Writes the rows as JSON lines to `out`; returns how many.
///
/// # Errors
/// The database is unreachable, refuses a bound it cannot read as a time ([`DbError::Query`]), or `out` fails.
pub async fn export(db: &Database, filter: &ExportFilter, out: &mut dyn Write) -> Result<u64, DbError> {
    let c = db.get().await?;
    let stmt = c
        .prepare(
            "SELECT json_build_object(\
               'at', to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), \
               'kind', kind, 'replica', replica, 'chain_id', chain_id, 'seq', seq, 'principal', principal, \
               'client_id', client_id, 'tool', tool, 'outcome', outcome, \
               'duration_ms', round(duration_us / 1000.0, 3), 'trace_id', trace_id, 'args_sha256', args_sha256, \
               'result_bytes', result_bytes, 'generation', generation, 'dropped', dropped, 'detail', detail)::text \
             FROM audit_events \
             WHERE at >= $1::text::timestamptz AND at < $2::text::timestamptz \
               AND ($3::text IS NULL OR principal = $3) \
             ORDER BY at, chain_id, seq",
        )
        .await
        .map_err(|e| DbError::of(&e))?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&filter.since, &filter.until, &filter.principal];
    let rows = c.query_raw(&stmt, params).await.map_err(|e| DbError::of(&e))?;
    let mut rows = std::pin::pin!(rows);
    let mut n = 0;
    while let Some(row) = rows.next().await {
        let row = row.map_err(|e| DbError::of(&e))?;
        let line: String = row.get(0);
        writeln!(out, "{line}").map_err(|e| DbError::Query(format!("cannot write the export: {e}")))?;
        n += 1;
    }
    Ok(n)
}
