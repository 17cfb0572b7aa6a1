//! Session records, their event logs and the routing between replicas ([`SessionStore`], [`EventStore`],
//! [`Router`]), each call one script (or command) on the session's keys.

use super::codec::{array, event_id, int, ms, status, string};
use super::scripts::PubSubKind;
use super::{RedisStore, subscriber};
use crate::limits::{Admission, SessionOp};
use crate::types::UserKey;
use crate::types::{
    AppendOptions, EndedSession, Event, EventId, LeaseToken, OpenStream, SessionInfo, SessionKey, StreamState,
};
use crate::{Delivery, EventStore, LimitStore, Result, Router, SessionStore, StateError, Subscription};
use async_trait::async_trait;
use redis::Value;
use std::time::Duration;

#[async_trait]
impl SessionStore for RedisStore {
    async fn touch_session(&self, key: &SessionKey) -> Result<Option<SessionInfo>> {
        let a = Admission { session: SessionOp::Touch(&key.id), ..Admission::new(&key.user) };
        Ok(self.admit(&a).await?.session)
    }

    async fn set_log_level(&self, key: &SessionKey, level: &str) -> Result<bool> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.set_level.key(&k.session);
        inv.arg(level);
        Ok(int(&self.run("set_level", inv).await?)? == 1)
    }

    async fn delete_session(&self, key: &SessionKey) -> Result<Option<EndedSession>> {
        let k = self.keys(key);
        self.inner.known.forget(&k.session);
        let mut inv = self.inner.scripts.delete.key(&k.session);
        inv.key(&k.events).key(&k.leases).key(&k.cancellations).key(&k.doorbell).key(&k.index).arg(key.id.as_str());
        match self.run_pooled("delete", inv).await? {
            Value::Array(v) => match v.as_slice() {
                [_, pv] => Ok(Some(EndedSession { protocol_version: string(pv)? })),
                _ => Err(StateError::Protocol("bad delete reply")),
            },
            other if int(&other)? == 0 => Ok(None),
            _ => Err(StateError::Protocol("bad delete reply")),
        }
    }
}

