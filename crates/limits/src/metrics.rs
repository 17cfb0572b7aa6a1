//! The limits' metrics, documented in docs/METRICS.md. Labels are bounded: a limit kind, an outcome, a reason;
//! never a principal or a tool.

use prometheus::{IntCounterVec, Opts, Registry};

/// The kinds of limit, as the `kind` label spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Rate,
    Quota,
    Sessions,
    Streams,
    Inflight,
    Tasks,
}

impl Kind {
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Rate => "rate",
            Self::Quota => "quota",
            Self::Sessions => "sessions",
            Self::Streams => "streams",
            Self::Inflight => "inflight",
            Self::Tasks => "tasks",
        }
    }
}

/// Limit metrics. Cheap to clone.
#[derive(Clone, Debug)]
pub struct LimitMetrics {
    decisions: IntCounterVec,
    near: IntCounterVec,
    exhausted: IntCounterVec,
    store_failures: IntCounterVec,
    fail_open: IntCounterVec,
}

impl LimitMetrics {
    /// Creates the metrics and registers them with `registry`.
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
        Ok(m)
    }

    /// Metrics that nobody scrapes (tests, tools).
    ///
    /// # Errors
    /// Never in practice: the names are valid.
    pub fn unregistered() -> prometheus::Result<Self> {
        Ok(Self {
            decisions: IntCounterVec::new(
                Opts::new(
                    "mcp_limit_decisions_total",
                    "Limit decisions by kind (rate, quota, sessions, streams, inflight, tasks) and outcome: allowed, denied \
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
        })
    }

    pub(crate) fn decision(&self, kind: Kind, outcome: &str) {
        self.decisions.with_label_values(&[kind.label(), outcome]).inc();
    }

    /// An allowed decision that left `used` of `limit` used.
    pub(crate) fn allowed(&self, kind: Kind, used: f64, limit: f64) {
        self.decision(kind, "allowed");
        if limit > 0.0 && used >= 0.8 * limit {
            self.near.with_label_values(&[kind.label()]).inc();
        }
        if limit > 0.0 && limit - used < 1.0 {
            self.exhausted.with_label_values(&[kind.label()]).inc();
        }
    }

    pub(crate) fn store_failure(&self, reason: &str) {
        self.store_failures.with_label_values(&[reason]).inc();
    }

    pub(crate) fn fail_open(&self, allowed: bool) {
        self.fail_open.with_label_values(&[if allowed { "allowed" } else { "denied" }]).inc();
    }
}
