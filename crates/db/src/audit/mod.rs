//! The audit trail: every `tools/call` outcome as one row of `audit_events`, off the call's path.
//!
//! [`Writer`] is the transport's [`AuditSink`]: `record` links the record into this replica's chain and queues it,
//! or, when the queue holds `--audit-buffer` records already (the database is down or slow), drops it and counts it
//! in `mcp_audit_dropped_total`; the next record that fits is preceded by a `dropped` row saying how many went, so
//! the chain itself shows the gap. Nothing in a request waits for the database. A flusher task writes the queue in
//! batches (one multi-row `INSERT … SELECT FROM unnest(…)`) at least every second, and sooner when a batch is full;
//! a failed batch stays at the head of the queue and is retried, with `ON CONFLICT DO NOTHING`, which makes the
//! retry of a batch that did commit harmless (the first attempt is a plain insert: speculative insertion costs the
//! database more on every row). [`Writer::close`] (the SIGTERM drain) ends the chain with an `end` row and
//! flushes within its deadline; what is left then is counted as dropped.
//!
//! [`partitions`] creates months ahead and applies retention; [`verify`] walks the chains; [`export`] writes JSON
//! lines.

pub mod admin;
pub(crate) mod chain;
mod export;
mod metrics;
pub mod partitions;
mod verify;

pub use chain::Row;
pub use export::{ExportFilter, export};
pub use metrics::{DbMetrics, watch_pool};
pub use verify::{ChainReport, Finding, Report, verify};

use crate::{Database, DbError};
use chain::Chain;
use mcpfleet_core::{AuditRecord, AuditSink, DownstreamEvent, DownstreamRecord};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::Notify;

/// How the writer batches.
#[derive(Clone, Debug)]
pub struct WriterConfig {
    /// This replica's name, in every row and its chain id.
    pub replica: String,
    /// Records the queue holds at most (`--audit-buffer`); past it, records are dropped and counted.
    pub buffer: usize,
    /// Rows per insert at most.
    pub batch: usize,
    /// The longest a record waits before its batch is written.
    pub interval: Duration,
}

struct Queue {
    chain: Chain,
    rows: VecDeque<Row>,
    /// Rows taken out for the batch being written: still counted against the buffer.
    in_flight: usize,
    /// Records dropped since the last `dropped` row.
    dropped: u64,
    closed: bool,
}

/// The per-replica audit writer.
pub struct Writer {
    queue: Mutex<Queue>,
    /// Rung when a batch is full, and on close.
    bell: Notify,
    /// One batch in flight at a time (the flusher's, or the drain's).
    flushing: tokio::sync::Mutex<()>,
    /// The last insert failed: the next one may repeat rows that did commit.
    retrying: Mutex<bool>,
    db: Database,
    cfg: WriterConfig,
    metrics: DbMetrics,
    /// Whether the flusher may write: false while the database's schema has not been checked (a replica started
    /// during a database outage queues its records until then).
    open: std::sync::atomic::AtomicBool,
    /// Rung when the writer opens.
    opened: Notify,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("replica", &self.cfg.replica).finish_non_exhaustive()
    }
}

/// What a close left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed {
    /// Rows still queued at the deadline, counted as dropped.
    pub dropped: usize,
}

impl Writer {
    /// A writer on a new chain, with its flusher task running on the current runtime.
    #[must_use]
    pub fn start(db: Database, cfg: WriterConfig, metrics: DbMetrics) -> Arc<Self> {
        let me = Self::start_held(db, cfg, metrics);
        me.open();
        me
    }