#[async_trait]
impl EventStore for RedisStore {
    async fn open_stream(&self, key: &SessionKey, open: &OpenStream) -> Result<(u64, EventId)> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.open.key(&k.session);
        inv.key(&k.events).key(&k.leases).key(&k.doorbell);
        match open {
            OpenStream::Post { request_id, token, lease } => {
                inv.arg("post").arg(ms(*lease)).arg(&token.0).arg(self.maxlen()).arg(request_id);
            }
            OpenStream::Standalone { token, lease } => {
                inv.arg("get").arg(ms(*lease)).arg(&token.0).arg(self.maxlen()).arg("");
            }
        }
        let (code, rest) = status(self.run("open", inv).await?)?;
        match (code, rest.as_slice()) {
            (1, [n, id]) => {
                let n = u64::try_from(int(n)?).map_err(|_| StateError::Protocol("bad stream number"))?;
                Ok((n, event_id(n, id)?))
            }
            (0, _) => Err(StateError::SessionNotFound),
            _ => Err(StateError::Protocol("bad open reply")),
        }
    }

    async fn append(&self, key: &SessionKey, stream: u64, data: &str, opts: &AppendOptions) -> Result<EventId> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.append.key(&k.session);
        inv.key(&k.events).key(&k.leases).key(&k.doorbell);
        inv.arg(stream)
            .arg(data)
            .arg(if opts.is_final { "1" } else { "0" })
            .arg(self.maxlen())
            .arg(opts.pending_request.as_deref().unwrap_or(""))
            .arg(opts.lease.map(|d| ms(d).to_string()).unwrap_or_default())
            .arg(opts.pending_trace.as_deref().unwrap_or(""))
            .arg(opts.seq.map(|q| q.to_string()).unwrap_or_default());
        let (code, rest) = status(self.run("append", inv).await?)?;
        match (code, rest.as_slice()) {
            (1, [id]) => event_id(stream, id),
            (0, _) => Err(StateError::SessionNotFound),
            (2, _) => Err(StateError::StreamFinished),
            (3, _) => Err(StateError::Superseded),
            _ => Err(StateError::Protocol("bad append reply")),
        }
    }

    async fn renew_lease(&self, key: &SessionKey, stream: u64, token: &LeaseToken, ttl: Duration) -> Result<bool> {
        Ok(self.renew(key, stream, token, ttl, None).await? == 1)
    }

    async fn renew_and_peek(
        &self,
        key: &SessionKey,
        stream: u64,
        token: &LeaseToken,
        ttl: Duration,
        cursor: &EventId,
    ) -> Result<Option<bool>> {
        Ok(match self.renew(key, stream, token, ttl, Some(cursor)).await? {
            0 => None,
            1 => Some(false),
            _ => Some(true),
        })
    }

    async fn read_after(
        &self,
        key: &SessionKey,
        stream: u64,
        cursor: &EventId,
        check_stream: bool,
        limit: usize,
    ) -> Result<(Vec<Event>, EventId)> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.replay.key(&k.session);
        inv.key(&k.events)
            .arg(cursor.position())
            .arg(stream)
            .arg(if check_stream { "1" } else { "0" })
            .arg(limit.max(1));
        let (code, rest) = status(self.run_pooled("replay", inv).await?)?;
        match code {
            1 => {
                let mut it = rest.iter();
                let last = it.next().ok_or(StateError::Protocol("bad replay reply"))?;
                let last = event_id(stream, last)?;
                let mut out = Vec::new();
                while let (Some(id), Some(d), Some(f)) = (it.next(), it.next(), it.next()) {
                    out.push(Event { id: event_id(stream, id)?, data: string(d)?, is_final: string(f)? == "1" });
                }
                Ok((out, last))
            }
            0 => Err(StateError::SessionNotFound),
            3 => Err(StateError::CursorGone),
            _ => Err(StateError::Protocol("bad replay reply")),
        }
    }

    async fn stream_state(&self, key: &SessionKey, stream: u64) -> Result<StreamState> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.state.key(&k.session);
        inv.key(&k.leases).arg(stream);
        let (code, rest) = status(self.run("state", inv).await?)?;
        match (code, rest.as_slice()) {
            (0, _) => Err(StateError::SessionNotFound),
            (1, _) => Ok(StreamState::Finished),
            (2, _) => Ok(StreamState::Running),
            (3, [rq]) => Ok(StreamState::Abandoned { request_id: string(rq)? }),
            _ => Err(StateError::Protocol("bad state reply")),
        }
    }

    async fn abandon_stream(&self, key: &SessionKey, stream: u64, data: &str) -> Result<Option<EventId>> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.abandon.key(&k.session);
        inv.key(&k.events).key(&k.leases).key(&k.doorbell).arg(stream).arg(data).arg(self.maxlen());
        let (code, rest) = status(self.run("abandon", inv).await?)?;
        match (code, rest.as_slice()) {
            (1, [id]) => Ok(Some(event_id(stream, id)?)),
            (0, _) => Err(StateError::SessionNotFound),
            _ => Ok(None),
        }
    }
}

#[async_trait]
impl Router for RedisStore {
    async fn subscribe(&self, key: &SessionKey) -> Result<Box<dyn Subscription>> {
        let k = self.keys(key);
        Ok(Box::new(self.inner.subscriber.subscribe(k.doorbell, subscriber::DOORBELL_BUFFER).await?))
    }

