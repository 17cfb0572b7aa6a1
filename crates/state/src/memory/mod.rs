//! The embedded default for one process: the same contract as Redis, with maps and broadcast channels.
//! It is single-replica only: two processes never see each other's sessions.
//!
//! Sessions, event logs, routing, limits and idempotency records are here, behind one lock; durable tasks are in
//! [`tasks`], behind a lock of their own.

mod fleet;
mod grants;
mod policy;
mod revocation;
mod tasks;

use crate::limits::{Admission, Admitted, Refusal, SessionOp, SlotSet, TokenBucket, WindowReading};
use crate::stateless::{Claim, ClaimSpec, IdempotencyKey};
use crate::tasks::{
    AfterTake, Asked, CancelOutcome, NewTask, QueueStats, Queued, Requeue, RunCheck, TaskEnd, TaskKey, TaskStore,
    TaskView, TaskWork, UpdateOutcome,
};
use crate::types::UserKey;
use crate::types::{
    AppendOptions, EndedSession, Event, EventId, LeaseToken, NewSession, OpenStream, Ring, SessionInfo, SessionKey,
    StreamState,
};
use crate::{
    Delivery, EventStore, IdempotencyStore, LimitStore, Result, Router, SessionStore, StateError, Subscription,
};
use async_trait::async_trait;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tasks::Tasks;
use tokio::sync::broadcast;

/// The in-memory store. Cheap to clone; clones share state.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    /// Task records and the work queue, behind a lock of their own (see [`tasks`]).
    tasks: Arc<Mutex<Tasks>>,
    max_events: Option<usize>,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<SessionKey, Session>,
    doorbells: HashMap<SessionKey, broadcast::Sender<Ring>>,
    last_id: (u64, u64),
    /// Calls since the last sweep of expired sessions and idle doorbells.
    since_sweep: usize,
    /// Token buckets by (user, name), with the time they are full again.
    buckets: HashMap<(UserKey, String), (TokenBucket, Instant)>,
    /// Fixed windows by (user, name): uses and end.
    windows: HashMap<(UserKey, String), (u64, Instant)>,
    /// Tenants' shared windows by (tenant, name): uses leased and end.
    tenant_windows: HashMap<(String, String), (u64, Instant)>,
    /// Leased slots by (user, set): token → lease expiry.
    slots: HashMap<(UserKey, SlotSet), HashMap<String, Instant>>,
    /// Principals' notice channels.
    notices: HashMap<UserKey, broadcast::Sender<Ring>>,
    /// Idempotency records and their expiry.
    idempotency: HashMap<IdempotencyKey, (Record, Instant)>,
    /// The policy version in force, and the fleet's notice channel (see [`fleet`]).
    policy: fleet::PolicyHeld,
    /// Revocations by principal (field → until, ms) and the fleet's registry (see [`fleet`]).
    revocations: fleet::RevocationsHeld,
    /// URL-mode grants, their refresh locks and the authorizations in progress (see [`fleet`]).
    grants: fleet::GrantsHeld,
    /// DPoP proofs seen, by (user, proof id), until they could no longer be accepted.
    proofs: HashMap<(UserKey, String), Instant>,
}

#[derive(Debug)]
struct Record {
    digest: String,
    /// The runner's token while it runs; `None` once done.
    runner: Option<String>,
    result: String,
}

/// Seconds on the monotonic clock, for the bucket maths.
fn clock(t: Instant) -> f64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    t.saturating_duration_since(*EPOCH.get_or_init(Instant::now)).as_secs_f64()
}

#[derive(Debug)]
struct Session {
    info: SessionInfo,
    ttl: Duration,
    expires: Instant,
    streams: u64,
    holder: Option<String>,
    request_ids: HashMap<u64, String>,
    /// Pending server→client requests, with the waiter's traceparent.
    pending: HashMap<String, Option<String>>,
    responses: HashMap<String, String>,
    cancellations: HashMap<String, Instant>,
    leases: HashMap<u64, Instant>,
    /// The last place (`AppendOptions::seq`) written to each running POST stream, and that event's id.
    seqs: HashMap<u64, (u64, EventId)>,
    events: VecDeque<Event>,
}

