//! Admissions that ride together (issue 32): while one principal's admission is on its way to Redis, the
//! admissions of that principal that arrive on this replica wait in a *lane*, and go as one `admit.lua` call as
//! soon as it is back. Nothing waits for company: a lone admission goes at once, so batching adds no latency when
//! there is nothing to batch, and under load each admission still takes one round trip (the one its batch takes).
//!
//! A lane is keyed by everything the batch's admissions share in `admit.lua`: the principal's keys (one hash tag,
//! so one slot on Redis Cluster), the bucket, slot set and window, and their parameters. Redis decides each
//! admission as it would alone, one after the other; the batch saves what they share (the script call, the clock,
//! the bucket's read and write, the slot count, one `ZADD` of the new leases, one `ZREM` of the releases).
//!
//! The first admission of an idle lane sends itself from its own task; whatever queued meanwhile is sent by a task
//! spawned for the lane, which keeps sending until the lane is empty. An admission whose caller gave up while it
//! waited is dropped before its batch goes, so it takes nothing.

use super::RedisStore;
use super::codec::array;
use crate::{Result, StateError};
use redis::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::oneshot;

/// At most this many admissions in one `admit.lua` call (about 30k Redis instructions each: a batch blocks Redis
/// for well under a millisecond).
pub(super) const MAX_BATCH: usize = 32;

/// The values `admit.lua` returns for each admission.
pub(super) const REPLY_LEN: usize = 9;

/// What a batch's admissions share: the keys and arguments `admit.lua` takes once.
pub(super) struct Shared {
    /// Every shared key and argument, end to end: the lane's name.
    pub(super) lane: String,
    /// The bucket, the slot set, the window and, when the user's sessions are counted, the session index.
    pub(super) keys: Vec<String>,
    /// Capacity, per second, slot cap, slot ttl (ms), window limit, window (ms); `''` for what is off.
    pub(super) args: [String; 6],
}

impl Shared {
    pub(super) fn new(keys: Vec<String>, args: [String; 6]) -> Self {
        let mut lane = String::with_capacity(
            keys.iter().map(|k| k.len() + 1).sum::<usize>() + args.iter().map(|a| a.len() + 1).sum::<usize>(),
        );
        for part in keys.iter().chain(args.iter()) {
            lane.push_str(part);
            // Neither a key nor an argument holds a NUL: the parts cannot run into each other.
            lane.push('\0');
        }
        Self { lane, keys, args }
    }
}

/// One admission's own part: its operation, its session's keys and its arguments, and the releases it carries.
pub(super) struct Entry {
    /// `''`, `touch`, `tap` or `create`.
    pub(super) op: &'static str,
    pub(super) sid: String,
    /// The slot's token (`''` when there is no slot).
    pub(super) token: String,
    /// The session's keys (session, events, leases) for a touch or a create.
    pub(super) keys: Option<[String; 3]>,
    /// A create's max sessions, idle ttl (ms), protocol version and capabilities.
    pub(super) create: Option<(u64, u64, String, String)>,
    pub(super) releases: Vec<String>,
}

struct Waiter {
    entry: Entry,
    tx: oneshot::Sender<Result<Vec<Value>>>,
}

struct Lane {
    shared: Arc<Shared>,
    waiting: Vec<Waiter>,
}

/// The lanes in use on this replica: a lane exists while one of its batches is on its way.
#[derive(Default)]
pub(super) struct Lanes {
    map: Mutex<HashMap<String, Lane>>,
}

impl Lanes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Lane>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Up to [`MAX_BATCH`] of the lane's waiting admissions, or `None` (and the lane is gone) when none waits.
    fn next(&self, lane: &str) -> Option<(Arc<Shared>, Vec<Waiter>)> {
        let mut map = self.lock();
        let l = map.get_mut(lane)?;
        if l.waiting.is_empty() {
            map.remove(lane);
            return None;
        }
        let n = l.waiting.len().min(MAX_BATCH);
        Some((l.shared.clone(), l.waiting.drain(..n).collect()))
    }
}

/// Hands a lane's waiting admissions to a task of their own when the admission that sent itself is done, or is
/// dropped on the way (its caller gave up): they never wait for an admission that is gone.
struct Handover {
    store: RedisStore,
    lane: String,
}

