//! mcpfleet-limits owns the limits that keep a principal (usually an over-eager model) inside what the operator
//! set, for the whole fleet at once: the transport's per-principal token bucket, per-tool quotas in fixed windows,
//! and caps on a principal's open sessions, open SSE streams and tool calls in flight. It decides; the state
//! crate's [`LimitStore`] counts, atomically, in one round trip that also checks the request's session.
//!
//! Around the store it keeps three things per replica: a cache of principals refused until a known time (refused
//! again locally, without a store call, so that a flood does not reach Redis), a circuit breaker that stops calling
//! a failing store for a moment, and the fail-open bucket (`FailMode::Open`).
//!
//! [`Quota`] and the flag syntax are `mcpfleet-core`'s. This crate must not depend on HTTP, axum, the transport,
//! tools, auth or Redis: it speaks the state crate's traits,
//! and the transport turns its refusals into statuses and headers.

mod breaker;
mod cap;
use breaker::Breaker;
mod config;
mod leases;
pub mod members;
mod metrics;
mod revoked;
mod tenants;

pub use cap::Cap;
pub use config::{FailMode, LimitsConfig, PlanLimits, Quota, RateLimit, parse_duration};
pub use leases::SlotGuard;
pub use metrics::{Kind, LimitMetrics};
pub use revoked::KnownRevoked;
pub use tenants::{TenantDecision, slice};

use mcpfleet_state::{
    Admission, Admitted, BucketReading, BucketSpec, LimitStore, Refusal, SessionInfo, SessionOp, SlotSet, SlotSpec,
    StateError, TaskKey, TaskView, TokenBucket, UserKey, WindowSpec,
};
use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// The pauses before each recheck of a slot cap that looked full (see `Limiter::recheck_slot`).
const SLOT_RECHECK: [Duration; 4] =
    [Duration::from_millis(10), Duration::from_millis(25), Duration::from_millis(50), Duration::from_millis(100)];

/// The most principals the local caches remember; beyond it, expired entries go, then everything.
const CACHE_CAP: usize = 65_536;

/// Why a limit refused, or could not decide. Only the transport turns these into HTTP and JSON-RPC.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    #[error("invalid limits configuration: {0}")]
    Config(String),
    #[error("rate limit exceeded: retry after {retry_after} s")]
    RateLimited { retry_after: u64 },
    #[error("quota for tool {tool} used up ({quota}): retry after {retry_after} s")]
    QuotaExhausted { tool: String, quota: Quota, retry_after: u64 },
    /// The quota the principal's tenant shares for this tool is used up.
    #[error("the tenant's quota for tool {tool} used up ({quota}): retry after {retry_after} s")]
    TenantQuotaExhausted { tool: String, quota: Quota, retry_after: u64 },
    #[error("too many {cap} for this principal (cap {limit})")]
    CapReached { cap: Cap, limit: u64 },
    #[error("session not found")]
    SessionNotFound,
    /// The principal, or the token the request came with, is revoked (`mcpfleet revoke`).
    #[error("the token has been revoked")]
    Revoked,
    /// The DPoP proof the request came with was used before, through this replica or another (RFC 9449 §11.1).
    #[error("the DPoP proof was used before: send a fresh proof with every request")]
    ProofReplayed,
    #[error("session id already exists")]
    SessionConflict,
    #[error("limits cannot be checked: state store unavailable")]
    Unavailable {
        retry_after: u64,
        #[source]
        source: Option<StateError>,
    },
}

/// The state of a principal's bucket after a decision, for the `RateLimit-Policy` and `RateLimit` headers (IETF
/// draft `httpapi-ratelimit-headers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateStatus {
    /// The bucket's capacity (`q`).
    pub limit: u32,
    /// How long an empty bucket takes to fill, in seconds (`w`).
    pub window: u64,
    /// Requests that would pass now (`r`).
    pub remaining: u64,
    /// Seconds until the next request passes when none is left, else until the bucket is full again (`t`).
    pub reset: u64,
}

impl RateStatus {
    /// The `RateLimit-Policy` header value, e.g. `"user";q=60;w=60`.
    #[must_use]
    pub fn policy_header(&self) -> String {
        format!("\"user\";q={};w={}", self.limit, self.window)
    }

