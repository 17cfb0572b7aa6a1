//! The limit counters ([`LimitStore`]): an admission (bucket, session, slot and window, and a task record read
//! beside it) in one `admit.lua` round trip, and the slot and window calls around it.

use super::codec::{cat, int, millis, ms, opt_u64, status, string};
use super::{RedisStore, keys_at, tasks};
use crate::limits::{Admission, Admitted, BucketReading, Refusal, SessionOp, SlotSet, WindowReading};
use crate::types::{SessionInfo, UserKey};
use crate::{LimitStore, Result, StateError};
use async_trait::async_trait;
use std::time::Duration;

#[async_trait]
impl LimitStore for RedisStore {
    async fn admit(&self, a: &Admission<'_>) -> Result<Admitted> {
        let base = self.user_base(a.user);
        let sid = match a.session {
            SessionOp::None => "-",
            SessionOp::Touch(id) | SessionOp::Create { id, .. } => id.as_str(),
        };
        let bucket_key = cat(&[&base, ":", a.bucket.map_or("tb", |b| b.name.as_str())]);
        let set = match (a.slot, a.release) {
            (Some(s), Some((r, _))) if s.set != r => {
                return Err(StateError::Protocol("releases must be of the admitted slot's set"));
            }
            (Some(s), _) => s.set,
            (None, Some((r, _))) => r,
            (None, None) => SlotSet::Calls,
        };
        let slot_key = cat(&[&base, ":", set.suffix()]);
        let window_key = cat(&[&base, ":q:", a.window.map_or("-", |w| w.name.as_str())]);
        let mut inv = self.inner.scripts.admit.key(&bucket_key);
        inv.key(&slot_key).key(&window_key);
        // The session's keys only when there is a session: each key costs Redis about 1k instructions.
        let session_key = match a.session {
            SessionOp::None => None,
            SessionOp::Touch(_) | SessionOp::Create { .. } => {
                let k = keys_at(&base, sid);
                inv.key(&k.session).key(&k.events).key(&k.leases);
                // The index only when the sessions are counted: with no cap, nothing reads it (issue 32: an idle
                // session's bytes).
                let counted = match a.session {
                    SessionOp::Create { max_sessions, .. } => max_sessions > 0 || a.count_sessions,
                    _ => a.count_sessions,
                };
                if counted {
                    inv.key(&k.index);
                }
                Some(k.session)
            }
        };
        // A session this replica has seen: its fixed fields are here, and the touch reads only what may change.
        let known = match (a.session, &session_key) {
            (SessionOp::Touch(_), Some(key)) => self.inner.known.get(key),
            _ => None,
        };
        // The argument order of admit.lua: what every request may carry first, create's five only on a create.
        match a.bucket {
            Some(b) => inv.arg(b.capacity).arg(b.per_second),
            None => inv.arg("").arg(""),
        };
        match a.slot {
            Some(s) => inv.arg(s.cap).arg(&s.token).arg(ms(s.ttl)),
            None => inv.arg("").arg("").arg(0),
        };
        match a.window {
            Some(w) => inv.arg(w.limit).arg(ms(w.window)),
            None => inv.arg("").arg(0),
        };
        match a.session {
            SessionOp::None => inv.arg("").arg(sid),
            SessionOp::Touch(_) => inv.arg(if known.is_some() { "tap" } else { "touch" }).arg(sid),
            SessionOp::Create { session: s, max_sessions, .. } => inv
                .arg("create")
                .arg(sid)
                .arg(max_sessions)
                .arg(ms(s.idle_ttl))
                .arg(&s.protocol_version)
                .arg(&s.client_capabilities),
        };
        for token in a.release.map_or(&[][..], |(_, t)| t) {
            inv.arg(token);
        }
        let (reply, task) = match a.read_task {
            None => (self.run("admit", inv).await?, None),
            Some(key) => {
                let (reply, record) = self.run_with_read(&inv, &self.task_record_key(key)).await?;
                (reply, Some(tasks::view_of(record)?))
            }
        };
        let (code, rest) = status(reply)?;
        let [tokens, wait, pv, caps, lvl, slots, wused, wreset] = rest.as_slice() else {
            return Err(StateError::Protocol("bad admit reply"));
        };
        let refused = match code {
            0 => None,
            1 => Some(Refusal::Bucket),
            2 => Some(Refusal::SessionNotFound),
            3 => Some(Refusal::SessionConflict),
            4 => Some(Refusal::Sessions { open: opt_u64(slots)?.unwrap_or(0) }),
            5 => Some(Refusal::Slots { used: opt_u64(slots)?.unwrap_or(0) }),
            6 => Some(Refusal::Window),
            _ => return Err(StateError::Protocol("bad admit code")),
        };
        let bucket = match a.bucket {
            Some(_) => {
                // In millionths of a token (admit.lua keeps an integer, formatted without a float conversion).
                let t: f64 = string(tokens)?.parse().map_err(|_| StateError::Protocol("bad token count"))?;
                let t = t / 1e6;
                Some(BucketReading { allowed: refused != Some(Refusal::Bucket), tokens: t, wait: millis(wait)? })
            }
            None => None,
        };
        let touched = matches!(a.session, SessionOp::Touch(_)) && matches!(code, 0 | 5 | 6);
        let session = if touched {
            let lvl = string(lvl)?;
            let (protocol_version, client_capabilities) = match known {
                Some(fixed) => fixed.as_ref().clone(),
                None => {
                    let (pv, caps) = (string(pv)?, string(caps)?);
                    if let Some(key) = &session_key {
                        self.inner.known.put(key, &pv, &caps);
                    }
                    (pv, caps)
                }
            };
            Some(SessionInfo { protocol_version, client_capabilities, log_level: (!lvl.is_empty()).then_some(lvl) })
        } else {
            None
        };
        if let (SessionOp::Create { session: s, .. }, 0, Some(key)) = (a.session, code, &session_key) {
            self.inner.known.put(key, &s.protocol_version, &s.client_capabilities);
        }
        let window = match opt_u64(wused)? {
            Some(used) => Some(WindowReading { used, reset: (code == 6).then(|| millis(wreset)).transpose()? }),
            None => None,
        };
        let slots_used = if matches!(code, 4) { None } else { opt_u64(slots)? };
        Ok(Admitted { refused, bucket, session, slots_used, window, task })
    }