    /// A writer that queues records (within the buffer, dropping and counting past it, as during an outage) and
    /// writes nothing until [`open`](Self::open): for a replica that has not reached its database yet.
    #[must_use]
    pub fn start_held(db: Database, cfg: WriterConfig, metrics: DbMetrics) -> Arc<Self> {
        let queue =
            Queue { chain: Chain::new(&cfg.replica), rows: VecDeque::new(), in_flight: 0, dropped: 0, closed: false };
        let me = Arc::new(Self {
            queue: Mutex::new(queue),
            bell: Notify::new(),
            flushing: tokio::sync::Mutex::new(()),
            retrying: Mutex::new(false),
            db,
            cfg,
            metrics,
            open: std::sync::atomic::AtomicBool::new(false),
            opened: Notify::new(),
        });
        tokio::spawn(me.clone().flusher());
        me
    }

    /// Lets the flusher write (the schema is checked).
    pub fn open(&self) {
        if !self.open.swap(true, std::sync::atomic::Ordering::AcqRel) {
            tracing::info!(chain = %self.chain_id(), queued = self.pending(), "audit trail: writing to the database");
            self.opened.notify_one();
        }
    }

    fn is_open(&self) -> bool {
        self.open.load(std::sync::atomic::Ordering::Acquire)
    }

