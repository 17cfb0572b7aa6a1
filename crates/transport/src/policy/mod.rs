//! The policy in force on this replica (docs/POLICY.md): the plans of a checked [`Policy`] merged over the flags'
//! numbers, swapped in whole when a new version arrives ([`Policies::install`]), and what each request reads of it:
//! the caller's plan ([`Policies::plan_of`]), the tools its plan lists, and whether its plan lets a call through
//! after validation ([`Policies::check_call`]). [`watch`] follows the store's version.
//!
//! A plan resolves once per token and version: [`Policies`] is the authenticator's [`Assigner`], so the verified
//! principal it caches carries its plan (`Principal::plan`) and the claims the policy reads; a principal whose plan
//! is of another version (or that no authenticator assigned: `--auth none`) is assigned here, per request.

pub(crate) mod listed;
mod metrics;
pub mod watch;

pub use metrics::PolicyMetrics;

use mcpfleet_core::{Assigner, JsonObject, PlanTag, Principal, UserKey};
use mcpfleet_limits::{PlanLimits, RateLimit};
use mcpfleet_policy::{CallVerdict, Mode, Policy, Subject, ToolView};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

/// One plan as a request reads it.
#[derive(Debug)]
pub struct Plan {
    /// Its name in the document; `None`: no document is in force (the flags).
    pub name: Option<String>,
    /// The numbers: the plan's, and the flags' for what it leaves out.
    pub limits: PlanLimits,
    /// The tools it may list and call; `None`: every tool.
    pub allow: Option<BTreeSet<String>>,
}

impl Plan {
    /// Whether the plan lets its principals list and call `tool`.
    #[must_use]
    pub fn allows(&self, tool: &str) -> bool {
        self.allow.as_ref().is_none_or(|a| a.contains(tool))
    }

    /// The plan's name for logs and metric labels (`flags` without a document).
    #[must_use]
    pub fn label(&self) -> &str {
        self.name.as_deref().unwrap_or("flags")
    }
}

/// A version in force: the document and its plans.
#[derive(Debug)]
pub struct Active {
    /// Its number; 0: no document (the flags).
    pub version: u64,
    pub policy: Option<Policy>,
    plans: BTreeMap<String, Arc<Plan>>,
    /// The plan of a principal no rule picks (the document's `default`, or the flags).
    default: Arc<Plan>,
    /// The plan of `--auth none`'s one principal, once assigned.
    anonymous: OnceLock<Arc<Plan>>,
}

/// The policy of this replica: the version in force, swapped whole.
#[derive(Debug)]
pub struct Policies {
    active: RwLock<Arc<Active>>,
    /// The flags' numbers: the plan without a document, and what a plan leaves out.
    defaults: PlanLimits,
    /// Each tool's annotations, as `tools/list` shows them (what a condition sees as `tool.annotations`).
    annotations: BTreeMap<String, Value>,
    /// Whether this replica has learned whether a document is in force (not ready before).
    loaded: AtomicBool,
    metrics: PolicyMetrics,
    /// The version in force, for the streams that tell their clients when their tool list changes.
    changes: tokio::sync::watch::Sender<u64>,
}

impl Policies {
    /// The flags alone (version 0), not yet loaded: call [`Policies::install`] (or [`Policies::loaded_without`])
    /// once the store has said whether a document is in force. `tools` is the catalog's `tools/list`.
    #[must_use]
    pub fn new(defaults: PlanLimits, tools: &[Value], metrics: PolicyMetrics) -> Self {
        let annotations = tools
            .iter()
            .filter_map(|t| {
                let name = t.get("name")?.as_str()?.to_owned();
                Some((name, t.get("annotations").cloned().unwrap_or(Value::Null)))
            })
            .collect();
        let active = Arc::new(Active::flags(&defaults));
        Self {
            active: RwLock::new(active),
            defaults,
            annotations,
            loaded: AtomicBool::new(false),
            metrics,
            changes: tokio::sync::watch::channel(0).0,
        }
    }

    /// The flags alone, loaded: a process that follows no document (no store to read one from, no `--policy`).
    #[must_use]
    pub fn flags_only(defaults: PlanLimits, tools: &[Value], metrics: PolicyMetrics) -> Self {
        let p = Self::new(defaults, tools, metrics);
        p.loaded_without();
        p
    }

