//! The capped slots this replica holds (open streams, calls in flight). One task renews them all, every third of
//! their lease, and frees the slots whose holders ended: a millisecond after the first of them ends (the task
//! wakes when a slot ends; the release goes out beside the answer and never delays it), in one store call per
//! principal and set for whatever ended meanwhile. An admission of the same principal on this replica that comes
//! first takes the ended slots along instead: under load most releases ride on the next call's round trip, which
//! is what the millisecond is for. So a call under the in-flight cap costs one round trip before its answer and at
//! most one after it.

use crate::SlotLease;
use mcpfleet_state::{LimitStore, SlotSet, UserKey};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// How often the task looks for slots to renew (and frees ended ones a wake-up missed).
const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// How long an ended slot waits for an admission of the same principal to take it along before the task frees
/// it on its own (a slot stays counted this much longer on other replicas).
const RIDE: Duration = Duration::from_millis(1);

struct Held {
    user: UserKey,
    set: SlotSet,
    renewed: Instant,
}

pub(crate) struct Leases {
    store: Arc<dyn LimitStore>,
    ttl: Duration,
    held: Mutex<HashMap<String, Held>>,
    ended: Mutex<HashMap<(UserKey, SlotSet), Vec<String>>>,
    /// Wakes the task when a slot ends.
    wake: tokio::sync::Notify,
}

impl Leases {
    /// Starts the renew-and-flush task, when there is a runtime to run it on.
    pub(crate) fn start(store: Arc<dyn LimitStore>, ttl: Duration) -> Arc<Self> {
        let me = Arc::new(Self {
            store,
            ttl,
            held: Mutex::default(),
            ended: Mutex::default(),
            wake: tokio::sync::Notify::new(),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(maintain(Arc::downgrade(&me)));
        }
        me
    }

    pub(crate) fn hold(self: &Arc<Self>, lease: SlotLease) -> SlotGuard {
        let held = Held { user: lease.user, set: lease.set, renewed: Instant::now() };
        self.held.lock().unwrap_or_else(PoisonError::into_inner).insert(lease.token.clone(), held);
        SlotGuard { leases: self.clone(), token: lease.token }
    }

    fn end(&self, token: String) {
        let Some(h) = self.held.lock().unwrap_or_else(PoisonError::into_inner).remove(&token) else { return };
        self.ended.lock().unwrap_or_else(PoisonError::into_inner).entry((h.user, h.set)).or_default().push(token);
        self.wake.notify_one();
    }

    /// The ended slots of `user` in `set`, for its next admission to free.
    pub(crate) fn take_ended(&self, user: &UserKey, set: SlotSet) -> Vec<String> {
        let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        if ended.is_empty() {
            return Vec::new();
        }
        ended.remove(&(user.clone(), set)).unwrap_or_default()
    }

    /// Ended slots an admission could not free (the store failed): the flush tries again.
    pub(crate) fn put_back(&self, user: &UserKey, set: SlotSet, tokens: Vec<String>) {
        if !tokens.is_empty() {
            let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
            ended.entry((user.clone(), set)).or_default().extend(tokens);
        }
    }

    async fn flush(&self) {
        let ended = std::mem::take(&mut *self.ended.lock().unwrap_or_else(PoisonError::into_inner));
        for ((user, set), tokens) in ended {
            if let Err(e) = self.store.release_slots(&user, set, &tokens).await {
                // Their leases free them.
                tracing::debug!(error = %e, "slot release failed");
            }
        }
    }

    async fn renew_due(&self) {
        let now = Instant::now();
        let due: Vec<(String, UserKey, SlotSet)> = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, h)| now >= h.renewed + self.ttl / 3)
            .map(|(t, h)| (t.clone(), h.user.clone(), h.set))
            .collect();
        for (token, user, set) in due {
            let renewed = self.store.renew_slot(&user, set, &token, self.ttl).await;
            let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            match renewed {
                Ok(true) => {
                    if let Some(h) = held.get_mut(&token) {
                        h.renewed = now;
                    }
                }
                Ok(false) => {
                    // Lapsed (the store was unreachable for a whole lease): no longer counted.
                    tracing::debug!(?set, "slot lease lapsed");
                    held.remove(&token);
                }
                Err(e) => tracing::debug!(error = %e, "slot renewal failed; retrying"),
            }
        }
    }
}

async fn maintain(leases: Weak<Leases>) {
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_renewal = Instant::now();
    loop {
        let Some(l) = leases.upgrade() else { return };
        tokio::select! {
            _ = tick.tick() => {}
            () = l.wake.notified() => tokio::time::sleep(RIDE).await,
        }
        l.flush().await;
        if last_renewal.elapsed() >= l.ttl / 6 {
            last_renewal = Instant::now();
            l.renew_due().await;
        }
    }
}

/// Keeps a slot leased; dropping it frees the slot (or, if the process dies, the lease runs out).
pub struct SlotGuard {
    leases: Arc<Leases>,
    token: String,
}

impl std::fmt::Debug for SlotGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SlotGuard(..)")
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.leases.end(std::mem::take(&mut self.token));
    }
}
