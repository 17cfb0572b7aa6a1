//! Redis's eviction policy, checked off the request path. Nearly every key of the store has a TTL (sessions,
//! leases, buckets, quotas, tasks), so any `maxmemory-policy` but `noeviction` (an `allkeys-*` policy, and every
//! `volatile-*` one) lets Redis drop them under memory pressure: a session vanishes, a lease ends early and a call
//! runs twice, a bucket refills. With `noeviction` a full Redis refuses writes instead, which the fleet answers with
//! 503 and counts. [`watch`] reads the policy at start and every minute, logs an error naming `maxmemory-policy`
//! while it is unsafe, and sets `mcp_redis_maxmemory_policy` (docs/REDIS.md, docs/METRICS.md).

use crate::{Store, StoreMetrics};
use std::sync::Arc;
use std::time::Duration;

/// The one policy that never drops a key.
pub const SAFE_POLICY: &str = "noeviction";

/// How often [`watch`] reads the policy.
pub const CHECK_EVERY: Duration = Duration::from_secs(60);

/// Whether `policy` may drop keys the store needs.
#[must_use]
pub fn may_evict(policy: &str) -> bool {
    policy != SAFE_POLICY
}

/// Reads the eviction policy of `store` now and then every `every`, for the life of the process: sets
/// `mcp_redis_maxmemory_policy`, logs an error for an unsafe policy (at every check, since it is a standing
/// misconfiguration), and says once how to let the ACL user run `INFO` when it may not.
pub async fn watch(store: Arc<dyn Store>, metrics: StoreMetrics, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut said_noperm = false;
    loop {
        tick.tick().await;
        match store.eviction_policies().await {
            Ok(policies) => {
                for p in policies.iter().filter(|p| may_evict(p)) {
                    tracing::error!(
                        maxmemory_policy = %p,
                        "Redis may evict the fleet's keys (sessions, leases, rate buckets) under memory pressure: \
                         set maxmemory-policy to noeviction (docs/REDIS.md)"
                    );
                }
                metrics.eviction_policies(&policies);
            }
            Err(e) => {
                metrics.eviction_policies(&["unknown".to_owned()]);
                if e.is_not_permitted() {
                    if !said_noperm {
                        tracing::warn!(
                            "cannot check Redis's maxmemory-policy: the ACL user may not run INFO; allow it with \
                             `+info` (docs/REDIS.md)"
                        );
                        said_noperm = true;
                    }
                } else {
                    tracing::debug!(error = %e, "cannot check Redis's maxmemory-policy now");
                }
            }
        }
    }
}
