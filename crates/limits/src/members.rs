//! Fleet membership: how many replicas share the limits, for the fail-open bucket's share (capacity ÷ replicas).
//! Each replica renews a record of its own in the store every [`BEAT`], with a TTL of [`RECORD_TTL`], off the
//! request path, and keeps the live count the store answers. While the store is away the last count stands (the
//! fail-open bucket is used exactly then). `--replicas` is a floor: the share divides by the larger of the two.

use mcpfleet_state::LimitStore;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How often a replica renews its record.
pub const BEAT: Duration = Duration::from_secs(5);
/// How long a record lives without renewal: a replica that died stops counting after this.
pub const RECORD_TTL: Duration = Duration::from_secs(15);

/// The live replica count, as this replica last heard it (0 until the first answer).
#[derive(Debug)]
pub(crate) struct Members {
    me: String,
    store: Arc<dyn LimitStore>,
    live: AtomicU32,
    /// Set by [`leave`](Self::leave): the record is not renewed again.
    left: AtomicBool,
}

impl Members {
    /// Starts renewing this replica's record (under a random id), when there is a runtime to run it on.
    pub(crate) fn start(store: Arc<dyn LimitStore>, gauge: prometheus::IntGauge) -> Arc<Self> {
        let me = format!("{:032x}", rand::random::<u128>());
        let members = Arc::new(Self { me, store, live: AtomicU32::new(0), left: AtomicBool::new(false) });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(beat(Arc::downgrade(&members), gauge));
        }
        members
    }

    /// Removes this replica's record at once (a drain), so that the others stop counting it at their next beat
    /// instead of after the record's TTL. Best effort, within `deadline`.
    pub(crate) async fn leave(&self, deadline: Duration) {
        self.left.store(true, Ordering::Release);
        // A connection that Redis just dropped fails the first try: retry until the deadline.
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, self.store.heartbeat(&self.me, Duration::ZERO)).await {
                Ok(Ok(_)) => return tracing::debug!("membership record removed"),
                Ok(Err(_)) if !left.is_zero() => tokio::time::sleep(Duration::from_millis(100).min(left)).await,
                _ => return tracing::debug!("membership record not removed: it expires on its own"),
            }
        }
    }

    /// The replicas sharing the limits: the live count, at least `floor`.
    pub(crate) fn count(&self, floor: u32) -> u32 {
        self.live.load(Ordering::Acquire).max(floor).max(1)
    }
}

async fn beat(members: Weak<Members>, gauge: prometheus::IntGauge) {
    let mut tick = tokio::time::interval(BEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(m) = members.upgrade() else { return };
        if m.left.load(Ordering::Acquire) {
            return;
        }
        match tokio::time::timeout(BEAT, m.store.heartbeat(&m.me, RECORD_TTL)).await {
            Ok(Ok(n)) => {
                let n = u32::try_from(n).unwrap_or(u32::MAX);
                let was = m.live.swap(n, Ordering::AcqRel);
                if was != n {
                    tracing::info!(replicas = n, was, "fleet membership changed");
                }
                gauge.set(i64::from(n));
            }
            // The last count stands while the store is away.
            Ok(Err(e)) => tracing::debug!(error = %e, "membership record not renewed"),
            Err(_) => tracing::debug!("membership record not renewed in time"),
        }
    }
}
