//! Admissions that ride together (issue 32): one principal's admissions that are ready on this replica at the same
//! moment go to Redis as one `admit.lua` call. The first to arrive opens the principal's *lane* and yields once,
//! so that the tasks already ready to run (requests read in the same turn of the event loop, and those on the other
//! worker threads meanwhile) can join it; then it closes the lane and sends what joined, itself first. Nothing
//! waits for a round trip: an admission that arrives once the lane is closed opens the next one, even while the
//! last batch is still on its way. A lone admission costs one yield more than before.
//!
//! A lane is keyed by everything the batch's admissions share in `admit.lua`: the principal's keys (one hash tag,
//! so one slot on Redis Cluster), the bucket, slot set and window, and their parameters. Redis decides each
//! admission as it would alone, one after the other; the batch saves what they share (the script call, the clock,
//! the bucket's read and write, the slot count, one `ZADD` of the new leases, one `ZREM` of the releases).
//!
//! A batch is sent by the task of its first admission and finished by a task of its own if that admission's caller
//! gives up on the way, so the others never fail with it; an admission whose caller gave up before its batch went
//! is left out, so it takes nothing. Measured in docs/BENCHMARKS.md ("Admissions that ride together").

use super::RedisStore;
use super::codec::array;
use super::lanes::{Entry, MAX_BATCH, REPLY_LEN, SHORT_REPLY_LEN, Shared, Waiter};
use crate::{Result, StateError};
use redis::Value;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::oneshot;

/// Closes a lane when its first admission is dropped while it gathers (its caller gave up): the others go without
/// it, never left waiting.
struct Gathering {
    store: RedisStore,
    shared: Arc<Shared>,
    open: bool,
}

impl Gathering {
    /// Closes the lane once the others had their turn: what joined it.
    fn close(mut self) -> Vec<Waiter> {
        self.open = false;
        self.store.inner.lanes.close(&self.shared.lane)
    }
}

impl Drop for Gathering {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        let waiting = self.store.inner.lanes.close(&self.shared.lane);
        send_all(&self.store, &self.shared, waiting);
    }
}

/// Sends `waiting` from tasks of their own, [`MAX_BATCH`] at a time, each answered on its channel.
fn send_all(store: &RedisStore, shared: &Arc<Shared>, mut waiting: Vec<Waiter>) {
    // Without a runtime (it is shutting down) the senders drop, and each waiting caller gets an error.
    let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
    while !waiting.is_empty() {
        let rest = waiting.split_off(waiting.len().min(MAX_BATCH));
        let batch = std::mem::replace(&mut waiting, rest);
        rt.spawn(send_batch(store.clone(), shared.clone(), batch));
    }
}

/// A future run in place that, dropped before it is done, is finished by a task of its own.
struct Detached(Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>);

impl Future for Detached {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let Some(f) = self.0.as_mut() else { return std::task::Poll::Ready(()) };
        let done = f.as_mut().poll(cx);
        if done.is_ready() {
            self.0 = None;
        }
        done
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        if let (Some(f), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(f);
        }
    }
}

/// One batch: the waiters whose callers are still there, each answered on its channel.
async fn send_batch(store: RedisStore, shared: Arc<Shared>, mut batch: Vec<Waiter>) {
    batch.retain(|w| !w.tx.is_closed());
    if batch.is_empty() {
        return;
    }
    let entries: Vec<&Entry> = batch.iter().map(|w| &w.entry).collect();
    match store.send_admissions(&shared, &entries).await {
        Ok(replies) => {
            for (w, reply) in batch.into_iter().zip(replies) {
                let _ = w.tx.send(Ok(reply));
            }
        }
        Err(e) => {
            for w in batch {
                let _ = w.tx.send(Err(e.clone()));
            }
        }
    }
}

impl RedisStore {
    /// `entry`'s admission, in one call with the others of its lane that are ready at the same moment: its reply
    /// values.
    pub(super) async fn admit_in_lane(&self, shared: Shared, entry: Entry) -> Result<Vec<Value>> {
        let shared = Arc::new(shared);
        let joined = {
            let mut map = self.inner.lanes.lock();
            if let Some(waiting) = map.get_mut(&shared.lane) {
                let (tx, rx) = oneshot::channel();
                waiting.push(Waiter { entry, tx });
                Err(rx)
            } else {
                map.insert(shared.lane.clone(), Vec::new());
                Ok(entry)
            }
        };
        let entry = match joined {
            Err(rx) => return rx.await.map_err(|_| StateError::Protocol("an admission batch was dropped"))?,
            Ok(entry) => entry,
        };
        // The tasks that are ready now (requests read in the same turn of the event loop) run first, and join.
        let gathering = Gathering { store: self.clone(), shared: shared.clone(), open: true };
        tokio::task::yield_now().await;
        let mut waiting = gathering.close();
        if waiting.is_empty() {
            return self.send_one(&shared, &entry).await;
        }
        // The batch is sent from here, and finished by a task of its own if this caller gives up on the way: the
        // others must not fail with it. Its own answer is on its channel by the time the batch is done.
        let (tx, rx) = oneshot::channel();
        waiting.insert(0, Waiter { entry, tx });
        let rest = waiting.split_off(waiting.len().min(MAX_BATCH));
        send_all(self, &shared, rest);
        Detached(Some(Box::pin(send_batch(self.clone(), shared, waiting)))).await;
        rx.await.map_err(|_| StateError::Protocol("an admission batch was dropped"))?
    }

    /// The `admit.lua` call of `entries` (one or a batch): each admission's reply values, in order.
    async fn send_admissions(&self, shared: &Shared, entries: &[&Entry]) -> Result<Vec<Vec<Value>>> {
        split(self.run("admit", self.admissions(shared, entries)).await?, entries.len())
    }

    /// The `admit.lua` call of `entry` alone: its reply values.
    pub(super) async fn send_one(&self, shared: &Shared, entry: &Entry) -> Result<Vec<Value>> {
        one(self.send_admissions(shared, &[entry]).await?)
    }

    /// The `admit.lua` invocation of `entries`, counted in `mcp_redis_admissions_total`.
    pub(super) fn admissions<'a>(&'a self, shared: &Shared, entries: &[&Entry]) -> redis::ScriptInvocation<'a> {
        if let Some(m) = &self.inner.cfg.metrics {
            m.admissions(entries.len());
        }
        let mut inv = self.inner.scripts.admit.prepare_invoke();
        for k in &shared.keys {
            inv.key(k);
        }
        for e in entries {
            for k in e.keys.iter().flatten() {
                inv.key(k);
            }
            if let Some(k) = &e.proof {
                inv.key(k);
            }
        }
        for a in &shared.args {
            inv.arg(a);
        }
        // The count of admissions, and (`<count>:<ms>`) how long to remember their DPoP proofs in a lane of them.
        match shared.proof_ttl {
            Some(ttl) => inv.arg(format!("{}:{ttl}", entries.len())),
            None => inv.arg(entries.len()),
        };
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
    if each.iter().any(|v| v.len() != REPLY_LEN && v.len() != SHORT_REPLY_LEN) {
        return Err(StateError::Protocol("bad admit reply"));
    }
    Ok(each)
}

/// The one admission's values of a reply.
pub(super) fn one(mut replies: Vec<Vec<Value>>) -> Result<Vec<Value>> {
    match (replies.pop(), replies.is_empty()) {
        (Some(reply), true) => Ok(reply),
        _ => Err(StateError::Protocol("bad admit reply")),
    }
}
