//! The one retry pause for writes the store must take before a caller moves on (an event's commit, a response's,
//! a task's end): doubling from 100 ms to 2 s, within a limit.

use mcpfleet_state::StateError;
use std::time::Duration;

/// The retries of a commit through a store outage: pauses from 100 ms doubling to 2 s, for up to a limit.
pub(crate) struct Backoff {
    give_up: tokio::time::Instant,
    next: Duration,
}

impl Backoff {
    pub(crate) fn for_up_to(limit: Duration) -> Self {
        Self { give_up: tokio::time::Instant::now() + limit, next: Duration::from_millis(100) }
    }

    /// Waits before the next try of committing `what`, which failed with `e`; false when the limit would be
    /// passed (no wait then).
    pub(crate) async fn wait(&mut self, what: &str, e: &StateError) -> bool {
        if tokio::time::Instant::now() + self.next >= self.give_up {
            return false;
        }
        tracing::warn!(error = %e, "{what} not committed yet; retrying");
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(Duration::from_secs(2));
        true
    }
}
