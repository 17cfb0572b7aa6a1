//! The state crate's metrics: how long each Redis command takes and how often it fails, by command kind (the Lua
//! script or command name, a fixed set). Documented in docs/METRICS.md.

use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};
use std::time::Duration;

/// Every `kind` the Redis store times: its Lua scripts, the plain commands it sends outside them, `WAIT` and
/// `PING`. Each is exported at 0 from the start; a kind missing here fails a debug build's first use of it.
const KINDS: [&str; 47] = [
    // The session and limit scripts.
    "admit",
    "slot",
    "refund",
    "open",
    "append",
    "renew",
    "state",
    "abandon",
    "replay",
    "delete",
    "deliver",
    "take",
    "forget",
    "cancel",
    "cancelled",
    "set_level",
    "idem",
    "members",
    "layouts",
    "declare",
    "policy",
    "revoke",
    "revoked",
    "lease",
    "grant",
    // The task scripts.
    "task_create",
    "task_update",
    "task_cancel",
    "task_start",
    "task_ask",
    "task_finish",
    "task_requeue",
    "task_lease",
    "task_enqueue",
    "task_dequeue",
    "task_settle",
    "task_renew",
    "task_expired",
    "task_stats",
    "task_tidy",
    // Plain commands.
    "task_get",
    "task_check",
    "task_release",
    "publish",
    "wait",
    "ping",
    "info",
];

/// Redis command metrics. Cheap to clone (the vectors are shared).
#[derive(Clone, Debug)]
pub struct StoreMetrics {
    duration: HistogramVec,
    errors: IntCounterVec,
    master_changes: IntCounter,
    unreplicated: IntCounter,
    policies: IntGaugeVec,
    admissions: IntCounter,
}

impl StoreMetrics {
    /// Creates the metrics and registers them with `registry`, every kind of [`KINDS`] at 0.
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
        let policies = IntGaugeVec::new(
            Opts::new(
                "mcp_redis_maxmemory_policy",
                "1 for each maxmemory-policy the store's Redis nodes run (policy=\"unknown\" when INFO is refused or \
                 fails); any policy but noeviction may drop sessions, leases and buckets under memory pressure.",
            ),
            &["policy"],
        )?;
        let admissions = IntCounter::new(
            "mcp_redis_admissions_total",
            "Admissions sent to Redis; per round trip of kind admit, how many ride together (one principal's \
             admissions that are ready at the same moment go in one call).",
        )?;
        registry.register(Box::new(admissions.clone()))?;
        registry.register(Box::new(policies.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(master_changes.clone()))?;
        registry.register(Box::new(unreplicated.clone()))?;
        for kind in KINDS {
            duration.with_label_values(&[kind]);
            errors.with_label_values(&[kind]);
        }
        Ok(Self { duration, errors, master_changes, unreplicated, policies, admissions })
    }

    /// The policies the last check found (`["unknown"]` when it could not tell).
    pub fn eviction_policies(&self, policies: &[String]) {
        self.policies.reset();
        for p in policies {
            self.policies.with_label_values(&[p.as_str()]).set(1);
        }
    }

    /// The replica followed a new master.
    pub fn master_changed(&self) {
        self.master_changes.inc();
    }

    /// A durable write was acknowledged by fewer replicas than asked.
    pub fn unreplicated(&self) {
        self.unreplicated.inc();
    }

    /// `n` admissions went to Redis in one round trip.
    pub fn admissions(&self, n: usize) {
        self.admissions.inc_by(u64::try_from(n).unwrap_or(u64::MAX));
    }

    /// Records one command.
    pub fn observe(&self, kind: &'static str, took: Duration, ok: bool) {
        debug_assert!(KINDS.contains(&kind), "{kind} is missing from KINDS");
        self.duration.with_label_values(&[kind]).observe(took.as_secs_f64());
        if !ok {
            self.errors.with_label_values(&[kind]).inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The kinds the store's sources name where they time a command: `self.run("kind"`, `self.query("kind"`...
    fn kinds_in_sources() -> BTreeSet<&'static str> {
        let sources = [
            include_str!("redis/mod.rs"),
            include_str!("redis/sessions.rs"),
            include_str!("redis/limits.rs"),
            include_str!("redis/idempotency.rs"),
            include_str!("redis/tasks.rs"),
            include_str!("redis/link.rs"),
            include_str!("redis/subscriber.rs"),
            include_str!("redis/policy.rs"),
            include_str!("redis/revocation.rs"),
            include_str!("redis/grants.rs"),
        ];
        let calls = [".run(\"", ".run_pooled(\"", ".query(\"", ".measured(\""];
        let mut out = BTreeSet::new();
        for source in sources {
            for call in calls {
                for rest in source.split(call).skip(1) {
                    out.insert(rest.split('"').next().unwrap_or_default());
                }
            }
        }
        out
    }

    #[test]
    fn kinds_are_the_ones_the_store_times_and_the_docs_list() {
        let kinds: BTreeSet<&str> = KINDS.into_iter().collect();
        assert_eq!(kinds.len(), KINDS.len(), "no kind twice");
        assert_eq!(kinds_in_sources(), kinds, "the kinds the sources time");
        let docs = include_str!("../../../docs/METRICS.md");
        let row = docs
            .lines()
            .find(|l| l.starts_with("| `mcp_redis_command_duration_seconds`"))
            .expect("the docs' row of mcp_redis_command_duration_seconds");
        let documented: BTreeSet<&str> = row
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|w| w.starts_with(|c: char| c.is_ascii_lowercase()))
            .filter(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .filter(|w| *w != "kind" && !w.starts_with("mcp_"))
            .collect();
        assert_eq!(documented, kinds, "the kinds docs/METRICS.md lists");
    }

    #[test]
    fn every_kind_is_exported_at_zero_from_the_start() {
        let registry = Registry::new();
        StoreMetrics::register(&registry).expect("register");
        let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather()).expect("encode");
        for kind in KINDS {
            assert!(text.contains(&format!("mcp_redis_errors_total{{kind=\"{kind}\"}} 0\n")), "{kind}");
            let count = format!("mcp_redis_command_duration_seconds_count{{kind=\"{kind}\"}} 0\n");
            assert!(text.contains(&count), "{kind}");
        }
    }
}
