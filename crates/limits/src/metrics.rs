//! The limits' metrics, documented in docs/METRICS.md. Labels are bounded: a limit kind, an outcome, a reason;
//! never a principal or a tool.

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

/// The kinds of limit, as the `kind` label spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Rate,
    Quota,
    Sessions,
    Streams,
    Inflight,
    Tasks,
    /// A quota a tenant's principals share (decided on a replica's leased units).
    Tenant,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Self; 7] =
        [Self::Rate, Self::Quota, Self::Sessions, Self::Streams, Self::Inflight, Self::Tasks, Self::Tenant];

    /// The outcomes [`Limiter`](crate::Limiter) can record for this kind: only the bucket is ever decided from
    /// the over-limit cache or not at all, and the task cap is counted only when the store refuses a task.
    #[must_use]
    pub fn outcomes(self) -> &'static [&'static str] {
        match self {
            Self::Rate => &["allowed", "denied", "denied_cached", "unavailable"],
            Self::Quota | Self::Sessions | Self::Streams | Self::Inflight | Self::Tenant => &["allowed", "denied"],
            Self::Tasks => &["denied"],
        }
    }

    /// Whether an allowed decision of this kind knows how much of the limit it left used: the kinds of
    /// `mcp_limit_near_limit_total` and `mcp_limit_exhausted_total`.
    #[must_use]
    pub fn measures_use(self) -> bool {
        matches!(self, Self::Rate | Self::Quota | Self::Streams | Self::Inflight)
    }

    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Rate => "rate",
            Self::Quota => "quota",
            Self::Sessions => "sessions",
            Self::Streams => "streams",
            Self::Inflight => "inflight",
            Self::Tasks => "tasks",
            Self::Tenant => "tenant",
        }
    }
}

/// The reasons of `mcp_limit_store_failures_total`.
const STORE_FAILURES: [&str; 3] = ["timeout", "error", "breaker_open"];

/// Limit metrics. Cheap to clone.
#[derive(Clone, Debug)]
pub struct LimitMetrics {
    decisions: IntCounterVec,
    near: IntCounterVec,
    exhausted: IntCounterVec,
    store_failures: IntCounterVec,
    fail_open: IntCounterVec,
    replicas: IntGauge,
}