    async fn deliver_response(&self, key: &SessionKey, request_id: &str, message: &str) -> Result<Delivery> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.deliver.key(&k.session);
        inv.key(&k.doorbell).arg(request_id).arg(message);
        let (code, rest) = status(self.run("deliver", inv).await?)?;
        match (code, rest.as_slice()) {
            (1, [trace]) => {
                let t = string(trace)?;
                Ok(Delivery::Delivered { waiter_trace: (!t.is_empty()).then_some(t) })
            }
            (0, _) => Err(StateError::SessionNotFound),
            _ => Ok(Delivery::NotPending),
        }
    }

    async fn take_response(&self, key: &SessionKey, request_id: &str) -> Result<Option<String>> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.take.key(&k.session);
        inv.arg(request_id);
        match self.run("take", inv).await? {
            Value::Nil => Ok(None),
            v => string(&v).map(Some),
        }
    }

    async fn forget_pending(&self, key: &SessionKey, request_id: &str) -> Result<()> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.forget.key(&k.session);
        inv.arg(request_id);
        self.run("forget", inv).await?;
        Ok(())
    }

    async fn cancel_request(&self, key: &SessionKey, request_id: &str) -> Result<bool> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.cancel.key(&k.session);
        inv.key(&k.cancellations).key(&k.doorbell).arg(request_id).arg(ms(self.inner.cfg.cancel_ttl));
        Ok(int(&self.run("cancel", inv).await?)? == 1)
    }

    async fn is_cancelled(&self, key: &SessionKey, request_id: &str) -> Result<bool> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.cancelled.key(&k.cancellations);
        inv.arg(request_id);
        Ok(int(&self.run("cancelled", inv).await?)? == 1)
    }

    async fn subscribe_user(&self, user: &UserKey) -> Result<Box<dyn Subscription>> {
        let channel = format!("{}:nb", self.user_base(user));
        Ok(Box::new(self.inner.subscriber.subscribe(channel, subscriber::NOTICE_BUFFER).await?))
    }

    async fn publish_user(&self, user: &UserKey, message: &str) -> Result<()> {
        let channel = format!("{}:nb", self.user_base(user));
        let publish = match self.inner.pubsub {
            PubSubKind::Classic => "PUBLISH",
            PubSubKind::Sharded => "SPUBLISH",
        };
        let _: i64 = self.query("publish", redis::cmd(publish).arg(channel).arg(format!("n:{message}"))).await?;
        Ok(())
    }

    async fn ping(&self) -> Result<()> {
        let _: String = self.query("ping", &redis::cmd("PING")).await?;
        Ok(())
    }

    async fn fleet_layouts(&self) -> Result<Vec<Option<String>>> {
        let (members, layout) = self.fleet_keys();
        let mut inv = self.inner.scripts.layouts.key(&members);
        inv.key(&layout);
        array(self.run("layouts", inv).await?)?
            .iter()
            .map(|v| if matches!(v, Value::Nil) { Ok(None) } else { string(v).map(Some) })
            .collect()
    }

    async fn declare(&self, fact: &str, replica: &str, value: &str, ttl: Duration) -> Result<Vec<String>> {
        let (live, values) = self.declare_keys(fact);
        let mut inv = self.inner.scripts.declare.key(&live);
        inv.key(&values).arg(replica).arg(if ttl.is_zero() { 0 } else { ms(ttl) }).arg(value);
        array(self.run("declare", inv).await?)?.iter().filter(|v| !matches!(v, Value::Nil)).map(string).collect()
    }

    async fn eviction_policies(&self) -> Result<Vec<String>> {
        // On a cluster INFO goes to every master, and the reply holds one text per node.
        let reply: Value = self.query("info", redis::cmd("INFO").arg("memory")).await?;
        let mut texts = Vec::new();
        collect_texts(&reply, &mut texts);
        let mut policies: Vec<String> = texts
            .iter()
            .flat_map(|t| t.lines())
            .filter_map(|l| l.trim().strip_prefix("maxmemory_policy:"))
            .map(str::to_owned)
            .collect();
        policies.sort();
        policies.dedup();
        if policies.is_empty() {
            return Err(StateError::Protocol("INFO memory has no maxmemory_policy"));
        }
        Ok(policies)
    }
}

/// Every text in a reply, however nested (a map of node → text on a cluster).
fn collect_texts(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => out.push(s.clone()),
        Value::Array(items) | Value::Set(items) => items.iter().for_each(|i| collect_texts(i, out)),
        Value::Map(pairs) => pairs.iter().for_each(|(_, i)| collect_texts(i, out)),
        _ => {}
    }
}

impl RedisStore {
    /// One `renew.lua`: 0 not renewed, 1 renewed, 2 renewed and the log holds an entry after `peek`.
    async fn renew(
        &self,
        key: &SessionKey,
        stream: u64,
        token: &LeaseToken,
        ttl: Duration,
        peek: Option<&EventId>,
    ) -> Result<i64> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.renew.key(&k.session);
        inv.key(&k.events).key(&k.leases).key(&k.index).arg(stream).arg(ms(ttl)).arg(&token.0).arg(key.id.as_str());
        if let Some(cursor) = peek {
            inv.arg(cursor.position());
        }
        int(&self.run("renew", inv).await?)
    }
}