    /// This writer's chain id.
    #[must_use]
    pub fn chain_id(&self) -> String {
        self.lock().chain.id.to_string()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records still queued.
    #[must_use]
    pub fn pending(&self) -> usize {
        let q = self.lock();
        q.rows.len() + q.in_flight
    }

    async fn flusher(self: Arc<Self>) {
        while !self.is_open() {
            if self.lock().closed {
                return;
            }
            tokio::select! {
                () = self.opened.notified() => {}
                () = tokio::time::sleep(self.cfg.interval) => {}
            }
        }
        let mut backoff = self.cfg.interval;
        loop {
            let closed = self.lock().closed;
            if closed {
                return; // close() flushes what is left itself
            }
            match self.flush_once().await {
                Ok(0) => {
                    backoff = self.cfg.interval;
                    tokio::select! {
                        () = self.bell.notified() => {}
                        () = tokio::time::sleep(self.cfg.interval) => {}
                    }
                }
                Ok(_) => backoff = self.cfg.interval,
                Err(e) => {
                    self.metrics.flush_errors.inc();
                    tracing::warn!(error = %e, queued = self.pending(), "audit batch not written; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Writes one batch from the head of the queue; returns how many rows it wrote (0: the queue was empty). The
    /// batch leaves the queue while it is written (no copy), still counted against the buffer, and goes back to
    /// its head if the insert fails.
    async fn flush_once(&self) -> Result<usize, DbError> {
        let _one = self.flushing.lock().await;
        let batch: Vec<Row> = {
            let mut q = self.lock();
            let n = q.rows.len().min(self.cfg.batch);
            q.in_flight = n;
            q.rows.drain(..n).collect()
        };
        if batch.is_empty() {
            return Ok(0);
        }
        let started = Instant::now();
        let r = self.write(&batch).await;
        let mut q = self.lock();
        q.in_flight = 0;
        if let Err(e) = r {
            for row in batch.into_iter().rev() {
                q.rows.push_front(row);
            }
            return Err(e);
        }
        self.metrics.queue_depth.set(i64::try_from(q.rows.len()).unwrap_or(i64::MAX));
        drop(q);
        self.metrics.flush_seconds.observe(started.elapsed().as_secs_f64());
        self.metrics.batch_rows.observe(batch.len() as f64);
        self.metrics.written.inc_by(batch.len() as u64);
        Ok(batch.len())
    }

    /// Inserts `batch` within the deadline; a month without its partition (a replica started before `migrate`
    /// made it) gets it, and the insert is retried once.
    async fn write(&self, batch: &[Row]) -> Result<(), DbError> {
        let deadline = self.db.timeout().max(Duration::from_secs(5));
        let late = || DbError::Unavailable("audit insert timed out".to_owned());
        let retry = std::mem::replace(&mut *self.retrying.lock().unwrap_or_else(PoisonError::into_inner), true);
        let r = tokio::time::timeout(deadline, insert(&self.db, batch, retry)).await.map_err(|_| late())?;
        let r = match r {
            Err(DbError::Query(msg)) if msg.contains("no partition") => {
                partitions::ensure(&self.db, SystemTime::now(), 2).await?;
                tokio::time::timeout(deadline, insert(&self.db, batch, retry)).await.map_err(|_| late())?.map(drop)
            }
            r => r.map(drop),
        };
        if r.is_ok() {
            *self.retrying.lock().unwrap_or_else(PoisonError::into_inner) = false;
        }
        r
    }

    /// Ends the chain with its `end` row and writes what is queued, until `deadline`; what is still queued then
    /// is counted as dropped.
    pub async fn close(&self, deadline: Duration) -> Closed {
        {
            let mut q = self.lock();
            if !q.closed {
                q.closed = true;
                let end = q.chain.blank("end", SystemTime::now());
                let end = q.chain.link(end);
                q.rows.push_back(end);
            }
        }
        self.bell.notify_one();
        let until = Instant::now() + deadline;
        // A writer never opened has a database whose schema was never checked: nothing is written to it.
        while self.is_open() && self.pending() > 0 && Instant::now() < until {
            if let Err(e) = self.flush_once().await {
                tracing::warn!(error = %e, queued = self.pending(), "audit batch not written during the drain");
                tokio::time::sleep(Duration::from_millis(200).min(until.saturating_duration_since(Instant::now())))
                    .await;
            }
        }
        let mut q = self.lock();
        let left = q.rows.len();
        if left > 0 {
            self.metrics.dropped.inc_by(left as u64);
            q.rows.clear();
            tracing::error!(dropped = left, "audit rows not written before the drain deadline");
        }
        Closed { dropped: left }
    }
}

impl Writer {
    /// Queues the row `fill` makes of a blank one of `kind`, behind a `dropped` row when records were dropped
    /// since the last one queued; counts it as dropped when the buffer is full or the writer closed.
    fn queue(&self, kind: &'static str, at: SystemTime, fill: impl FnOnce(&mut Row)) {
        let mut q = self.lock();
        // Room for the record, and for the `dropped` row in front of it when there is one to write.
        let need = if q.dropped > 0 { 2 } else { 1 };
        if q.closed || q.rows.len() + q.in_flight + need > self.cfg.buffer {
            q.dropped += 1;
            self.metrics.dropped.inc();
            return;
        }
        if q.dropped > 0 {
            let mut gap = q.chain.blank("dropped", at);
            gap.dropped = Some(i64::try_from(q.dropped).unwrap_or(i64::MAX));
            let gap = q.chain.link(gap);
            q.rows.push_back(gap);
            q.dropped = 0;
        }
        let mut row = q.chain.blank(kind, at);
        fill(&mut row);
        let row = q.chain.link(row);
        q.rows.push_back(row);
        let depth = q.rows.len();
        drop(q);
        self.metrics.queue_depth.set(i64::try_from(depth).unwrap_or(i64::MAX));
        if depth == self.cfg.batch {
            self.bell.notify_one();
        }
    }
}

fn micros_of(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl AuditSink for Writer {
    fn record(&self, r: AuditRecord) {
        self.queue("call", r.at, |row| {
            row.principal = Some(r.principal);
            row.client_id = r.client_id;
            row.tool = Some(r.tool);
            row.outcome = Some(std::borrow::Cow::Borrowed(r.outcome));
            row.duration_us = Some(micros_of(r.duration));
            row.trace_id = Some(r.trace_id);
            row.args_sha256 = Some(r.args_sha256);
            row.result_bytes = r.result_bytes.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
            row.generation = Some(std::borrow::Cow::Borrowed(r.generation));
        });
    }

    fn record_downstream(&self, r: DownstreamRecord) {
        let kind = match r.event {
            DownstreamEvent::Exchange => "exchange",
            DownstreamEvent::Authorization => "authorize",
        };
        self.queue(kind, r.at, |row| {
            row.principal = Some(r.principal);
            row.client_id = r.client_id;
            row.tool = Some(r.downstream);
            row.outcome = Some(std::borrow::Cow::Borrowed(r.outcome));
            row.duration_us = Some(micros_of(r.duration));
            row.trace_id = Some(r.trace_id);
            row.detail = r.lifetime.map(|l| format!("lifetime {}s", l.as_secs()));
        });
    }
}

macro_rules! insert_sql {
    () => {
        "INSERT INTO audit_events (chain_id, seq, at, kind, replica, principal, client_id, tool, outcome, \
    duration_us, trace_id, args_sha256, result_bytes, generation, dropped, prev_hash, hash, detail) \
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::timestamptz[], $4::text[], $5::text[], $6::text[], \
    $7::text[], $8::text[], $9::text[], $10::bigint[], $11::text[], $12::text[], $13::bigint[], $14::text[], \
    $15::bigint[], $16::bytea[], $17::bytea[], $18::text[])"
    };
}
const INSERT: &str = insert_sql!();
const INSERT_AGAIN: &str = concat!(insert_sql!(), " ON CONFLICT DO NOTHING");

/// One multi-row insert of `rows` (borrowed: nothing is copied but into the message).
/// A retry (`again`) skips the rows an earlier attempt did write.
pub(crate) async fn insert(db: &Database, rows: &[Row], again: bool) -> Result<u64, DbError> {
    let c = db.get().await?;
    let sql = if again { INSERT_AGAIN } else { INSERT };
    let stmt = c.prepare_cached(sql).await.map_err(|e| DbError::of(&e))?;
    insert_with(&**c, &stmt, rows).await
}

/// Inserts `rows` in a transaction of the caller's (a policy change and its audit rows commit together).
pub(crate) async fn insert_in(tx: &tokio_postgres::Transaction<'_>, rows: &[Row]) -> Result<u64, DbError> {
    let stmt = tx.prepare(INSERT).await.map_err(|e| DbError::of(&e))?;
    insert_with(tx, &stmt, rows).await
}

async fn insert_with(
    c: &impl tokio_postgres::GenericClient,
    stmt: &tokio_postgres::Statement,
    rows: &[Row],
) -> Result<u64, DbError> {
    let text = |f: fn(&Row) -> Option<&str>| rows.iter().map(f).collect::<Vec<_>>();
    let int = |f: fn(&Row) -> Option<i64>| rows.iter().map(f).collect::<Vec<_>>();
    let chain = text(|r| Some(&*r.chain_id));
    let seq = int(|r| Some(r.seq));
    let at: Vec<SystemTime> = rows.iter().map(|r| r.at).collect();
    let kind = text(|r| Some(r.kind));
    let replica = text(|r| Some(&*r.replica));
    let principal = text(|r| r.principal.as_deref());
    let client = text(|r| r.client_id.as_deref());
    let tool = text(|r| r.tool.as_deref());
    let outcome = text(|r| r.outcome.as_deref());
    let duration = int(|r| r.duration_us);
    let trace = text(|r| r.trace_id.as_deref());
    let args = text(|r| r.args_sha256.as_deref());
    let size = int(|r| r.result_bytes);
    let generation = text(|r| r.generation.as_deref());
    let dropped = int(|r| r.dropped);
    let detail = text(|r| r.detail.as_deref());
    let prev: Vec<&[u8]> = rows.iter().map(|r| &r.prev_hash[..]).collect();
    let hash: Vec<&[u8]> = rows.iter().map(|r| &r.hash[..]).collect();
    c.execute(
        stmt,
        &[
            &chain,
            &seq,
            &at,
            &kind,
            &replica,
            &principal,
            &client,
            &tool,
            &outcome,
            &duration,
            &trace,
            &args,
            &size,
            &generation,
            &dropped,
            &prev,
            &hash,
            &detail,
        ],
    )
    .await
    .map_err(|e| DbError::of(&e))
}