    /// The `RateLimit` header value, e.g. `"user";r=0;t=1`.
    #[must_use]
    pub fn header(&self) -> String {
        format!("\"user\";r={};t={}", self.remaining, self.reset)
    }
}

/// A quota after an allowed call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaStatus {
    pub quota: Quota,
    pub used: u64,
    /// How long until the window ends, where the store told (see [`mcpfleet_state::WindowReading::reset`]).
    pub reset: Option<Duration>,
}

/// A refusal, with the bucket's state when the bucket was consulted (the headers go on every response).
#[derive(Debug)]
pub struct Refused {
    pub rate: Option<RateStatus>,
    pub error: LimitError,
}

/// What one request asks to be admitted for.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The verified principal.
    pub user: &'a UserKey,
    /// The peer address: set only under `--auth none`, where it keys the bucket instead of the principal.
    pub peer: Option<IpAddr>,
    /// The session to check or create (the limiter fills in the session cap).
    pub session: SessionOp<'a>,
    /// A slot to lease: an SSE stream or a call in flight (ignored when its cap is 0).
    pub slot: Option<SlotSet>,
    /// The tool being called and its effective quota (see [`Limiter::quota_for`]).
    pub quota: Option<(&'a str, Quota)>,
    /// A control message: a session `DELETE`, a client's answer to a server→client request, or
    /// `notifications/cancelled`. It never takes a token from the principal's bucket, so that a client that used
    /// its bucket up can still end its session, answer and cancel; it takes one from the principal's control
    /// bucket instead, which has the same burst and rate and is counted apart, so that these messages cannot
    /// flood the store either.
    pub control: bool,
    /// A task to read in the same store call (a `tasks/get` poll costs one round trip in all).
    pub task: Option<&'a TaskKey>,
    /// The principal's plan; `None`: the default plan (the flags').
    pub plan: Option<&'a PlanLimits>,
    /// The id (`jti`) of the token the request came with: a revocation may name it alone.
    pub token_id: Option<&'a str>,
    /// The DPoP proof the request came with: recorded in the admission's round trip, refused if seen before.
    pub proof: Option<&'a mcpfleet_core::Proof>,
}

impl<'a> Request<'a> {
    /// A request of `user` that needs only the bucket.
    #[must_use]
    pub fn new(user: &'a UserKey, peer: Option<IpAddr>) -> Self {
        Self {
            user,
            peer,
            session: SessionOp::None,
            slot: None,
            quota: None,
            control: false,
            task: None,
            plan: None,
            token_id: None,
            proof: None,
        }
    }

    /// The same request as a control message (see [`Request::control`]).
    #[must_use]
    pub fn as_control(self) -> Self {
        Self { control: true, ..self }
    }
}

/// An admitted request.
#[derive(Debug, Default)]
pub struct Granted {
    pub rate: Option<RateStatus>,
    /// The touched session.
    pub session: Option<SessionInfo>,
    /// The leased slot: hold it (see [`Limiter::hold`]) for as long as the stream or call lives.
    pub slot: Option<SlotLease>,
    pub quota: Option<QuotaStatus>,
    /// The task [`Request::task`] named, read in the same store call (`Some(None)`: no such task); `None` when it
    /// was not read (the store was not called: a cached refusal, or the fail-open bucket).
    pub task: Option<Option<TaskView>>,
}

/// A slot taken by admission.
#[derive(Debug)]
pub struct SlotLease {
    user: UserKey,
    set: SlotSet,
    token: String,
}