    async fn renew_slot(&self, user: &UserKey, set: SlotSet, token: &str, ttl: Duration) -> Result<bool> {
        let key = format!("{}:{}", self.user_base(user), set.suffix());
        let mut inv = self.inner.scripts.slot.key(&key);
        inv.arg("renew").arg(ms(ttl)).arg(token);
        Ok(int(&self.run("slot", inv).await?)? == 1)
    }

    async fn release_slots(&self, user: &UserKey, set: SlotSet, tokens: &[String]) -> Result<()> {
        let key = format!("{}:{}", self.user_base(user), set.suffix());
        let mut inv = self.inner.scripts.slot.key(&key);
        inv.arg("release").arg(0);
        for t in tokens {
            inv.arg(t);
        }
        self.run("slot", inv).await?;
        Ok(())
    }

    async fn refund_window(&self, user: &UserKey, name: &str) -> Result<()> {
        let key = format!("{}:q:{name}", self.user_base(user));
        self.run("refund", self.inner.scripts.refund.key(&key)).await?;
        Ok(())
    }

    async fn heartbeat(&self, replica: &str, ttl: Duration) -> Result<u64> {
        // One key for the fleet, in a slot of its own: a write per replica every few seconds.
        let key = cat(&[&self.inner.cfg.prefix, "{fleet}:members"]);
        let mut inv = self.inner.scripts.members.key(&key);
        // A zero TTL (leaving) must reach the script as 0, not as `ms`'s smallest lease.
        inv.arg(replica).arg(if ttl.is_zero() { 0 } else { ms(ttl) });
        let n = int(&self.run("members", inv).await?)?;
        u64::try_from(n).map_err(|_| StateError::Protocol("bad member count"))
    }
}