impl LimitMetrics {
    /// Creates the metrics and registers them with `registry`, every series that can occur exported at 0.
    ///
    /// # Errors
    /// A metric of the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self::unregistered()?;
        registry.register(Box::new(m.decisions.clone()))?;
        registry.register(Box::new(m.near.clone()))?;
        registry.register(Box::new(m.exhausted.clone()))?;
        registry.register(Box::new(m.store_failures.clone()))?;
        registry.register(Box::new(m.fail_open.clone()))?;
        registry.register(Box::new(m.replicas.clone()))?;
        Ok(m)
    }

    /// Metrics that nobody scrapes (tests, tools).
    ///
    /// # Errors
    /// Never in practice: the names are valid.
    pub fn unregistered() -> prometheus::Result<Self> {
        let m = Self::new()?;
        for kind in Kind::ALL {
            for outcome in kind.outcomes() {
                m.decisions.with_label_values(&[kind.label(), outcome]);
            }
            if kind.measures_use() {
                m.near.with_label_values(&[kind.label()]);
                m.exhausted.with_label_values(&[kind.label()]);
            }
        }
        for reason in STORE_FAILURES {
            m.store_failures.with_label_values(&[reason]);
        }
        for outcome in ["allowed", "denied"] {
            m.fail_open.with_label_values(&[outcome]);
        }
        Ok(m)
    }

    fn new() -> prometheus::Result<Self> {
        Ok(Self {
            decisions: IntCounterVec::new(
                Opts::new(
                    "mcp_limit_decisions_total",
                    "Limit decisions by kind (rate, quota, tenant, sessions, streams, inflight, tasks) and outcome: allowed, denied \
                     (by the shared state), denied_cached (refused locally until a known time, no store call), \
                     unavailable (the store could not decide: 503).",
                ),
                &["kind", "outcome"],
            )?,
            near: IntCounterVec::new(
                Opts::new(
                    "mcp_limit_near_limit_total",
                    "Allowed decisions that left a principal's limit at least 80 % used, by kind.",
                ),
                &["kind"],
            )?,
            exhausted: IntCounterVec::new(
                Opts::new(
                    "mcp_limit_exhausted_total",
                    "Allowed decisions that used a principal's last unit (the next one is refused), by kind.",
                ),
                &["kind"],
            )?,
            store_failures: IntCounterVec::new(
                Opts::new(
                    "mcp_limit_store_failures_total",
                    "Admissions the store could not answer, by reason: timeout, error, breaker_open (skipped while \
                     the circuit breaker is open after repeated failures).",
                ),
                &["reason"],
            )?,
            fail_open: IntCounterVec::new(
                Opts::new(
                    "mcp_limit_fail_open_total",
                    "Rate decisions taken on the local per-replica bucket because the store could not answer \
                     (--rate-fail-mode open), by outcome: allowed or denied. Alert on any.",
                ),
                &["outcome"],
            )?,
            replicas: IntGauge::new(
                "mcp_fleet_replicas",
                "Replicas with a live membership record, as this replica last read it (0 until the first read); \
                 the fail-open bucket is capacity ÷ max(this, --replicas).",
            )?,
        })
    }

    /// `mcp_fleet_replicas`, for the membership task.
    pub(crate) fn replicas_gauge(&self) -> IntGauge {
        self.replicas.clone()
    }

    pub(crate) fn decision(&self, kind: Kind, outcome: &str) {
        debug_assert!(kind.outcomes().contains(&outcome), "{outcome} is not an outcome of {kind:?}");
        self.decisions.with_label_values(&[kind.label(), outcome]).inc();
    }

    /// An allowed decision that left `used` of `limit` used.
    pub(crate) fn allowed(&self, kind: Kind, used: f64, limit: f64) {
        self.decision(kind, "allowed");
        debug_assert!(kind.measures_use(), "{kind:?} does not measure its use");
        if limit > 0.0 && used >= 0.8 * limit {
            self.near.with_label_values(&[kind.label()]).inc();
        }
        if limit > 0.0 && limit - used < 1.0 {
            self.exhausted.with_label_values(&[kind.label()]).inc();
        }
    }

    pub(crate) fn store_failure(&self, reason: &str) {
        debug_assert!(STORE_FAILURES.contains(&reason), "{reason} is not a store failure reason");
        self.store_failures.with_label_values(&[reason]).inc();
    }

    pub(crate) fn fail_open(&self, allowed: bool) {
        self.fail_open.with_label_values(&[if allowed { "allowed" } else { "denied" }]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_that_can_occur_is_exported_at_zero_from_the_start() {
        let registry = Registry::new();
        LimitMetrics::register(&registry).expect("register");
        let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather()).expect("encode");
        let lines = |prefix: &str| text.lines().filter(|l| l.starts_with(prefix) && l.ends_with(" 0")).count();
        // rate: 4 outcomes; quota, sessions, streams, inflight, tenant: 2 each; tasks: denied only.
        assert_eq!(lines("mcp_limit_decisions_total{"), 15, "{text}");
        assert!(text.contains(r#"mcp_limit_decisions_total{kind="tenant",outcome="denied"} 0"#));
        assert!(text.contains(r#"mcp_limit_decisions_total{kind="tasks",outcome="denied"} 0"#));
        assert!(!text.contains(r#"mcp_limit_decisions_total{kind="tasks",outcome="allowed"}"#));
        assert_eq!(lines("mcp_limit_near_limit_total{"), 4);
        assert_eq!(lines("mcp_limit_exhausted_total{"), 4);
        assert!(!text.contains(r#"mcp_limit_exhausted_total{kind="sessions"}"#));
        assert_eq!(lines("mcp_limit_store_failures_total{"), 3);
        assert_eq!(lines("mcp_limit_fail_open_total{"), 2);
    }
}
