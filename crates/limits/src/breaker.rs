//! The circuit breaker of admissions: after `breaker_threshold` store failures in a row, admissions skip the store
//! for `breaker_cooldown` (503, or the fail-open bucket), then try again.

use crate::LimitsConfig;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use tokio::time::Instant;

/// Stops calling a failing store for a moment: after `breaker_threshold` failures in a row, admissions skip the
/// store for `breaker_cooldown`, then try again.
#[derive(Debug, Default)]
pub(crate) struct Breaker {
    failures: AtomicU32,
    open_until: Mutex<Option<Instant>>,
}

impl Breaker {
    pub(crate) fn is_open(&self, now: Instant) -> bool {
        let g = self.open_until.lock().unwrap_or_else(PoisonError::into_inner);
        g.is_some_and(|t| t > now)
    }

    pub(crate) fn failure(&self, now: Instant, cfg: &LimitsConfig) {
        if self.failures.fetch_add(1, Ordering::Relaxed) + 1 >= cfg.breaker_threshold {
            *self.open_until.lock().unwrap_or_else(PoisonError::into_inner) = Some(now + cfg.breaker_cooldown);
            tracing::warn!(
                cooldown_ms = cfg.breaker_cooldown.as_millis(),
                "limits store failing; circuit breaker open"
            );
        }
    }

    pub(crate) fn success(&self) {
        if self.failures.swap(0, Ordering::Relaxed) > 0 {
            *self.open_until.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
    }
}
