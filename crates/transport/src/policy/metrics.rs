//! The `mcp_policy_*` metrics (docs/OPERATIONS.md): the version in force and the newest seen, load failures, and
//! what the rules refused or would have.

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

/// The policy's metrics on one replica.
#[derive(Clone, Debug)]
pub struct PolicyMetrics {
    /// `mcp_policy_version`: the version in force here (0: none, the flags).
    pub version: IntGauge,
    /// `mcp_policy_latest_version`: the newest version this replica has seen in the store; above
    /// `mcp_policy_version` while a version it could not load is the latest.
    pub latest: IntGauge,
    /// `mcp_policy_load_failures_total{reason}`: `invalid` (a stored version this build refuses), `store` (the
    /// store did not answer a read).
    pub load_failures: IntCounterVec,
    refusals: IntCounterVec,
    would_refuse: IntCounterVec,
    would_assign: IntCounterVec,
}

impl PolicyMetrics {
    /// Registers the metrics in `registry`.
    ///
    /// # Errors
    /// A metric of the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self::unregistered()?;
        registry.register(Box::new(m.version.clone()))?;
        registry.register(Box::new(m.latest.clone()))?;
        registry.register(Box::new(m.load_failures.clone()))?;
        registry.register(Box::new(m.refusals.clone()))?;
        registry.register(Box::new(m.would_refuse.clone()))?;
        registry.register(Box::new(m.would_assign.clone()))?;
        Ok(m)
    }

    /// The metrics, registered nowhere.
    ///
    /// # Errors
    /// Never with these names; prometheus's constructors return a `Result`.
    pub fn unregistered() -> prometheus::Result<Self> {
        let counter = |name: &str, help: &str, labels: &[&str]| IntCounterVec::new(Opts::new(name, help), labels);
        let m = Self {
            version: IntGauge::new(
                "mcp_policy_version",
                "The policy version in force on this replica (0: none, the flags).",
            )?,
            latest: IntGauge::new(
                "mcp_policy_latest_version",
                "The newest policy version this replica has seen in the store.",
            )?,
            load_failures: counter(
                "mcp_policy_load_failures_total",
                "Policy versions this replica could not load (invalid) or read (store); it kept the last good one.",
                &["reason"],
            )?,
            refusals: counter(
                "mcp_policy_refusals_total",
                "Tool calls the policy refused, by plan and rule (tools.allow, or tools.conditions.N).",
                &["plan", "rule"],
            )?,
            would_refuse: counter(
                "mcp_policy_would_refuse_total",
                "Tool calls a dry-run condition would have refused (they went on), by plan and rule.",
                &["plan", "rule"],
            )?,
            would_assign: counter(
                "mcp_policy_would_assign_total",
                "Principals a dry-run assignment rule would have given its plan, by rule (assign.N).",
                &["rule"],
            )?,
        };
        for reason in ["invalid", "store"] {
            m.load_failures.with_label_values(&[reason]);
        }
        Ok(m)
    }

    pub(crate) fn refused(&self, plan: &str, rule: &str) {
        self.refusals.with_label_values(&[plan, rule]).inc();
    }

    pub(crate) fn would_refuse(&self, plan: &str, rule: &str) {
        self.would_refuse.with_label_values(&[plan, rule]).inc();
    }

    pub(crate) fn would_assign(&self, rule: &str) {
        self.would_assign.with_label_values(&[rule]).inc();
    }
}