/// Decides every limit of a replica. Shared by all requests (`Arc`).
pub struct Limiter {
    store: Arc<dyn LimitStore>,
    cfg: LimitsConfig,
    metrics: LimitMetrics,
    /// Principals (and peers) refused by their bucket, until when.
    denied: Mutex<HashMap<UserKey, HashMap<String, Instant>>>,
    /// The fail-open buckets.
    local: Mutex<HashMap<(UserKey, String), TokenBucket>>,
    breaker: Breaker,
    epoch: Instant,
    leases: Arc<leases::Leases>,
    /// How many replicas share the limits (fleet membership).
    members: Arc<members::Members>,
    /// The revocations the fleet's registry lists: refused here when the store cannot decide, so that failing open
    /// never admits them.
    revoked: revoked::Revoked,
    /// The units of tenants' shared quotas this replica holds.
    tenants: tenants::TenantLeases,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

impl Limiter {
    #[must_use]
    ///
    /// Within a tokio runtime, it starts the task that renews and frees the slots it hands out, and the one that
    /// renews this replica's membership record ([`members`]).
    pub fn new(store: Arc<dyn LimitStore>, cfg: LimitsConfig, metrics: LimitMetrics) -> Self {
        Self {
            leases: leases::Leases::start(store.clone(), cfg.slot_ttl),
            members: members::Members::start(store.clone(), metrics.replicas_gauge()),
            store,
            cfg,
            metrics,
            denied: Mutex::new(HashMap::new()),
            local: Mutex::new(HashMap::new()),
            breaker: Breaker::default(),
            epoch: Instant::now(),
            revoked: revoked::Revoked::default(),
            tenants: tenants::TenantLeases::default(),
        }
    }

    /// Takes a unit of the quota `tenant`'s principals share for `tool`: locally from this replica's slice, or with
    /// a lease round trip when it holds none (see [`tenants`]).
    ///
    /// # Errors
    /// [`LimitError::TenantQuotaExhausted`] with the time to come back; [`LimitError::Unavailable`] when the store
    /// cannot lease (a quota fails closed).
    pub async fn take_tenant(&self, tenant: &str, tool: &str, quota: Quota) -> Result<(), LimitError> {
        let replicas = u64::from(self.members.count(self.cfg.replicas));
        match self.tenants.take(&*self.store, tenant, tool, quota, replicas).await {
            Ok(TenantDecision::Taken) => {
                self.metrics.decision(Kind::Tenant, "allowed");
                Ok(())
            }
            Ok(TenantDecision::Exhausted(left)) => {
                self.metrics.decision(Kind::Tenant, "denied");
                let retry_after = config::whole_secs(left.as_secs_f64()).max(1);
                Err(LimitError::TenantQuotaExhausted { tool: tool.to_owned(), quota, retry_after })
            }
            Err(e) => {
                self.metrics.store_failure(if e.is_timeout() { "timeout" } else { "error" });
                let retry_after = config::whole_secs(self.cfg.breaker_cooldown.as_secs_f64()).max(1);
                Err(LimitError::Unavailable { retry_after, source: Some(e) })
            }
        }
    }

    /// Gives back a tenant's unit taken for a call that was then refused.
    pub fn give_back_tenant(&self, tenant: &str, tool: &str) {
        self.tenants.give_back(tenant, tool);
    }

    /// Replaces the revocations known here (the fleet's registry, read by the replica's follower).
    pub fn set_revoked(&self, known: KnownRevoked) {
        self.revoked.set(known);
    }

    /// Whether the registry, as last read here, revokes `user` (or its token `token_id`) now.
    #[must_use]
    pub fn known_revoked(&self, user: &UserKey, token_id: Option<&str>) -> bool {
        self.revoked.refuses(user, token_id)
    }

    /// Leaves the fleet (a drain): this replica's membership record goes at once, and is not renewed again.
    pub async fn leave(&self) {
        self.members.leave(Duration::from_secs(2)).await;
    }

    #[must_use]
    pub fn config(&self) -> &LimitsConfig {
        &self.cfg
    }

    /// The default plan: the numbers of the flags.
    #[must_use]
    pub fn default_plan(&self) -> &PlanLimits {
        &self.cfg.plan
    }

    /// Records that the store refused a task at the plan's cap (`limit`), and says why.
    #[must_use]
    pub fn tasks_refused(&self, limit: u64) -> LimitError {
        self.metrics.decision(Kind::Tasks, "denied");
        LimitError::CapReached { cap: Cap::Tasks, limit }
    }

    /// The `RateLimit-Policy` header value of the default plan, when it has a bucket.
    #[must_use]
    pub fn policy_header(&self) -> Option<String> {
        self.cfg.plan.rate.map(|r| r.status(0, 0).policy_header())
    }