impl Session {
    fn new(s: &NewSession) -> Self {
        Self {
            info: SessionInfo {
                protocol_version: s.protocol_version.clone(),
                client_capabilities: s.client_capabilities.clone(),
                log_level: None,
            },
            ttl: s.idle_ttl,
            expires: Instant::now() + s.idle_ttl,
            streams: 0,
            holder: None,
            request_ids: HashMap::new(),
            pending: HashMap::new(),
            responses: HashMap::new(),
            cancellations: HashMap::new(),
            leases: HashMap::new(),
            seqs: HashMap::new(),
            events: VecDeque::new(),
        }
    }
}

const CANCEL_TTL: Duration = Duration::from_secs(60);
/// Expired sessions are dropped on access, and all of them every this many calls.
const SWEEP_EVERY: usize = 1024;

impl MemoryStore {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A store that keeps at most `max_events` events per session, like Redis' `MAXLEN`.
    #[must_use]
    pub fn with_max_events(max_events: usize) -> Self {
        Self { max_events: Some(max_events), ..Self::default() }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.since_sweep += 1;
        if g.since_sweep >= SWEEP_EVERY {
            g.sweep();
        }
        g
    }

    /// The task records and the work queue; the call counts towards their next sweep.
    fn task_lock(&self) -> MutexGuard<'_, Tasks> {
        let mut g = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        g.tick();
        g
    }
}

impl Inner {
    fn live(&mut self, key: &SessionKey) -> Option<&mut Session> {
        let now = Instant::now();
        if self.sessions.get(key).is_some_and(|s| s.expires <= now) {
            self.sessions.remove(key);
        }
        self.sessions.get_mut(key)
    }

    fn sweep(&mut self) {
        let now = Instant::now();
        self.since_sweep = 0;
        self.sessions.retain(|_, s| s.expires > now);
        for s in self.sessions.values_mut() {
            s.cancellations.retain(|_, exp| *exp > now);
        }
        self.doorbells.retain(|_, tx| tx.receiver_count() > 0);
        self.buckets.retain(|_, (_, full)| *full > now);
        self.windows.retain(|_, (_, end)| *end > now);
        self.tenant_windows.retain(|_, (_, end)| *end > now);
        for set in self.slots.values_mut() {
            set.retain(|_, exp| *exp > now);
        }
        self.slots.retain(|_, set| !set.is_empty());
        self.notices.retain(|_, tx| tx.receiver_count() > 0);
        self.idempotency.retain(|_, (_, exp)| *exp > now);
        self.proofs.retain(|_, until| *until > now);
    }

    /// The live record of `key`, if any (an expired one is dropped).
    fn record(&mut self, key: &IdempotencyKey) -> Option<&mut Record> {
        let now = Instant::now();
        if self.idempotency.get(key).is_some_and(|(_, exp)| *exp <= now) {
            self.idempotency.remove(key);
        }
        self.idempotency.get_mut(key).map(|(r, _)| r)
    }

    /// The record of `key` while `token` runs it.
    fn running(&mut self, key: &IdempotencyKey, token: &str) -> Option<&mut (Record, Instant)> {
        let now = Instant::now();
        self.idempotency.get_mut(key).filter(|(r, exp)| *exp > now && r.runner.as_deref() == Some(token))
    }

    fn live_slots(&mut self, user: &UserKey, set: SlotSet, now: Instant) -> &mut HashMap<String, Instant> {
        let slots = self.slots.entry((user.clone(), set)).or_default();
        slots.retain(|_, exp| *exp > now);
        slots
    }

    fn next_id(&mut self, stream: u64) -> EventId {
        let now = mcpfleet_core::time::epoch_ms();
        let (ms, seq) = if now > self.last_id.0 { (now, 0) } else { (self.last_id.0, self.last_id.1 + 1) };
        self.last_id = (ms, seq);
        EventId { stream, ms, seq }
    }

