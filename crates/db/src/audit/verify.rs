//! `mcpfleet audit verify`: walks every chain from its start (or from its last retention checkpoint) and reports,
//! per chain, the first row that is missing, altered, duplicated or out of place. A chain without its `end` row is
//! reported apart: a replica that is still running, that crashed, or whose tail was cut; that is not called
//! tampering, since nothing in the rows that are there says which.

use super::chain::{GENESIS, Row, kind};
use crate::{Database, DbError};
use std::time::SystemTime;

/// What is wrong with a chain, at its first bad row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// Rows `from..=to` are not there (deleted), before the row with `seq = to + 1`.
    Missing { from: i64, to: i64 },
    /// The row's content does not match its hash (edited).
    Altered { seq: i64 },
    /// The row does not link to the row before it (rows reordered, or the one before replaced).
    Unlinked { seq: i64 },
    /// Two rows carry this sequence number.
    Duplicate { seq: i64 },
    /// Rows follow the chain's `end` row.
    AfterEnd { seq: i64 },
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing { from, to } if from == to => write!(f, "row {from} is missing"),
            Self::Missing { from, to } => write!(f, "rows {from} to {to} are missing"),
            Self::Altered { seq } => write!(f, "row {seq} was altered: its content does not match its hash"),
            Self::Unlinked { seq } => {
                write!(f, "row {seq} does not link to the row before it (reordered or replaced)")
            }
            Self::Duplicate { seq } => write!(f, "row {seq} appears twice"),
            Self::AfterEnd { seq } => write!(f, "row {seq} follows the chain's end row"),
        }
    }
}

/// One chain's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainReport {
    pub chain_id: String,
    /// Rows checked (after the checkpoint, when there is one).
    pub rows: u64,
    /// The sequence number verification started after (a retention checkpoint), or 0.
    pub from_checkpoint: i64,
    /// Whether the chain's `end` row is there (the replica drained).
    pub ended: bool,
    /// The first problem, with the row's time and trace id when it has them.
    pub finding: Option<(Finding, Option<SystemTime>, Option<String>)>,
}

/// Every chain's result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub chains: Vec<ChainReport>,
}

impl Report {
    /// Chains with a finding.
    pub fn tampered(&self) -> impl Iterator<Item = &ChainReport> {
        self.chains.iter().filter(|c| c.finding.is_some())
    }

    /// Intact chains without an end row: running, crashed, or cut at the tail.
    pub fn open(&self) -> impl Iterator<Item = &ChainReport> {
        self.chains.iter().filter(|c| c.finding.is_none() && !c.ended)
    }

    /// Rows checked in all.
    #[must_use]
    pub fn rows(&self) -> u64 {
        self.chains.iter().map(|c| c.rows).sum()
    }
}

const PAGE: i64 = 5000;

/// Verifies every chain.
///
/// # Errors
/// The database is unreachable or refuses.
pub async fn verify(db: &Database) -> Result<Report, DbError> {
    let c = db.get().await?;
    let chains = c
        .query(
            "SELECT chain_id FROM (SELECT DISTINCT chain_id FROM audit_events \
             UNION SELECT chain_id FROM audit_checkpoints) c ORDER BY chain_id",
            &[],
        )
        .await
        .map_err(|e| DbError::of(&e))?;
    let mut report = Report::default();
    for r in chains {
        let id: String = r.get(0);
        report.chains.push(verify_chain(&c, &id).await?);
    }
    Ok(report)
}

async fn verify_chain(c: &tokio_postgres::Client, id: &str) -> Result<ChainReport, DbError> {
    let cp = c
        .query_opt(
            "SELECT seq, hash, ended FROM audit_checkpoints WHERE chain_id = $1 ORDER BY seq DESC LIMIT 1",
            &[&id],
        )
        .await
        .map_err(|e| DbError::of(&e))?;
    let (mut last, mut prev, mut ended) = match &cp {
        Some(row) => (row.get::<_, i64>(0), to32(row.get(1)), row.get::<_, bool>(2)),
        None => (0, GENESIS, false),
    };
    let mut report = ChainReport { chain_id: id.to_owned(), rows: 0, from_checkpoint: last, ended, finding: None };
    let mut after = last;
    loop {
        let rows = c
            .query(
                "SELECT chain_id, seq, at, kind, replica, principal, client_id, tool, outcome, duration_us, \
                 trace_id, args_sha256, result_bytes, generation, dropped, prev_hash, hash, detail \
                 FROM audit_events WHERE chain_id = $1 AND seq > $2 ORDER BY seq, at LIMIT $3",
                &[&id, &after, &PAGE],
            )
            .await
            .map_err(|e| DbError::of(&e))?;
        let n = rows.len();
        for r in &rows {
            let row = Row {
                chain_id: r.get::<_, &str>(0).into(),
                seq: r.get(1),
                at: r.get(2),
                kind: kind(r.get(3)),
                replica: r.get::<_, &str>(4).into(),
                principal: r.get(5),
                client_id: r.get(6),
                tool: r.get(7),
                outcome: r.get::<_, Option<String>>(8).map(std::borrow::Cow::Owned),
                duration_us: r.get(9),
                trace_id: r.get(10),
                args_sha256: r.get(11),
                result_bytes: r.get(12),
                generation: r.get::<_, Option<String>>(13).map(std::borrow::Cow::Owned),
                dropped: r.get(14),
                prev_hash: to32(r.get(15)),
                hash: to32(r.get(16)),
                detail: r.get(17),
            };
            report.rows += 1;
            let finding = if row.seq == last {
                Some(Finding::Duplicate { seq: row.seq })
            } else if ended {
                Some(Finding::AfterEnd { seq: row.seq })
            } else if row.seq > last + 1 {
                Some(Finding::Missing { from: last + 1, to: row.seq - 1 })
            } else if row.compute_hash() != row.hash {
                Some(Finding::Altered { seq: row.seq })
            } else if row.prev_hash != prev {
                Some(Finding::Unlinked { seq: row.seq })
            } else {
                None
            };
            if let Some(f) = finding {
                report.finding = Some((f, Some(row.at), row.trace_id.clone()));
                report.ended = ended;
                return Ok(report);
            }
            last = row.seq;
            prev = row.hash;
            ended = row.kind == "end";
        }
        if n < usize::try_from(PAGE).unwrap_or(usize::MAX) {
            break;
        }
        after = last;
    }
    report.ended = ended;
    Ok(report)
}

fn to32(v: Vec<u8>) -> [u8; 32] {
    let mut out = [0xff; 32];
    if v.len() == 32 {
        out.copy_from_slice(&v);
    }
    out
}
