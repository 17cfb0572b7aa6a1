//! The state crate's metrics: how long each Redis command takes and how often it fails, by command kind (the Lua
//! script or command name, a fixed set). Documented in docs/METRICS.md.

use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry};
use std::time::Duration;

/// Redis command metrics. Cheap to clone (the vectors are shared).
#[derive(Clone, Debug)]
pub struct StoreMetrics {
    duration: HistogramVec,
    errors: IntCounterVec,
    master_changes: IntCounter,
    unreplicated: IntCounter,
}

impl StoreMetrics {
    /// Creates the metrics and registers them with `registry`.
    ///
    /// # Errors
    /// A metric of the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "mcp_redis_command_duration_seconds",
                "Duration of one Redis command or script, from the replica's side, by kind.",
            )
            .buckets(vec![0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]),
            &["kind"],
        )?;
        let errors = IntCounterVec::new(
            Opts::new("mcp_redis_errors_total", "Redis commands that failed or missed their deadline, by kind."),
            &["kind"],
        )?;
        let master_changes = IntCounter::new(
            "mcp_redis_master_changes_total",
            "Times this replica followed a new Redis master the sentinels named (Sentinel mode).",
        )?;
        let unreplicated = IntCounter::new(
            "mcp_redis_unreplicated_writes_total",
            "Durable writes (a task's creation, queue entry, run lease or end; an idempotent call's result) that \
             fewer Redis replicas acknowledged than --redis-durable-replicas asks, within half the Redis deadline; \
             the write stands, but a failover now may lose it.",
        )?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(master_changes.clone()))?;
        registry.register(Box::new(unreplicated.clone()))?;
        Ok(Self { duration, errors, master_changes, unreplicated })
    }

    /// The replica followed a new master.
    pub fn master_changed(&self) {
        self.master_changes.inc();
    }

    /// A durable write was acknowledged by fewer replicas than asked.
    pub fn unreplicated(&self) {
        self.unreplicated.inc();
    }

    /// Records one command.
    pub fn observe(&self, kind: &'static str, took: Duration, ok: bool) {
        self.duration.with_label_values(&[kind]).observe(took.as_secs_f64());
        if !ok {
            self.errors.with_label_values(&[kind]).inc();
        }
    }
}