    /// Forgets every principal refused until a known time: their plans may have changed (a new policy version).
    pub fn clear_refusals(&self) {
        self.denied.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    fn plan_of<'r>(&'r self, req: &Request<'r>) -> &'r PlanLimits {
        req.plan.unwrap_or(&self.cfg.plan)
    }

    fn bucket(&self, req: &Request<'_>) -> Option<BucketSpec> {
        let r = self.plan_of(req).rate?;
        let base = if req.control { "tbc" } else { "tb" };
        let name = match req.peer {
            Some(ip) => format!("{base}:{ip}"),
            None => base.to_owned(),
        };
        Some(BucketSpec { name, capacity: f64::from(r.burst), per_second: r.per_second })
    }

    fn cap(plan: &PlanLimits, set: SlotSet) -> (Cap, u64) {
        match set {
            SlotSet::Streams => (Cap::Streams, plan.max_streams),
            SlotSet::Calls => (Cap::Inflight, plan.max_inflight),
        }
    }

    /// Admits `req`: checks and applies its bucket, session, slot and quota in at most one store call.
    ///
    /// # Errors
    /// [`Refused`]: a limit refused (with the time to come back), the session does not exist for this user, or
    /// the store could not decide.
    pub async fn admit(&self, req: &Request<'_>) -> Result<Granted, Refused> {
        let now = Instant::now();
        let plan = self.plan_of(req);
        let bucket = self.bucket(req);
        if let Some(b) = &bucket
            && let Some(until) = self.denied_until(req.user, &b.name, now)
        {
            self.metrics.decision(Kind::Rate, "denied_cached");
            let wait = until - now;
            return Err(Self::rate_refusal(plan, wait));
        }
        if self.breaker.is_open(now) {
            self.metrics.store_failure("breaker_open");
            return self.store_down(req, bucket.as_ref(), now, None);
        }
        // A set without a cap is not counted at all: no lease to take, renew or free.
        let slot = req.slot.filter(|set| Self::cap(plan, *set).1 > 0).map(|set| SlotSpec {
            set,
            cap: Self::cap(plan, set).1,
            token: random_token(),
            ttl: self.cfg.slot_ttl,
        });
        let window = req.quota.map(|(tool, q)| WindowSpec { name: tool.to_owned(), limit: q.limit, window: q.window });
        let session = match req.session {
            SessionOp::Create { id, session, .. } => SessionOp::Create { id, session, max_sessions: plan.max_sessions },
            other => other,
        };
        // The ends of this principal's earlier calls (or streams) ride on this round trip.
        let release_set = slot.as_ref().map_or(SlotSet::Calls, |s| s.set);
        let ended = self.leases.take_ended(req.user, release_set);
        let a = Admission {
            user: req.user,
            session,
            bucket: bucket.as_ref(),
            slot: slot.as_ref(),
            window: window.as_ref(),
            release: (!ended.is_empty()).then_some((release_set, ended.as_slice())),
            count_sessions: plan.max_sessions > 0,
            read_task: req.task,
            token_id: req.token_id,
            proof: req.proof.map(|p| (p.id.as_str(), p.ttl)),
        };
        match self.store.admit(&a).await {
            Ok(mut r) => {
                self.breaker.success();
                if matches!(r.refused, Some(Refusal::Slots { .. })) {
                    r = self.recheck_slot(&a, r).await;
                }
                self.decide(req, bucket.as_ref(), slot, r, now)
            }
            Err(e) => {
                self.leases.put_back(req.user, release_set, ended);
                self.metrics.store_failure(if e.is_timeout() { "timeout" } else { "error" });
                // The cooldown runs from the failure, not from the admission's start: a missed deadline
                // (`--redis-timeout`, 2 s by default) is longer than the cooldown (1 s).
                self.breaker.failure(Instant::now(), &self.cfg);
                self.store_down(req, bucket.as_ref(), now, Some(e))
            }
        }
    }

    /// A slot cap that looks full may be full only of slots whose calls have ended: their replicas free them
    /// just after writing the answer, and a client that sends its next call at once, through another replica,
    /// can get there first. So a slot refusal is checked again, for at most [`SLOT_RECHECK`] in all, before it
    /// stands. The bucket's token is already taken: the rechecks ask for the session, the slot and the quota
    /// only. A client at or under its cap is admitted; one over it gets its refusal about 0.2 s later.
    async fn recheck_slot(&self, first: &Admission<'_>, refused: Admitted) -> Admitted {
        let retry = Admission { bucket: None, release: None, ..first.clone() };
        for pause in SLOT_RECHECK {
            tokio::time::sleep(pause).await;
            match self.store.admit(&retry).await {
                Ok(r) if matches!(r.refused, Some(Refusal::Slots { .. })) => {}
                Ok(r) => return Admitted { bucket: refused.bucket, ..r },
                Err(e) => {
                    tracing::debug!(error = %e, "slot recheck failed");
                    break;
                }
            }
        }
        refused
    }

    fn rate_status(plan: &PlanLimits, r: &BucketReading) -> Option<RateStatus> {
        let rate = plan.rate?;
        let remaining = r.tokens.max(0.0).floor();
        let reset = if remaining < 1.0 {
            config::whole_secs((1.0 - r.tokens) / rate.per_second).max(1)
        } else {
            config::whole_secs(r.wait.as_secs_f64())
        };
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "non-negative, at most the burst")]
        let remaining = remaining as u64;
        Some(rate.status(remaining, reset))
    }