    fn ring(&self, key: &SessionKey, ring: Ring) {
        if let Some(tx) = self.doorbells.get(key) {
            let _ = tx.send(ring);
        }
    }

    fn push(&mut self, key: &SessionKey, max: Option<usize>, stream: u64, data: &str, is_final: bool) -> EventId {
        let id = self.next_id(stream);
        if let Some(s) = self.sessions.get_mut(key) {
            s.events.push_back(Event { id, data: data.to_owned(), is_final });
            if let Some(max) = max {
                while s.events.len() > max {
                    s.events.pop_front();
                }
            }
        }
        self.ring(key, Ring::Event(stream));
        id
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    async fn touch_session(&self, key: &SessionKey) -> Result<Option<SessionInfo>> {
        let mut g = self.lock();
        Ok(g.live(key).map(|s| {
            s.expires = Instant::now() + s.ttl;
            s.info.clone()
        }))
    }

    async fn set_log_level(&self, key: &SessionKey, level: &str) -> Result<bool> {
        let mut g = self.lock();
        Ok(g.live(key).map(|s| s.info.log_level = Some(level.to_owned())).is_some())
    }

    async fn delete_session(&self, key: &SessionKey) -> Result<Option<EndedSession>> {
        let mut g = self.lock();
        let ended = g.live(key).map(|s| EndedSession { protocol_version: s.info.protocol_version.clone() });
        if ended.is_some() {
            g.sessions.remove(key);
            g.ring(key, Ring::Closed);
        }
        Ok(ended)
    }
}

#[async_trait]
impl EventStore for MemoryStore {
    async fn open_stream(&self, key: &SessionKey, open: &OpenStream) -> Result<(u64, EventId)> {
        let mut g = self.lock();
        let s = g.live(key).ok_or(StateError::SessionNotFound)?;
        let (k, lease) = match open {
            OpenStream::Post { request_id, lease, .. } => {
                s.streams += 1;
                s.request_ids.insert(s.streams, request_id.clone());
                (s.streams, *lease)
            }
            OpenStream::Standalone { token, lease } => {
                s.holder = Some(token.0.clone());
                (0, *lease)
            }
        };
        s.leases.insert(k, Instant::now() + lease);
        let id = g.push(key, self.max_events, k, "", false);
        if let OpenStream::Standalone { token, .. } = open {
            g.ring(key, Ring::Takeover(token.0.clone()));
        }
        Ok((k, id))
    }

    async fn append(&self, key: &SessionKey, stream: u64, data: &str, opts: &AppendOptions) -> Result<EventId> {
        let mut g = self.lock();
        let s = g.live(key).ok_or(StateError::SessionNotFound)?;
        if let (Some(q), Some((seen, id))) = (opts.seq, s.seqs.get(&stream)) {
            if *seen == q {
                return Ok(*id);
            }
            if *seen > q {
                return Err(StateError::Superseded);
            }
        }
        if stream != 0 && !s.leases.contains_key(&stream) {
            return Err(StateError::StreamFinished);
        }
        if opts.is_final {
            s.leases.remove(&stream);
            s.request_ids.remove(&stream);
            s.seqs.remove(&stream);
        } else if let (Some(l), true) = (opts.lease, stream != 0) {
            s.leases.insert(stream, Instant::now() + l);
        }
        if let Some(p) = &opts.pending_request {
            s.pending.insert(p.clone(), opts.pending_trace.clone());
        }
        let id = g.push(key, self.max_events, stream, data, opts.is_final);
        if let (Some(q), false) = (opts.seq, opts.is_final)
            && let Some(s) = g.live(key)
        {
            s.seqs.insert(stream, (q, id));
        }
        Ok(id)
    }