impl Drop for Handover {
    fn drop(&mut self) {
        let Some((shared, batch)) = self.store.inner.lanes.next(&self.lane) else { return };
        let lane = std::mem::take(&mut self.lane);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(drive(self.store.clone(), lane, shared, batch));
            }
            // No runtime to send them from (it is shutting down): they fail (dropped senders), and so does the
            // lane's next arrival's wait, never forever.
            Err(_) => {
                self.store.inner.lanes.lock().remove(&lane);
            }
        }
    }
}

/// Sends the lane's batches until none waits.
async fn drive(store: RedisStore, lane: String, mut shared: Arc<Shared>, mut batch: Vec<Waiter>) {
    loop {
        batch.retain(|w| !w.tx.is_closed());
        if !batch.is_empty() {
            let entries: Vec<&Entry> = batch.iter().map(|w| &w.entry).collect();
            match store.send_admissions(&shared, &entries).await {
                Ok(replies) => {
                    for (w, reply) in batch.drain(..).zip(replies) {
                        let _ = w.tx.send(Ok(reply));
                    }
                }
                Err(e) => {
                    for w in batch.drain(..) {
                        let _ = w.tx.send(Err(e.clone()));
                    }
                }
            }
        }
        match store.inner.lanes.next(&lane) {
            Some((s, b)) => (shared, batch) = (s, b),
            None => return,
        }
    }
}

impl RedisStore {
    /// `entry`'s admission, in a batch with the others of its lane that are waiting: its nine reply values.
    pub(super) async fn admit_in_lane(&self, shared: Shared, entry: Entry) -> Result<Vec<Value>> {
        let shared = Arc::new(shared);
        let rx = {
            let mut map = self.inner.lanes.lock();
            if let Some(l) = map.get_mut(&shared.lane) {
                let (tx, rx) = oneshot::channel();
                l.waiting.push(Waiter { entry, tx });
                Err(rx)
            } else {
                map.insert(shared.lane.clone(), Lane { shared: shared.clone(), waiting: Vec::new() });
                Ok(entry)
            }
        };
        match rx {
            Ok(entry) => {
                let _handover = Handover { store: self.clone(), lane: shared.lane.clone() };
                let mut replies = self.send_admissions(&shared, &[&entry]).await?;
                replies.pop().ok_or(StateError::Protocol("bad admit reply"))
            }
            Err(rx) => rx.await.map_err(|_| StateError::Protocol("an admission batch was dropped"))?,
        }
    }

    /// The `admit.lua` call of `entries` (one or a batch): each admission's reply values, in order.
    pub(super) async fn send_admissions(&self, shared: &Shared, entries: &[&Entry]) -> Result<Vec<Vec<Value>>> {
        let inv = self.admissions(shared, entries);
        if let Some(m) = &self.inner.cfg.metrics {
            m.admissions(entries.len());
        }
        split(self.run("admit", inv).await?, entries.len())
    }

    /// The `admit.lua` invocation of `entries`.
    pub(super) fn admissions<'a>(&'a self, shared: &Shared, entries: &[&Entry]) -> redis::ScriptInvocation<'a> {
        let mut inv = self.inner.scripts.admit.prepare_invoke();
        for k in &shared.keys {
            inv.key(k);
        }
        for e in entries {
            for k in e.keys.iter().flatten() {
                inv.key(k);
            }
        }
        for a in &shared.args {
            inv.arg(a);
        }
        inv.arg(entries.len());
        for e in entries {
            inv.arg(e.op).arg(&e.sid).arg(&e.token);
            if let Some((max, ttl, pv, caps)) = &e.create {
                inv.arg(max).arg(ttl).arg(pv).arg(caps);
            }
        }
        for e in entries {
            for r in &e.releases {
                inv.arg(r);
            }
        }
        inv
    }
}

/// `admit.lua`'s reply, as each of `n` admissions' values: a lone admission's values come as they are, a batch's
/// as a table for each.
pub(super) fn split(reply: Value, n: usize) -> Result<Vec<Vec<Value>>> {
    let all = array(reply)?;
    let each = if n == 1 {
        vec![all]
    } else if all.len() == n {
        all.into_iter().map(array).collect::<Result<Vec<_>>>()?
    } else {
        return Err(StateError::Protocol("bad admit reply"));
    };
    if each.iter().any(|v| v.len() != REPLY_LEN) {
        return Err(StateError::Protocol("bad admit reply"));
    }
    Ok(each)
}