    /// A refusal by the bucket: nothing left, and a token in `wait`.
    fn rate_refusal(plan: &PlanLimits, wait: Duration) -> Refused {
        let retry_after = config::whole_secs(wait.as_secs_f64()).max(1);
        Refused { rate: plan.rate.map(|r| r.status(0, retry_after)), error: LimitError::RateLimited { retry_after } }
    }

    fn decide(
        &self,
        req: &Request<'_>,
        bucket: Option<&BucketSpec>,
        slot: Option<SlotSpec>,
        r: Admitted,
        now: Instant,
    ) -> Result<Granted, Refused> {
        let plan = self.plan_of(req);
        let mut rate = None;
        if let (Some(b), Some(reading)) = (bucket, &r.bucket) {
            if !reading.allowed {
                self.metrics.decision(Kind::Rate, "denied");
                self.deny(req.user, &b.name, now + reading.wait);
                return Err(Self::rate_refusal(plan, reading.wait));
            }
            self.metrics.allowed(Kind::Rate, b.capacity - reading.tokens, b.capacity);
            rate = Self::rate_status(plan, reading);
        }
        let refuse = |error| Err(Refused { rate, error });
        match r.refused {
            None => {}
            Some(Refusal::Bucket) => return refuse(LimitError::RateLimited { retry_after: 1 }),
            Some(Refusal::SessionNotFound) => return refuse(LimitError::SessionNotFound),
            Some(Refusal::Revoked) => return refuse(LimitError::Revoked),
            Some(Refusal::Replayed) => return refuse(LimitError::ProofReplayed),
            Some(Refusal::SessionConflict) => return refuse(LimitError::SessionConflict),
            Some(Refusal::Sessions { .. }) => {
                self.metrics.decision(Kind::Sessions, "denied");
                return refuse(LimitError::CapReached { cap: Cap::Sessions, limit: plan.max_sessions });
            }
            Some(Refusal::Slots { .. }) => {
                let (cap, limit) = Self::cap(plan, slot.as_ref().map_or(SlotSet::Calls, |s| s.set));
                self.metrics.decision(cap.kind(), "denied");
                return refuse(LimitError::CapReached { cap, limit });
            }
            Some(Refusal::Window) => {
                self.metrics.decision(Kind::Quota, "denied");
                // A window refuses only when the request named one.
                let (tool, quota) = req.quota.unwrap_or(("", Quota::new(0, Duration::ZERO)));
                let reset = r.window.and_then(|w| w.reset).unwrap_or(quota.window);
                let retry_after = config::whole_secs(reset.as_secs_f64()).max(1);
                return refuse(LimitError::QuotaExhausted { tool: tool.to_owned(), quota, retry_after });
            }
        }
        if matches!(req.session, SessionOp::Create { .. }) && plan.max_sessions > 0 {
            self.metrics.decision(Kind::Sessions, "allowed");
        }
        let slot = slot.map(|s| {
            let (cap, limit) = Self::cap(plan, s.set);
            #[expect(clippy::cast_precision_loss, reason = "small counts")]
            self.metrics.allowed(cap.kind(), r.slots_used.unwrap_or(0) as f64, limit as f64);
            SlotLease { user: req.user.clone(), set: s.set, token: s.token }
        });
        let quota = match (req.quota, r.window) {
            (Some((_, quota)), Some(w)) => {
                #[expect(clippy::cast_precision_loss, reason = "small counts")]
                self.metrics.allowed(Kind::Quota, w.used as f64, quota.limit as f64);
                Some(QuotaStatus { quota, used: w.used, reset: w.reset })
            }
            _ => None,
        };
        Ok(Granted { rate, session: r.session, slot, quota, task: r.task })
    }