    /// The version in force.
    #[must_use]
    pub fn current(&self) -> Arc<Active> {
        self.active.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Whether this replica has read whether a document is in force.
    #[must_use]
    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// No document is in force: the flags, now known to be the policy.
    pub fn loaded_without(&self) {
        self.loaded.store(true, Ordering::Release);
        self.metrics.version.set(0);
    }

    /// Swaps `policy` in as version `version`, whole; every request from now on reads it. Returns whether the
    /// version changed.
    pub fn install(&self, version: u64, policy: Policy) -> bool {
        let next = Arc::new(Active::of(version, policy, &self.defaults));
        let changed = {
            let mut g = self.active.write().unwrap_or_else(PoisonError::into_inner);
            let changed = g.version != version;
            *g = next;
            changed
        };
        self.loaded.store(true, Ordering::Release);
        #[expect(clippy::cast_possible_wrap, reason = "a version number far below i64::MAX")]
        self.metrics.version.set(version as i64);
        if changed {
            self.changes.send_replace(version);
        }
        changed
    }

    /// Follows the version in force: changes whenever a new one is installed.
    #[must_use]
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    #[must_use]
    pub fn metrics(&self) -> &PolicyMetrics {
        &self.metrics
    }

    /// The plan of `who` under the version in force.
    #[must_use]
    pub fn plan_of(&self, who: &Principal) -> Arc<Plan> {
        self.current().plan_of(who, &self.metrics)
    }

    /// The quota `tenant`'s principals share for `tool` under the version in force: its override, else the
    /// document's `tenants.quotas`.
    #[must_use]
    pub fn tenant_quota(&self, tenant: &str, tool: &str) -> Option<mcpfleet_core::Quota> {
        let active = self.current();
        let t = &active.policy.as_ref()?.tenants;
        t.overrides.get(tenant).and_then(|o| o.get(tool)).or_else(|| t.quotas.get(tool)).copied()
    }

    /// Whether the conditions of `plan` let `who` call `tool` with `args` (validated against the tool's schema;
    /// the plan's `tools.allow` was checked before the arguments were read). Dry-run conditions that would refuse
    /// are counted and logged, and let the call through.
    ///
    /// # Errors
    /// The refusal's message (what the model reads), counted in `mcp_policy_refusals_total`.
    pub fn check_call(&self, plan: &Plan, who: &Principal, tool: &str, args: &JsonObject) -> Result<(), String> {
        let Some(name) = &plan.name else { return Ok(()) };
        let active = self.current();
        let Some(policy) = &active.policy else { return Ok(()) };
        let Some(p) = policy.plans.get(name) else { return Ok(()) };
        if p.conditions.is_empty() {
            return Ok(());
        }
        let annotations = self.annotations.get(tool).unwrap_or(&Value::Null);
        let subject = Subject { issuer: &who.issuer, subject: &who.subject, claims: &who.claims };
        let view = ToolView { name: tool, annotations };
        // The conditions decided when the token was verified, under this version and plan.
        let decided = match &who.plan {
            Some(t) if t.version == active.version && *t.plan == **name => &t.decided[..],
            _ => &[],
        };
        match policy.check_call(name, &subject, &view, args, decided) {
            CallVerdict::Allowed { would_refuse } => {
                for i in would_refuse {
                    let rule = format!("tools.conditions.{i}");
                    tracing::info!(plan = %name, rule = %rule, tool, user = who.user.as_str(), "a dry-run condition would refuse this call");
                    self.metrics.would_refuse(name, &rule);
                }
                Ok(())
            }
            // The version changed since the plan was read, and its plan no longer lists the tool: refused (fail
            // closed), as the next call will be before its arguments are read.
            CallVerdict::NotAllowed => {
                self.metrics.refused(name, "tools.allow");
                Err("The plan of this user does not allow this tool.".to_owned())
            }
            CallVerdict::Refused { condition, message } => {
                self.metrics.refused(name, &format!("tools.conditions.{condition}"));
                Err(message.to_owned())
            }
        }
    }
}

impl Assigner for Policies {
    fn version(&self) -> u64 {
        self.current().version
    }

    fn assign(&self, principal: &mut Principal, claims: &JsonObject) {
        let active = self.current();
        let Some(policy) = &active.policy else {
            principal.plan = Some(PlanTag { version: active.version, plan: Arc::from(""), decided: Arc::default() });
            return;
        };
        principal.claims = Arc::new(policy.claims.keep(claims));
        let plan = active.assign(principal, &self.metrics);
        let subject = Subject { issuer: &principal.issuer, subject: &principal.subject, claims: &principal.claims };
        let decided = policy.decide(plan.label(), &subject).into();
        principal.plan = Some(PlanTag { version: active.version, plan: Arc::from(plan.label()), decided });
    }
}

impl Active {
    fn flags(defaults: &PlanLimits) -> Self {
        let default = Arc::new(Plan { name: None, limits: defaults.clone(), allow: None });
        Self { version: 0, policy: None, plans: BTreeMap::new(), default, anonymous: OnceLock::new() }
    }

