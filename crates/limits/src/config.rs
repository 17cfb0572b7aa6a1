//! What the operator sets: the bucket, the quotas, the caps and the failure policy. Parsed by the server's config
//! module; the syntax of quotas and durations (`10/1h`, `250ms`) is `mcpfleet_core`'s.

pub use mcpfleet_core::{Quota, parse_duration};
use std::collections::BTreeMap;
use std::time::Duration;

/// The per-principal token bucket of the transport.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    /// Requests a principal may make at once (the bucket's capacity).
    pub burst: u32,
    /// Tokens added per second.
    pub per_second: f64,
}

impl RateLimit {
    /// The window of the `RateLimit-Policy` header: how long an empty bucket takes to fill, in whole seconds.
    #[must_use]
    pub fn window_secs(&self) -> u64 {
        whole_secs(f64::from(self.burst) / self.per_second)
    }

    /// The bucket's state for the headers: `remaining` requests, `reset` seconds.
    #[must_use]
    pub fn status(&self, remaining: u64, reset: u64) -> crate::RateStatus {
        crate::RateStatus { limit: self.burst, window: self.window_secs(), remaining, reset }
    }
}

pub(crate) fn whole_secs(s: f64) -> u64 {
    // Saturating float-to-int conversion: a NaN or negative value is 0.
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "clamped and saturating")]
    let n = s.ceil().max(0.0) as u64;
    n
}

/// What the transport bucket does when the store cannot answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailMode {
    /// Refuse with 503 and `Retry-After` (the default): a limit nobody can check is not a limit.
    #[default]
    Closed,
    /// Decide on a local per-replica bucket of capacity ÷ replicas, and count every such decision. Session checks,
    /// caps and quotas still fail closed.
    Open,
}

/// Every limit, as the operator configured it.
#[derive(Clone, Debug)]
pub struct LimitsConfig {
    /// The numbers of the flags (`--rate-*`, `--quota`, `--max-*-per-user`): the default plan, and what a policy's
    /// plan leaves out.
    pub plan: PlanLimits,
    pub fail_mode: FailMode,
    /// How many replicas share the limits: the fail-open bucket is capacity ÷ replicas.
    pub replicas: u32,
    /// How long a stream's or call's slot lasts without renewal: a dead replica's slots are free after this.
    pub slot_ttl: Duration,
    /// After this many store failures in a row, admission stops calling the store for `breaker_cooldown`.
    pub breaker_threshold: u32,
    pub breaker_cooldown: Duration,
}

/// The numbers one principal is held to: the flags' (the default plan), or its plan's in a policy document
/// (docs/POLICY.md), where a number the plan leaves out is the flag's.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanLimits {
    /// `None`: no bucket (`--rate-burst 0`).
    pub rate: Option<RateLimit>,
    /// Quotas by tool, over the tools' own (`--quota TOOL=LIMIT/WINDOW`); `None` lifts a tool's quota
    /// (`--quota TOOL=off`).
    pub quotas: BTreeMap<String, Option<Quota>>,
    /// Open sessions; 0 means no cap.
    pub max_sessions: u64,
    /// Open SSE streams (GET); 0 means no cap.
    pub max_streams: u64,
    /// Tool calls in flight; 0 means no cap.
    pub max_inflight: u64,
    /// Open tasks (tasks extension); 0 means no cap.
    pub max_tasks: u64,
}

impl PlanLimits {
    /// The quota that applies to `tool`: the plan's (or the operator's `--quota`), else the tool's own.
    #[must_use]
    pub fn quota_for(&self, tool: &str, declared: Option<Quota>) -> Option<Quota> {
        match self.quotas.get(tool) {
            Some(q) => *q,
            None => declared,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            plan: PlanLimits {
                rate: Some(RateLimit { burst: 60, per_second: 1.0 }),
                quotas: BTreeMap::new(),
                max_sessions: 64,
                max_streams: 16,
                max_inflight: 16,
                max_tasks: 32,
            },
            fail_mode: FailMode::Closed,
            replicas: 1,
            slot_ttl: Duration::from_secs(6),
            breaker_threshold: 3,
            breaker_cooldown: Duration::from_secs(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_of_a_bucket_is_its_fill_time() {
        assert_eq!(RateLimit { burst: 60, per_second: 1.0 }.window_secs(), 60);
        assert_eq!(RateLimit { burst: 5, per_second: 2.0 }.window_secs(), 3);
    }
}
