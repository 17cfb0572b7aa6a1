//! The limit counters ([`LimitStore`]): an admission (bucket, session, slot and window, and a task record read
//! beside it) in one `admit.lua` round trip, and the slot and window calls around it.

use super::batch::{one, split};
use super::codec::{cat, int, millis, ms, opt_u64, string};
use super::lanes::{Entry, Shared};
use super::{RedisStore, keys_at, tasks};
use crate::limits::{Admission, Admitted, BucketReading, Refusal, SessionOp, SlotSet, WindowReading};
use crate::types::{SessionInfo, UserKey};
use crate::{LimitStore, Result, StateError};
use async_trait::async_trait;
use redis::Value;
use std::time::Duration;

#[async_trait]
impl LimitStore for RedisStore {
    async fn admit(&self, a: &Admission<'_>) -> Result<Admitted> {
        let base = self.user_base(a.user);
        let set = match (a.slot, a.release) {
            (Some(s), Some((r, _))) if s.set != r => {
                return Err(StateError::Protocol("releases must be of the admitted slot's set"));
            }
            (Some(s), _) => s.set,
            (None, Some((r, _))) => r,
            (None, None) => SlotSet::Calls,
        };
        let bucket_key = cat(&[&base, ":", a.bucket.map_or("tb", |b| b.name.as_str())]);
        let slot_key = cat(&[&base, ":", set.suffix()]);
        let window_key = cat(&[&base, ":q:", a.window.map_or("-", |w| w.name.as_str())]);
        let mut keys = vec![bucket_key, slot_key, window_key, cat(&[&base, ":rv"])];
        // The index only when the sessions are counted: with no cap, nothing reads it (issue 32: an idle session's
        // bytes). Each key costs Redis about 1k instructions.
        let counted = match a.session {
            SessionOp::None => false,
            SessionOp::Create { max_sessions, .. } => max_sessions > 0 || a.count_sessions,
            SessionOp::Touch(_) => a.count_sessions,
        };
        if counted {
            keys.push(cat(&[&base, ":ss"]));
        }
        // The argument order of admit.lua: what the batch's admissions share, then each one's own.
        let (capacity, per_second) = match a.bucket {
            Some(b) => (b.capacity.to_string(), b.per_second.to_string()),
            None => (String::new(), String::new()),
        };
        let (slot_cap, slot_ttl, token) = match a.slot {
            Some(s) => (s.cap.to_string(), ms(s.ttl).to_string(), s.token.clone()),
            None => (String::new(), String::new(), String::new()),
        };
        let (window_limit, window_ms) = match a.window {
            Some(w) => (w.limit.to_string(), ms(w.window).to_string()),
            None => (String::new(), String::new()),
        };
        let revocation = a.token_id.map_or_else(|| "-".to_owned(), |j| cat(&["j:", j]));
        let args = [capacity, per_second, slot_cap, slot_ttl, window_limit, window_ms, revocation];
        let shared = Shared::new(keys, args, a.proof.map(|(_, ttl)| ms(ttl)));
        let (sid, session_keys) = match a.session {
            SessionOp::None => (String::new(), None),
            SessionOp::Touch(id) | SessionOp::Create { id, .. } => {
                let k = keys_at(&base, id.as_str());
                (id.as_str().to_owned(), Some([k.session, k.events, k.leases]))
            }
        };
        // A session this replica has seen: its fixed fields are here, and the touch reads only what may change.
        let known = match (a.session, &session_keys) {
            (SessionOp::Touch(_), Some([key, ..])) => self.inner.known.get(key),
            _ => None,
        };
        let (op, create) = match a.session {
            SessionOp::None => ("", None),
            SessionOp::Touch(_) => (if known.is_some() { "tap" } else { "touch" }, None),
            SessionOp::Create { session: s, max_sessions, .. } => (
                "create",
                Some((max_sessions, ms(s.idle_ttl), s.protocol_version.clone(), s.client_capabilities.clone())),
            ),
        };
        let session_key = session_keys.as_ref().map(|[k, ..]| k.clone());
        let releases = a.release.map_or_else(Vec::new, |(_, t)| t.to_vec());
        let proof = a.proof.map(|(id, _)| cat(&[&base, ":dp:", id]));
        let entry = Entry { op, sid, token, keys: session_keys, proof, create, releases };
        // A task poll pipelines the record's read with its admission, and a create goes alone (it is rare, and its
        // index key is its own): every other admission rides in its lane with the principal's others (those with a
        // DPoP proof in a lane of their own, each proof its own key, decided one after the other).
        let (reply, task) = match a.read_task {
            Some(key) => {
                let inv = self.admissions(&shared, &[&entry]);
                let (reply, record) = self.run_with_read(&inv, &self.task_record_key(key)).await?;
                (one(split(reply, 1)?)?, Some(tasks::view_of(record)?))
            }
            None if op == "create" => (self.send_one(&shared, &entry).await?, None),
            None => (self.admit_in_lane(shared, entry).await?, None),
        };
        // Nine values, or six without the three that are empty then (admit.lua).
        let empty = Value::BulkString(Vec::new());
        let (code, tokens, wait, pv, caps, lvl, slots, wused, wreset) = match reply.as_slice() {
            [code, tokens, wait, lvl, slots, wused] => (code, tokens, wait, &empty, &empty, lvl, slots, wused, &empty),
            [code, tokens, wait, pv, caps, lvl, slots, wused, wreset] => {
                (code, tokens, wait, pv, caps, lvl, slots, wused, wreset)
            }
            _ => return Err(StateError::Protocol("bad admit reply")),
        };
        let code = int(code)?;
        if code == 7 || code == 8 {
            return Ok(Admitted {
                refused: Some(if code == 7 { Refusal::Revoked } else { Refusal::Replayed }),
                bucket: None,
                session: None,
                slots_used: None,
                window: None,
                task: None,
            });
        }
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

    async fn lease_window(
        &self,
        tenant: &str,
        name: &str,
        want: u64,
        limit: u64,
        window: Duration,
    ) -> Result<(u64, Duration)> {
        use sha2::{Digest as _, Sha256};
        // The tenant's name comes from a token: hashed, it can hold no `{`, `}` or `:`.
        let tag = mcpfleet_core::hex(&Sha256::digest(tenant.as_bytes())[..12]);
        let key = cat(&[&self.inner.cfg.prefix, "{t:", &tag, "}:tq:", name]);
        let mut inv = self.inner.scripts.lease.key(&key);
        inv.arg(want).arg(limit).arg(ms(window));
        let reply = self.run_pooled("lease", inv).await?;
        let Value::Array(v) = reply else { return Err(StateError::Protocol("bad lease reply")) };
        match v.as_slice() {
            [granted, ttl] => Ok((
                u64::try_from(int(granted)?).unwrap_or(0),
                Duration::from_millis(u64::try_from(int(ttl)?).unwrap_or(0)),
            )),
            _ => Err(StateError::Protocol("bad lease reply")),
        }
    }

    async fn heartbeat(&self, replica: &str, ttl: Duration) -> Result<u64> {
        // One key for the fleet, in a slot of its own: a write per replica every few seconds.
        let (members, layout) = self.fleet_keys();
        let mut inv = self.inner.scripts.members.key(&members);
        // A zero TTL (leaving) must reach the script as 0, not as `ms`'s smallest lease.
        inv.key(&layout).arg(replica).arg(if ttl.is_zero() { 0 } else { ms(ttl) });
        inv.arg(crate::layout::Layout::current().encode());
        let n = int(&self.run("members", inv).await?)?;
        u64::try_from(n).map_err(|_| StateError::Protocol("bad member count"))
    }
}