    fn of(version: u64, policy: Policy, defaults: &PlanLimits) -> Self {
        let plans: BTreeMap<String, Arc<Plan>> = policy
            .plans
            .iter()
            .map(|(name, p)| {
                let plan = Plan {
                    name: Some(name.clone()),
                    limits: merge(p, defaults),
                    allow: p.allow.as_ref().map(|a| a.iter().cloned().collect()),
                };
                (name.clone(), Arc::new(plan))
            })
            .collect();
        let default = plans
            .get(&policy.default)
            .cloned()
            .unwrap_or_else(|| Arc::new(Plan { name: None, limits: defaults.clone(), allow: None }));
        Self { version, policy: Some(policy), plans, default, anonymous: OnceLock::new() }
    }

    /// The plan of `who`: the one its token was assigned under this version, else assigned now.
    fn plan_of(&self, who: &Principal, metrics: &PolicyMetrics) -> Arc<Plan> {
        if self.policy.is_none() {
            return self.default.clone();
        }
        if let Some(tag) = &who.plan
            && tag.version == self.version
            && let Some(p) = self.plans.get(&*tag.plan)
        {
            return p.clone();
        }
        if who.user == UserKey::anonymous() {
            return self.anonymous.get_or_init(|| self.assign(who, metrics)).clone();
        }
        self.assign(who, metrics)
    }

    fn assign(&self, who: &Principal, metrics: &PolicyMetrics) -> Arc<Plan> {
        let Some(policy) = &self.policy else { return self.default.clone() };
        let subject = Subject { issuer: &who.issuer, subject: &who.subject, claims: &who.claims };
        let a = policy.assign(&subject);
        for (rule, plan) in &a.would {
            tracing::info!(rule, plan, user = who.user.as_str(), "a dry-run assignment rule would pick another plan");
            metrics.would_assign(&format!("assign.{rule}"));
        }
        self.plans.get(a.plan).cloned().unwrap_or_else(|| self.default.clone())
    }

    /// The names of the plans, for `policy explain` and logs.
    pub fn plan_names(&self) -> impl Iterator<Item = &str> {
        self.plans.keys().map(String::as_str)
    }

    /// Whether any rule of the version is a dry run.
    #[must_use]
    pub fn has_dry_runs(&self) -> bool {
        self.policy.as_ref().is_some_and(|p| {
            p.assign.iter().any(|a| a.mode == Mode::DryRun)
                || p.plans.values().any(|pl| pl.conditions.iter().any(|c| c.mode == Mode::DryRun))
        })
    }
}

/// A plan's numbers over the flags': each number the plan leaves out is the flag's.
#[must_use]
pub fn merge(p: &mcpfleet_policy::Plan, defaults: &PlanLimits) -> PlanLimits {
    let rate = match (p.rate_per_second, p.rate_burst, defaults.rate) {
        (None, None, rate) => rate,
        (per_second, burst, base) => {
            let per_second = per_second.or(base.map(|b| b.per_second)).unwrap_or(1.0);
            let burst = burst.map_or_else(
                || base.map_or_else(|| whole(per_second), |b| b.burst),
                |b| u32::try_from(b).unwrap_or(u32::MAX),
            );
            Some(RateLimit { burst: burst.max(1), per_second })
        }
    };
    let mut quotas = defaults.quotas.clone();
    quotas.extend(p.quotas.iter().map(|(t, q)| (t.clone(), Some(*q))));
    PlanLimits {
        rate,
        quotas,
        max_sessions: p.sessions.unwrap_or(defaults.max_sessions),
        max_streams: p.streams.unwrap_or(defaults.max_streams),
        max_inflight: p.inflight.unwrap_or(defaults.max_inflight),
        max_tasks: p.tasks.unwrap_or(defaults.max_tasks),
    }
}

/// A bucket's burst for a rate without one: a second's worth.
fn whole(per_second: f64) -> u32 {
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "clamped to u32")]
    let n = per_second.ceil().clamp(1.0, f64::from(u32::MAX)) as u32;
    n
}
