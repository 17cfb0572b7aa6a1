//! Quotas a tenant's principals share (docs/POLICY.md, "tenants"), beside each principal's own: both must admit.
//!
//! A principal's keys share its hash tag, so a tenant's counter cannot ride in the admission script on Redis
//! Cluster. Instead each replica leases a slice of the tenant's window off the request path and spends it locally
//! ([`TenantLeases`]): a call costs no store round trip while its replica holds a unit, and one lease round trip
//! when it holds none. The store never grants more than the window has left, so the fleet never admits more than
//! the limit; what it may do is refuse early, while other replicas hold units they have not spent: at most
//! [`slice`] units per replica, until the window ends.

use crate::Quota;
use mcpfleet_state::LimitStore;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// How many uses a replica leases at a time: an eighth of the limit shared by the live replicas, at least one.
#[must_use]
pub fn slice(limit: u64, replicas: u64) -> u64 {
    (limit / (8 * replicas.max(1))).max(1)
}

/// A replica's units of one tenant's window.
#[derive(Debug)]
struct Held {
    /// Units leased and not spent.
    units: u64,
    /// When the window ends (the units lapse with it).
    ends: Instant,
    /// The window has nothing left: refused locally until it ends.
    exhausted: bool,
}

/// What a tenant's window said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantDecision {
    /// A unit was taken.
    Taken,
    /// The window is used up: try again in this long.
    Exhausted(Duration),
}

/// The tenants' units held on this replica, by (tenant, tool).
#[derive(Debug, Default)]
pub(crate) struct TenantLeases {
    held: Mutex<HashMap<(String, String), Held>>,
}

impl TenantLeases {
    fn try_local(&self, key: &(String, String), now: Instant) -> Option<TenantDecision> {
        let mut g = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let h = g.get_mut(key)?;
        if h.ends <= now {
            g.remove(key);
            return None;
        }
        if h.units > 0 {
            h.units -= 1;
            return Some(TenantDecision::Taken);
        }
        h.exhausted.then(|| TenantDecision::Exhausted(h.ends - now))
    }

    /// Takes a unit of `tenant`'s window of `tool`: from this replica's slice, or from a new lease.
    pub(crate) async fn take(
        &self,
        store: &dyn LimitStore,
        tenant: &str,
        tool: &str,
        quota: Quota,
        replicas: u64,
    ) -> mcpfleet_state::Result<TenantDecision> {
        let key = (tenant.to_owned(), tool.to_owned());
        if let Some(d) = self.try_local(&key, Instant::now()) {
            return Ok(d);
        }
        let want = slice(quota.limit, replicas);
        let (granted, left) = store.lease_window(tenant, tool, want, quota.limit, quota.window).await?;
        let now = Instant::now();
        let mut g = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let h = g.entry(key).or_insert(Held { units: 0, ends: now + left, exhausted: false });
        h.ends = now + left;
        h.units += granted;
        if h.units == 0 {
            h.exhausted = true;
            return Ok(TenantDecision::Exhausted(left));
        }
        h.exhausted = false;
        h.units -= 1;
        Ok(TenantDecision::Taken)
    }

    /// Gives back a unit taken for a call that was then refused (by the principal's own limits).
    pub(crate) fn give_back(&self, tenant: &str, tool: &str) {
        let mut g = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = g.get_mut(&(tenant.to_owned(), tool.to_owned())) {
            h.units += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::slice;

    #[test]
    fn a_slice_is_an_eighth_of_each_replicas_share() {
        assert_eq!(slice(1000, 1), 125);
        assert_eq!(slice(1000, 3), 41);
        assert_eq!(slice(10, 3), 1);
        assert_eq!(slice(1, 0), 1);
    }
}