    /// The store could not decide. Closed: 503. Open: the bucket is decided on this replica's share of it, and
    /// the request passes only if it needs nothing else from the store.
    fn store_down(
        &self,
        req: &Request<'_>,
        bucket: Option<&BucketSpec>,
        now: Instant,
        source: Option<StateError>,
    ) -> Result<Granted, Refused> {
        let plan = self.plan_of(req);
        if self.known_revoked(req.user, req.token_id) {
            return Err(Refused { rate: None, error: LimitError::Revoked });
        }
        let retry_after = config::whole_secs(self.cfg.breaker_cooldown.as_secs_f64()).max(1);
        let unavailable = |rate| Err(Refused { rate, error: LimitError::Unavailable { retry_after, source } });
        let (Some(b), FailMode::Open) = (bucket, self.cfg.fail_mode) else {
            self.metrics.decision(Kind::Rate, "unavailable");
            return unavailable(None);
        };
        let replicas = f64::from(self.members.count(self.cfg.replicas));
        let (capacity, per_second) = ((b.capacity / replicas).max(1.0), b.per_second / replicas);
        let t = (now - self.epoch).as_secs_f64();
        let reading = {
            let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
            if local.len() >= CACHE_CAP {
                local.clear();
            }
            let entry =
                local.entry((req.user.clone(), b.name.clone())).or_insert_with(|| TokenBucket::full(capacity, t));
            entry.take(t, capacity, per_second, 1.0)
        };
        self.metrics.fail_open(reading.allowed);
        if !reading.allowed {
            self.deny(req.user, &b.name, now + reading.wait);
            return Err(Self::rate_refusal(plan, reading.wait));
        }
        let rate = Self::rate_status(plan, &reading);
        let needs_store = !matches!(req.session, SessionOp::None) || req.slot.is_some() || req.quota.is_some();
        if needs_store {
            return unavailable(rate);
        }
        Ok(Granted { rate, ..Granted::default() })
    }

    fn deny(&self, user: &UserKey, name: &str, until: Instant) {
        let mut d = self.denied.lock().unwrap_or_else(PoisonError::into_inner);
        if d.len() >= CACHE_CAP {
            let now = Instant::now();
            d.retain(|_, buckets| {
                buckets.retain(|_, t| *t > now);
                !buckets.is_empty()
            });
            if d.len() >= CACHE_CAP {
                d.clear();
            }
        }
        d.entry(user.clone()).or_default().insert(name.to_owned(), until);
    }

    /// Looked up on every request: no allocation.
    fn denied_until(&self, user: &UserKey, name: &str, now: Instant) -> Option<Instant> {
        let d = self.denied.lock().unwrap_or_else(PoisonError::into_inner);
        d.get(user).and_then(|b| b.get(name)).copied().filter(|t| *t > now)
    }

    /// Holds a leased slot: renewed while the guard lives, freed when it drops.
    #[must_use]
    pub fn hold(&self, lease: SlotLease) -> SlotGuard {
        self.leases.hold(lease)
    }

    /// Gives back the quota a call used when it was refused before it ran (an unknown tool or invalid arguments).
    pub async fn refund(&self, user: &UserKey, tool: &str) {
        if let Err(e) = self.store.refund_window(user, tool).await {
            tracing::warn!(error = %e, "quota refund failed");
        }
    }
}

