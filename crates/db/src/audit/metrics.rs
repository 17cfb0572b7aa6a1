//! The audit trail's and the pool's metrics (documented in docs/METRICS.md).

use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Registry};

/// Cheap to clone: the collectors are shared.
#[derive(Clone, Debug)]
pub struct DbMetrics {
    pub(crate) queue_depth: IntGauge,
    pub(crate) batch_rows: Histogram,
    pub(crate) flush_seconds: Histogram,
    pub(crate) written: IntCounter,
    pub(crate) dropped: IntCounter,
    pub(crate) flush_errors: IntCounter,
    pub(crate) up: IntGauge,
    pub(crate) pool_size: IntGauge,
    pub(crate) pool_available: IntGauge,
    pub(crate) pool_waiting: IntGauge,
}

impl DbMetrics {
    /// Creates the metrics and registers them with `registry`.
    ///
    /// # Errors
    /// A metric of the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let gauge = |name: &str, help: &str| IntGauge::new(name, help);
        let counter = |name: &str, help: &str| IntCounter::new(name, help);
        let m = Self {
            queue_depth: gauge("mcp_audit_queue_depth", "Audit records waiting in this replica's queue.")?,
            batch_rows: Histogram::with_opts(
                HistogramOpts::new("mcp_audit_batch_rows", "Rows per audit batch written to the database.")
                    .buckets(vec![1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0]),
            )?,
            flush_seconds: Histogram::with_opts(
                HistogramOpts::new("mcp_audit_flush_duration_seconds", "Duration of one audit batch insert.")
                    .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
            )?,
            written: counter("mcp_audit_written_total", "Audit rows written to the database (chain rows included).")?,
            dropped: counter(
                "mcp_audit_dropped_total",
                "Audit records dropped: the queue was full (database down or slow), or the drain ran out of time.",
            )?,
            flush_errors: counter("mcp_audit_flush_errors_total", "Audit batch inserts that failed (retried).")?,
            up: gauge("mcp_db_up", "1 when the last database health check (every 5 s) succeeded, else 0.")?,
            pool_size: gauge("mcp_db_pool_connections", "Connections open in this replica's database pool.")?,
            pool_available: gauge("mcp_db_pool_idle", "Idle connections in this replica's database pool.")?,
            pool_waiting: gauge("mcp_db_pool_waiting", "Tasks waiting for a database connection.")?,
        };
        registry.register(Box::new(m.queue_depth.clone()))?;
        registry.register(Box::new(m.batch_rows.clone()))?;
        registry.register(Box::new(m.flush_seconds.clone()))?;
        registry.register(Box::new(m.written.clone()))?;
        registry.register(Box::new(m.dropped.clone()))?;
        registry.register(Box::new(m.flush_errors.clone()))?;
        registry.register(Box::new(m.up.clone()))?;
        registry.register(Box::new(m.pool_size.clone()))?;
        registry.register(Box::new(m.pool_available.clone()))?;
        registry.register(Box::new(m.pool_waiting.clone()))?;
        Ok(m)
    }

    /// Unregistered metrics, for the command-line tools.
    ///
    /// # Errors
    /// Never in practice (a fresh registry); the signature is prometheus's.
    pub fn detached() -> prometheus::Result<Self> {
        Self::register(&Registry::new())
    }
}

/// Samples the pool and checks the database (`SELECT 1`) every 5 s, until `stop` fires: `mcp_db_up` and the
/// pool gauges.
pub async fn watch_pool(db: crate::Database, m: DbMetrics, stop: tokio_util::sync::CancellationToken) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let up = db.ping().await;
        if let Err(e) = &up
            && m.up.get() == 1
        {
            tracing::warn!(error = %e, database = %db.target(), "database health check failed");
        }
        m.up.set(i64::from(up.is_ok()));
        let s = db.pool().status();
        m.pool_size.set(i64::try_from(s.size).unwrap_or(i64::MAX));
        m.pool_available.set(i64::try_from(s.available).unwrap_or(i64::MAX));
        m.pool_waiting.set(i64::try_from(s.waiting).unwrap_or(i64::MAX));
    }
}
