//! Follows the fleet's notices in the store ([`follow`]): the policy version, read once before the replica is
//! ready, then again on every announcement on the fleet's notice channel and every poll interval, in case an
//! announcement was lost (delivery is at most once). A new version is parsed and checked whole, then swapped in; one
//! that this build refuses is counted and logged, and the last good version stays in force. With the store away,
//! the replica keeps the version it has.
//!
//! Revocations ride the same channel: on `revoke:<user>` the principal's open streams here close at once, and the
//! fleet's registry of revocations is read again (also every poll) into the limiter, which refuses them even when
//! the store cannot decide.

use super::Policies;
use mcpfleet_limits::Limiter;
use mcpfleet_policy::Policy;
use mcpfleet_state::{REVOKE_NOTICE, Ring, Store, UserKey};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How soon a read that failed before the first success is tried again (the replica is not ready until then).
const FIRST_READ_RETRY: Duration = Duration::from_secs(1);

/// What a follower needs.
#[derive(Debug)]
pub struct Follower {
    pub store: Arc<dyn Store>,
    pub policies: Arc<Policies>,
    /// Its cached refusals are cleared when the version changes: a principal's plan may be another one now.
    pub limits: Arc<Limiter>,
    /// The open streams here, which a revocation closes.
    pub streams: Arc<crate::OpenStreams>,
    /// How often the version is read without an announcement.
    pub poll: Duration,
    pub shutdown: CancellationToken,
}

/// Follows the store's version until `shutdown` (see the module).
pub async fn follow(f: Follower) {
    let mut sub = None;
    loop {
        if sub.is_none() {
            match f.store.subscribe_fleet().await {
                Ok(s) => sub = Some(s),
                Err(e) => tracing::warn!(error = %e, "cannot subscribe to policy announcements; polling"),
            }
        }
        let read = load(&f).await;
        revocations(&f).await;
        let pause = if read || f.policies.is_loaded() { f.poll } else { FIRST_READ_RETRY };
        let rang = async {
            match sub.as_mut() {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = f.shutdown.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
            ring = rang => match ring {
                None => sub = None,
                Some(Ring::Notice(msg)) => {
                    if let Some(user) = msg.strip_prefix(REVOKE_NOTICE).and_then(UserKey::new) {
                        let closed = f.streams.close(&user);
                        if closed > 0 {
                            tracing::info!(user = user.as_str(), closed, "revoked: the principal's open streams here are closed");
                        }
                    }
                }
                Some(_) => {}
            },
        }
    }
}

/// Reads the fleet's registry of revocations into the limiter (the ones still in force).
async fn revocations(f: &Follower) {
    let listed = match f.store.revocations().await {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the revocations; keeping the ones known");
            return;
        }
    };
    let now = mcpfleet_core::time::epoch_ms();
    let mut known = mcpfleet_limits::KnownRevoked::new();
    for l in listed {
        let until = serde_json::from_str::<serde_json::Value>(&l.record)
            .ok()
            .and_then(|r| r.get("until_ms").and_then(serde_json::Value::as_u64))
            .unwrap_or(0);
        let Some(user) = UserKey::new(&l.user) else { continue };
        if until <= now {
            continue;
        }
        let token = l.field.strip_prefix("j:").map(str::to_owned);
        known.entry(user).or_default().push((token, until));
    }
    f.limits.set_revoked(known);
}

/// Reads the version in force and installs it if it is new. Returns whether the store answered.
async fn load(f: &Follower) -> bool {
    let p = &f.policies;
    let version = match f.store.policy_version().await {
        Ok(v) => v,
        Err(e) => {
            p.metrics.load_failures.with_label_values(&["store"]).inc();
            tracing::warn!(error = %e, version = p.current().version, "cannot read the policy version; keeping the one in force");
            return false;
        }
    };
    #[expect(clippy::cast_possible_wrap, reason = "a version number far below i64::MAX")]
    p.metrics.latest.set(version as i64);
    let active = p.current();
    if version == 0 {
        if active.version > 0 {
            // The store lost its record (flushed, or a new one): a fleet never falls back to the flags silently.
            tracing::error!(version = active.version, "the store holds no policy now; keeping the version in force");
        } else if !p.is_loaded() {
            p.loaded_without();
            tracing::info!("no policy applied: the flags are the default plan");
        }
        return true;
    }
    if version == active.version && p.is_loaded() {
        return true;
    }
    let stored = match f.store.policy().await {
        Ok(Some(s)) => s,
        Ok(None) => return true,
        Err(e) => {
            p.metrics.load_failures.with_label_values(&["store"]).inc();
            tracing::warn!(error = %e, "cannot read the policy; keeping the one in force");
            return false;
        }
    };
    if stored.version == active.version && p.is_loaded() {
        return true;
    }
    match Policy::parse(&stored.text) {
        Ok(policy) => {
            if p.install(stored.version, policy) {
                f.limits.clear_refusals();
                tracing::info!(version = stored.version, by = %stored.by, summary = %stored.summary, "policy version in force");
            }
        }
        Err(e) => {
            p.metrics.load_failures.with_label_values(&["invalid"]).inc();
            tracing::error!(
                version = stored.version,
                error = %e,
                in_force = active.version,
                "a stored policy version is refused by this build; keeping the one in force"
            );
            if !p.is_loaded() {
                // Nothing good to keep: the replica stays not ready rather than serve the flags silently.
                return true;
            }
        }
    }
    true
}
