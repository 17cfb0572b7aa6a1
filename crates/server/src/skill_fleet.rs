//! The skill set across the fleet (docs/SKILLS.md): every replica should serve the same skills, bytes and digests,
//! since a client's next request may land on any of them. Each replica declares its set's digest in the store every
//! [`EVERY`] and reads the others'; one whose set differs from any live replica's says so in
//! `mcp_skills_fleet_differing_replicas` and a log line (a rollout in progress, or a replica built from other
//! files). Off the request path.

use mcpfleet_skills::Skills;
use mcpfleet_state::Store;
use prometheus::{IntGauge, Opts, Registry};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a replica renews its declaration and compares.
pub(crate) const EVERY: Duration = Duration::from_secs(10);
/// How long a declaration lives without renewal.
const TTL: Duration = Duration::from_secs(30);
/// The fact's name in the store.
const FACT: &str = "skills";

/// `mcp_skills_served` and `mcp_skills_fleet_differing_replicas`.
#[derive(Clone, Debug)]
pub(crate) struct SkillMetrics {
    served: IntGauge,
    differing: IntGauge,
}

impl SkillMetrics {
    pub(crate) fn register(registry: &Registry) -> prometheus::Result<Self> {
        let served = IntGauge::with_opts(Opts::new("mcp_skills_served", "Skills this replica serves."))?;
        let differing = IntGauge::with_opts(Opts::new(
            "mcp_skills_fleet_differing_replicas",
            "Live replicas whose skill set's digest differs from this replica's (0 when the fleet agrees).",
        ))?;
        registry.register(Box::new(served.clone()))?;
        registry.register(Box::new(differing.clone()))?;
        Ok(Self { served, differing })
    }

    /// One process (the in-memory store): nothing to compare with.
    pub(crate) fn served_only(&self, skills: &Skills) {
        self.served.set(i64::try_from(skills.len()).unwrap_or(i64::MAX));
    }
}

/// This replica's declaration of its skill set, renewed and compared by [`watch`]; [`leave`](Self::leave)
/// withdraws it when the replica drains, so that the others stop counting it at their next comparison.
#[derive(Debug)]
pub(crate) struct SkillFleet {
    me: String,
    store: Arc<dyn Store>,
    skills: Arc<Skills>,
    metrics: SkillMetrics,
    left: CancellationToken,
}

impl SkillFleet {
    /// Starts declaring and comparing, every [`EVERY`].
    pub(crate) fn start(store: Arc<dyn Store>, skills: Arc<Skills>, metrics: SkillMetrics) -> Arc<Self> {
        metrics.served_only(&skills);
        let me = format!("{:032x}", rand::random::<u128>());
        let fleet = Arc::new(Self { me, store, skills, metrics, left: CancellationToken::new() });
        tokio::spawn(watch(Arc::downgrade(&fleet)));
        fleet
    }

    /// Withdraws the declaration (a drain); best effort, within a second.
    pub(crate) async fn leave(&self) {
        self.left.cancel();
        let withdraw = self.store.declare(FACT, &self.me, self.skills.digest(), Duration::ZERO);
        match tokio::time::timeout(Duration::from_secs(1), withdraw).await {
            Ok(Ok(_)) => tracing::debug!("skill set declaration withdrawn"),
            _ => tracing::debug!("skill set declaration not withdrawn: it expires on its own"),
        }
    }
}

/// Declares the skill set and compares it with the fleet's until the replica leaves (or its state is dropped).
async fn watch(weak: std::sync::Weak<SkillFleet>) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut was = 0usize;
    loop {
        tick.tick().await;
        let Some(fleet) = weak.upgrade() else { return };
        if fleet.left.is_cancelled() {
            return;
        }
        let mine = fleet.skills.digest();
        let values = match fleet.store.declare(FACT, &fleet.me, mine, TTL).await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "skill set not compared with the fleet's now");
                continue;
            }
        };
        if fleet.left.is_cancelled() {
            // A renewal that raced the withdrawal: withdraw again.
            let _ = fleet.store.declare(FACT, &fleet.me, mine, Duration::ZERO).await;
            return;
        }
        let differing: Vec<&String> = values.iter().filter(|v| v.as_str() != mine).collect();
        fleet.metrics.differing.set(i64::try_from(differing.len()).unwrap_or(i64::MAX));
        if differing.len() != was {
            if differing.is_empty() {
                tracing::info!(digest = %mine, replicas = values.len(), "every live replica serves this skill set");
            } else {
                let mut theirs: Vec<&str> = differing.iter().map(|s| s.as_str()).collect();
                theirs.sort_unstable();
                theirs.dedup();
                tracing::warn!(
                    digest = %mine,
                    differing = differing.len(),
                    replicas = values.len(),
                    theirs = %theirs.join(","),
                    "live replicas serve another skill set than this one: clients may see skills change between \
                     requests until every replica serves the same --skills"
                );
            }
            was = differing.len();
        }
    }
}