    async fn renew_lease(&self, key: &SessionKey, stream: u64, token: &LeaseToken, ttl: Duration) -> Result<bool> {
        let mut g = self.lock();
        let Some(s) = g.live(key) else { return Ok(false) };
        if stream == 0 && s.holder.as_deref() != Some(token.0.as_str()) {
            return Ok(false);
        }
        let now = Instant::now();
        match s.leases.get_mut(&stream) {
            Some(exp) => {
                *exp = now + ttl;
                s.expires = now + s.ttl;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn read_after(
        &self,
        key: &SessionKey,
        stream: u64,
        cursor: &EventId,
        check_stream: bool,
        limit: usize,
    ) -> Result<(Vec<Event>, EventId)> {
        let mut g = self.lock();
        let s = g.live(key).ok_or(StateError::SessionNotFound)?;
        let pos = |e: &Event| (e.id.ms, e.id.seq);
        let at = s.events.iter().position(|e| pos(e) == (cursor.ms, cursor.seq)).ok_or(StateError::CursorGone)?;
        if check_stream && s.events[at].id.stream != stream {
            return Err(StateError::CursorGone);
        }
        let mut last = *cursor;
        let mut out = Vec::new();
        for e in s.events.iter().skip(at + 1).take(limit.max(1)) {
            last = EventId { stream, ..e.id };
            if e.id.stream == stream {
                out.push(e.clone());
            }
        }
        Ok((out, last))
    }

    async fn stream_state(&self, key: &SessionKey, stream: u64) -> Result<StreamState> {
        let mut g = self.lock();
        let s = g.live(key).ok_or(StateError::SessionNotFound)?;
        Ok(match s.leases.get(&stream) {
            None => StreamState::Finished,
            Some(exp) if *exp > Instant::now() => StreamState::Running,
            Some(_) => StreamState::Abandoned { request_id: s.request_ids.get(&stream).cloned().unwrap_or_default() },
        })
    }

    async fn abandon_stream(&self, key: &SessionKey, stream: u64, data: &str) -> Result<Option<EventId>> {
        let mut g = self.lock();
        let s = g.live(key).ok_or(StateError::SessionNotFound)?;
        match s.leases.get(&stream) {
            Some(exp) if *exp <= Instant::now() => {
                s.leases.remove(&stream);
                s.request_ids.remove(&stream);
                s.seqs.remove(&stream);
                Ok(Some(g.push(key, self.max_events, stream, data, true)))
            }
            _ => Ok(None),
        }
    }
}

impl MemoryStore {
    /// The counters of an admission (everything but the task read), under the lock.
    fn count(&self, a: &Admission<'_>) -> Result<Admitted> {
        let mut g = self.lock();
        let now = Instant::now();
        let mut out =
            Admitted { refused: None, bucket: None, session: None, slots_used: None, window: None, task: None };
        if let Some((set, tokens)) = a.release {
            let slots = g.live_slots(a.user, set, now);
            for t in tokens {
                slots.remove(t);
            }
        }
        if g.revocations.refuses(a.user, a.token_id) {
            out.refused = Some(Refusal::Revoked);
            return Ok(out);
        }
        if let Some((id, ttl)) = a.proof {
            // Recorded whatever the decision: a proof seen once is never accepted again.
            let seen = g.proofs.insert((a.user.clone(), id.to_owned()), now + ttl).is_some_and(|until| until > now);
            if seen {
                out.refused = Some(Refusal::Replayed);
                return Ok(out);
            }
        }
        if let Some(b) = a.bucket {
            let entry = g
                .buckets
                .entry((a.user.clone(), b.name.clone()))
                .or_insert_with(|| (TokenBucket::full(b.capacity, clock(now)), now));
            if entry.1 <= now {
                entry.0 = TokenBucket::full(b.capacity, clock(now));
            }
            let r = entry.0.take(clock(now), b.capacity, b.per_second, 1.0);
            if r.allowed {
                entry.1 = now + r.wait;
            }
            out.bucket = Some(r);
            if !r.allowed {
                out.refused = Some(Refusal::Bucket);
                return Ok(out);
            }
        }
        match a.session {
            SessionOp::None => {}
            SessionOp::Touch(id) => {
                let key = SessionKey { user: a.user.clone(), id: id.clone() };
                match g.live(&key) {
                    Some(s) => {
                        s.expires = now + s.ttl;
                        out.session = Some(s.info.clone());
                    }
                    None => {
                        out.refused = Some(Refusal::SessionNotFound);
                        return Ok(out);
                    }
                }
            }
            SessionOp::Create { id, session, max_sessions } => {
                let key = SessionKey { user: a.user.clone(), id: id.clone() };
                if g.live(&key).is_some() {
                    out.refused = Some(Refusal::SessionConflict);
                    return Ok(out);
                }
                let open = g.sessions.iter().filter(|(k, s)| k.user == *a.user && s.expires > now).count();
                let open = u64::try_from(open).unwrap_or(u64::MAX);
                if max_sessions > 0 && open >= max_sessions {
                    out.refused = Some(Refusal::Sessions { open });
                    return Ok(out);
                }
                g.sessions.insert(key, Session::new(session));
            }
        }
        let mut slot_used = None;
        if let Some(slot) = a.slot {
            let used = u64::try_from(g.live_slots(a.user, slot.set, now).len()).unwrap_or(u64::MAX);
            if slot.cap > 0 && used >= slot.cap {
                out.slots_used = Some(used);
                out.refused = Some(Refusal::Slots { used });
                return Ok(out);
            }
            slot_used = Some(used);
        }
        if let Some(w) = a.window {
            let k = (a.user.clone(), w.name.clone());
            if let Some((used, end)) = g.windows.get(&k).copied().filter(|(_, end)| *end > now)
                && used >= w.limit
            {
                out.window = Some(WindowReading { used, reset: Some(end - now) });
                out.refused = Some(Refusal::Window);
                out.slots_used = slot_used;
                return Ok(out);
            }
        }
        if let (Some(slot), Some(used)) = (a.slot, slot_used) {
            g.live_slots(a.user, slot.set, now).insert(slot.token.clone(), now + slot.ttl);
            out.slots_used = Some(used + 1);
        }
        if let Some(w) = a.window {
            let e = g.windows.entry((a.user.clone(), w.name.clone())).or_insert((0, now + w.window));
            if e.1 <= now {
                *e = (0, now + w.window);
            }
            e.0 += 1;
            out.window = Some(WindowReading { used: e.0, reset: Some(e.1 - now) });
        }
        Ok(out)
    }
}

#[async_trait]
impl LimitStore for MemoryStore {
    async fn admit(&self, a: &Admission<'_>) -> Result<Admitted> {
        let mut out = self.count(a)?;
        if let Some(key) = a.read_task {
            out.task = Some(crate::TaskStore::get_task(self, key).await?);
        }
        Ok(out)
    }

    async fn renew_slot(&self, user: &UserKey, set: SlotSet, token: &str, ttl: Duration) -> Result<bool> {
        let mut g = self.lock();
        let now = Instant::now();
        Ok(g.live_slots(user, set, now).get_mut(token).map(|exp| *exp = now + ttl).is_some())
    }

    async fn release_slots(&self, user: &UserKey, set: SlotSet, tokens: &[String]) -> Result<()> {
        let mut g = self.lock();
        let slots = g.live_slots(user, set, Instant::now());
        for t in tokens {
            slots.remove(t);
        }
        Ok(())
    }

    async fn lease_window(
        &self,
        tenant: &str,
        name: &str,
        want: u64,
        limit: u64,
        window: Duration,
    ) -> Result<(u64, Duration)> {
        let mut g = self.lock();
        let now = Instant::now();
        let e = g.tenant_windows.entry((tenant.to_owned(), name.to_owned())).or_insert((0, now + window));
        if e.1 <= now {
            *e = (0, now + window);
        }
        let grant = want.min(limit.saturating_sub(e.0));
        e.0 += grant;
        Ok((grant, e.1 - now))
    }

    async fn refund_window(&self, user: &UserKey, name: &str) -> Result<()> {
        let mut g = self.lock();
        if let Some(e) = g.windows.get_mut(&(user.clone(), name.to_owned())) {
            e.0 = e.0.saturating_sub(1);
        }
        Ok(())
    }
}

#[derive(Debug)]
struct MemorySubscription(broadcast::Receiver<Ring>);

#[async_trait]
impl Subscription for MemorySubscription {
    async fn recv(&mut self) -> Option<Ring> {
        match self.0.recv().await {
            Ok(r) => Some(r),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(Ring::Lagged),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

#[async_trait]
impl Router for MemoryStore {
    async fn subscribe(&self, key: &SessionKey) -> Result<Box<dyn Subscription>> {
        let mut g = self.lock();
        let tx = g.doorbells.entry(key.clone()).or_insert_with(|| broadcast::channel(256).0);
        Ok(Box::new(MemorySubscription(tx.subscribe())))
    }

    async fn deliver_response(&self, key: &SessionKey, request_id: &str, message: &str) -> Result<Delivery> {
        let mut g = self.lock();
        let s = g.live(key).ok_or(StateError::SessionNotFound)?;
        let Some(waiter_trace) = s.pending.remove(request_id) else { return Ok(Delivery::NotPending) };
        s.responses.insert(request_id.to_owned(), message.to_owned());
        g.ring(key, Ring::Response(request_id.to_owned()));
        Ok(Delivery::Delivered { waiter_trace })
    }

    async fn take_response(&self, key: &SessionKey, request_id: &str) -> Result<Option<String>> {
        let mut g = self.lock();
        Ok(g.live(key).and_then(|s| s.responses.remove(request_id)))
    }

    async fn forget_pending(&self, key: &SessionKey, request_id: &str) -> Result<()> {
        let mut g = self.lock();
        if let Some(s) = g.live(key) {
            s.pending.remove(request_id);
            s.responses.remove(request_id);
        }
        Ok(())
    }

    async fn cancel_request(&self, key: &SessionKey, request_id: &str) -> Result<bool> {
        let mut g = self.lock();
        let Some(s) = g.live(key) else { return Ok(false) };
        let now = Instant::now();
        s.cancellations.retain(|_, exp| *exp > now);
        s.cancellations.insert(request_id.to_owned(), now + CANCEL_TTL);
        g.ring(key, Ring::Cancel(request_id.to_owned()));
        Ok(true)
    }

    async fn is_cancelled(&self, key: &SessionKey, request_id: &str) -> Result<bool> {
        let mut g = self.lock();
        let now = Instant::now();
        Ok(g.live(key).and_then(|s| s.cancellations.get(request_id)).is_some_and(|exp| *exp > now))
    }

    async fn subscribe_user(&self, user: &UserKey) -> Result<Box<dyn Subscription>> {
        let mut g = self.lock();
        let tx = g.notices.entry(user.clone()).or_insert_with(|| broadcast::channel(256).0);
        Ok(Box::new(MemorySubscription(tx.subscribe())))
    }

    async fn publish_user(&self, user: &UserKey, message: &str) -> Result<()> {
        let g = self.lock();
        if let Some(tx) = g.notices.get(user) {
            let _ = tx.send(Ring::Notice(message.to_owned()));
        }
        Ok(())
    }

    async fn ping(&self) -> Result<()> {
        Ok(())
    }
}

#[async_trait]
impl IdempotencyStore for MemoryStore {
    async fn claim(&self, key: &IdempotencyKey, spec: &ClaimSpec<'_>) -> Result<Claim> {
        let mut g = self.lock();
        if let Some(r) = g.record(key) {
            return Ok(if r.digest != spec.digest {
                Claim::Mismatch
            } else if r.runner.is_none() {
                Claim::Done(r.result.clone())
            } else {
                Claim::Running
            });
        }
        let r = Record { digest: spec.digest.to_owned(), runner: Some(spec.token.to_owned()), result: String::new() };
        g.idempotency.insert(key.clone(), (r, Instant::now() + spec.lease));
        Ok(Claim::Run)
    }

    async fn renew_claim(&self, key: &IdempotencyKey, token: &str, lease: Duration) -> Result<bool> {
        let mut g = self.lock();
        Ok(g.running(key, token).map(|(_, exp)| *exp = Instant::now() + lease).is_some())
    }

    async fn complete_claim(&self, key: &IdempotencyKey, token: &str, result: &str, ttl: Duration) -> Result<bool> {
        let mut g = self.lock();
        Ok(g.running(key, token)
            .map(|(r, exp)| {
                r.runner = None;
                r.result = result.to_owned();
                *exp = Instant::now() + ttl;
            })
            .is_some())
    }

    async fn release_claim(&self, key: &IdempotencyKey, token: &str) -> Result<()> {
        let mut g = self.lock();
        if g.running(key, token).is_some() {
            g.idempotency.remove(key);
        }
        Ok(())
    }
}

/// Each call runs on `Tasks` under the task lock.
#[async_trait]
impl TaskStore for MemoryStore {
    async fn create_task(&self, task: &NewTask<'_>) -> Result<Option<u64>> {
        self.task_lock().create_task(task)
    }

    async fn get_task(&self, key: &TaskKey) -> Result<Option<TaskView>> {
        self.task_lock().get_task(key)
    }

    async fn update_task(&self, key: &TaskKey, answers: &[(String, String)]) -> Result<Option<UpdateOutcome>> {
        self.task_lock().update_task(key, answers)
    }

    async fn cancel_task(&self, key: &TaskKey) -> Result<Option<CancelOutcome>> {
        self.task_lock().cancel_task(key)
    }

    async fn start_task(&self, key: &TaskKey, generation: u64, _replica: &str) -> Result<Option<TaskWork>> {
        self.task_lock().start_task(key, generation)
    }

    async fn ask_task(&self, key: &TaskKey, generation: u64, input: &str, request: &str) -> Result<Asked> {
        self.task_lock().ask_task(key, generation, input, request)
    }

    async fn check_task(&self, key: &TaskKey, generation: u64) -> Result<RunCheck> {
        self.task_lock().check_task(key, generation)
    }

    async fn finish_task(&self, key: &TaskKey, generation: u64, end: &TaskEnd) -> Result<Option<TaskView>> {
        self.task_lock().finish_task(key, generation, end)
    }

    async fn requeue_task(&self, key: &TaskKey, generation: u64) -> Result<Requeue> {
        self.task_lock().requeue_task(key, generation)
    }

    async fn enqueue(&self, shard: u16, key: &TaskKey, generation: u64, check: Duration) -> Result<()> {
        self.task_lock().enqueue(shard, key, generation, check)
    }

    async fn dequeue(&self, shard: u16, _consumer: &str, count: usize, stale_after: Duration) -> Result<Vec<Queued>> {
        self.task_lock().dequeue(shard, count, stale_after)
    }

    async fn settle(&self, shard: u16, entry: &Queued, then: AfterTake) -> Result<()> {
        self.task_lock().settle(shard, entry, then)
    }

    async fn renew_task_leases(
        &self,
        shard: u16,
        runs: &[(TaskKey, u64)],
        ttl: Duration,
    ) -> Result<Vec<(TaskKey, u64)>> {
        self.task_lock().renew_task_leases(shard, runs, ttl)
    }

    async fn lease_task(&self, shard: u16, key: &TaskKey, generation: u64, ttl: Duration) -> Result<()> {
        self.task_lock().lease_task(shard, key, generation, ttl)
    }

    async fn release_task_lease(&self, shard: u16, key: &TaskKey, generation: u64) -> Result<()> {
        self.task_lock().release_task_lease(shard, key, generation)
    }

    async fn expired_task_leases(&self, shard: u16, grace: Duration, limit: usize) -> Result<Vec<(TaskKey, u64)>> {
        self.task_lock().expired_task_leases(shard, grace, limit)
    }

    async fn subscribe_queue(&self, _shards: u16) -> Result<Box<dyn Subscription>> {
        Ok(Box::new(MemorySubscription(self.task_lock().subscribe_queue())))
    }

    async fn tidy_consumers(&self, _shard: u16, _leaving: Option<&str>, _idle: Duration) -> Result<u64> {
        // One process: no consumers to keep apart.
        Ok(0)
    }

    async fn queue_stats(&self, shard: u16) -> Result<QueueStats> {
        self.task_lock().queue_stats(shard)
    }
}