/// 144 random bits, base64url: a slot's token.
fn random_token() -> String {
    use base64::Engine as _;
    let bytes: [u8; 18] = rand::random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcpfleet_state::{Admitted, BucketReading};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A store that answers from a scripted bucket on tokio's (paused) clock, or fails; it counts its calls.
    #[derive(Debug)]
    struct FakeStore {
        calls: AtomicUsize,
        down: std::sync::atomic::AtomicBool,
        bucket: Mutex<Option<TokenBucket>>,
        epoch: Instant,
    }

    impl FakeStore {
        fn new() -> Arc<Self> {
            Arc::new(Self {
                calls: AtomicUsize::new(0),
                down: false.into(),
                bucket: Mutex::new(None),
                epoch: Instant::now(),
            })
        }
    }

    #[async_trait::async_trait]
    impl LimitStore for FakeStore {
        async fn admit(&self, a: &Admission<'_>) -> mcpfleet_state::Result<Admitted> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.down.load(Ordering::Relaxed) {
                return Err(StateError::Timeout(Duration::from_millis(10)));
            }
            let b = a.bucket.expect("bucket");
            let t = (Instant::now() - self.epoch).as_secs_f64();
            let mut g = self.bucket.lock().expect("lock");
            let bucket = g.get_or_insert_with(|| TokenBucket::full(b.capacity, t));
            let r: BucketReading = bucket.take(t, b.capacity, b.per_second, 1.0);
            Ok(Admitted {
                refused: (!r.allowed).then_some(Refusal::Bucket),
                bucket: Some(r),
                session: None,
                slots_used: None,
                window: None,
                task: None,
            })
        }
        async fn renew_slot(&self, _: &UserKey, _: SlotSet, _: &str, _: Duration) -> mcpfleet_state::Result<bool> {
            Ok(true)
        }
        async fn release_slots(&self, _: &UserKey, _: SlotSet, _: &[String]) -> mcpfleet_state::Result<()> {
            Ok(())
        }
        async fn refund_window(&self, _: &UserKey, _: &str) -> mcpfleet_state::Result<()> {
            Ok(())
        }
        async fn lease_window(
            &self,
            _: &str,
            _: &str,
            want: u64,
            _: u64,
            window: Duration,
        ) -> mcpfleet_state::Result<(u64, Duration)> {
            Ok((want, window))
        }
    }

    fn limiter(store: Arc<FakeStore>, cfg: LimitsConfig) -> Limiter {
        Limiter::new(store, cfg, LimitMetrics::unregistered().expect("metrics"))
    }

    fn cfg(burst: u32, per_second: f64) -> LimitsConfig {
        let d = LimitsConfig::default();
        LimitsConfig { plan: PlanLimits { rate: Some(RateLimit { burst, per_second }), ..d.plan }, ..d }
    }

    async fn passes(l: &Limiter, user: &UserKey) -> Result<RateStatus, u64> {
        match l.admit(&Request::new(user, None)).await {
            Ok(g) => Ok(g.rate.expect("rate status")),
            Err(Refused { error: LimitError::RateLimited { retry_after }, .. }) => Err(retry_after),
            Err(other) => panic!("unexpected refusal: {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_denied_principal_is_refused_locally_until_its_retry_time() {
        let store = FakeStore::new();
        let l = limiter(store.clone(), cfg(2, 0.25));
        let alice = UserKey::new("alice").expect("key");
        let s = passes(&l, &alice).await.expect("first");
        assert_eq!((s.limit, s.window, s.remaining, s.reset), (2, 8, 1, 4));
        let s = passes(&l, &alice).await.expect("second");
        assert_eq!((s.remaining, s.reset), (0, 4));
        assert_eq!(passes(&l, &alice).await, Err(4));
        assert_eq!(store.calls.load(Ordering::Relaxed), 3);
        // Until the bucket has a token again, refusals come from the local cache, with the time left.
        for (advance, retry) in [(1000, 3), (1500, 2), (500, 1), (999, 1)] {
            tokio::time::advance(Duration::from_millis(advance)).await;
            assert_eq!(passes(&l, &alice).await, Err(retry));
        }
        assert_eq!(store.calls.load(Ordering::Relaxed), 3, "no store call while refused locally");
        tokio::time::advance(Duration::from_millis(1)).await;
        let s = passes(&l, &alice).await.expect("on time");
        assert_eq!((s.remaining, s.reset), (0, 4));
        assert_eq!(store.calls.load(Ordering::Relaxed), 4);
        // Another principal is never refused by alice's cache.
        let bob = UserKey::new("bob").expect("key");
        assert_eq!(passes(&l, &bob).await, Err(4), "the fake shares one bucket; the store decided");
        assert_eq!(store.calls.load(Ordering::Relaxed), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn fail_open_decides_on_a_local_share_and_closed_refuses() {
        let store = FakeStore::new();
        store.down.store(true, Ordering::Relaxed);
        let alice = UserKey::new("alice").expect("key");

        let closed = limiter(store.clone(), cfg(6, 3.0));
        match closed.admit(&Request::new(&alice, None)).await {
            Err(Refused { error: LimitError::Unavailable { retry_after: 1, .. }, rate: None }) => {}
            other => panic!("closed mode must refuse with 503: {other:?}"),
        }

        // Open over 3 replicas: this replica's share is 2 at once and 1 a second.
        let open = limiter(store.clone(), LimitsConfig { fail_mode: FailMode::Open, replicas: 3, ..cfg(6, 3.0) });
        assert!(passes(&open, &alice).await.is_ok());
        assert!(passes(&open, &alice).await.is_ok());
        assert_eq!(passes(&open, &alice).await, Err(1));
        tokio::time::advance(Duration::from_millis(1000)).await;
        assert!(passes(&open, &alice).await.is_ok());
        // A request that needs its session still fails closed, even with a token.
        tokio::time::advance(Duration::from_millis(1000)).await;
        let sid = mcpfleet_state::SessionId::parse("AAAAAAAAAAAAAAAAAAAAAAAA").expect("sid");
        let req = Request { session: SessionOp::Touch(&sid), ..Request::new(&alice, None) };
        match open.admit(&req).await {
            Err(Refused { error: LimitError::Unavailable { .. }, rate: Some(_) }) => {}
            other => panic!("session checks fail closed: {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failing_open_never_admits_a_principal_known_to_be_revoked() {
        let store = FakeStore::new();
        store.down.store(true, Ordering::Relaxed);
        let open = limiter(store.clone(), LimitsConfig { fail_mode: FailMode::Open, ..cfg(6, 3.0) });
        let (alice, bob) = (UserKey::new("alice").expect("key"), UserKey::new("bob").expect("key"));
        let later = mcpfleet_core::time::epoch_ms() + 60_000;
        open.set_revoked(HashMap::from([
            (alice.clone(), vec![(None, later)]),
            (bob.clone(), vec![(Some("t-1".to_owned()), later)]),
        ]));
        match open.admit(&Request::new(&alice, None)).await {
            Err(Refused { error: LimitError::Revoked, .. }) => {}
            other => panic!("a known revoked principal is refused: {other:?}"),
        }
        let with = |jti| Request { token_id: jti, ..Request::new(&bob, None) };
        assert!(matches!(open.admit(&with(Some("t-1"))).await, Err(Refused { error: LimitError::Revoked, .. })));
        assert!(open.admit(&with(Some("t-2"))).await.is_ok(), "another token of bob's: the local bucket decides");
        open.set_revoked(HashMap::from([(alice.clone(), vec![(None, 1)])]));
        assert!(open.admit(&Request::new(&alice, None)).await.is_ok(), "an ended revocation refuses nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn the_breaker_stops_calling_a_failing_store_then_tries_again() {
        let store = FakeStore::new();
        store.down.store(true, Ordering::Relaxed);
        let l = limiter(store.clone(), cfg(5, 1.0));
        let alice = UserKey::new("alice").expect("key");
        for _ in 0..10 {
            assert!(l.admit(&Request::new(&alice, None)).await.is_err());
        }
        assert_eq!(store.calls.load(Ordering::Relaxed), 3, "three failures open the breaker");
        store.down.store(false, Ordering::Relaxed);
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(passes(&l, &alice).await.is_ok());
        assert!(passes(&l, &alice).await.is_ok());
        assert_eq!(store.calls.load(Ordering::Relaxed), 5);
    }
}
