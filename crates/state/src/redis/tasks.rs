//! Durable tasks in Redis (see `crate::tasks` for the contract).
//!
//! | key | type | what |
//! |---|---|---|
//! | `<p>{u:<user>}:tk:<id>` | hash | the record a poll reads: `st`, `g` (generation), `ct`/`ut` (ms), `ttl`, `poll`, `tool`, `tr` (trace id), `rr` (re-runnable), `own` (replica), `cx` (cancel asked), `msg`, `out` (result or error), `ni` (outstanding inputs), `i:<key>` (each outstanding input request) |
//! | `<p>{u:<user>}:tw:<id>` | hash | what a worker needs: `args`, `caps`, `who` (the principal), `a:<key>` (answers); dropped when the task ends |
//! | `<p>{u:<user>}:to` | zset | the principal's open tasks, scored by expiry (the `--max-tasks-per-user` cap counts it) |
//! | `<p>{tq:<n>}:q` | stream | shard n of the work queue, consumer group `w`; entries `u`, `t`, `g` |
//! | `<p>{tq:<n>}:l` | zset | the leases of shard n: `<user>/<id>/<generation>`, scored by expiry (ms) |
//! | `<p>{tq:<n>}:e` | hash | lease member → its waiting entry id |
//! | `<p>{tq:<n>}:bell` | channel | shard n's bell, rung by every enqueue (`e:<n>`) |
//!
//! A record and its work hash expire with the task's TTL. The queue keys are few and permanent.

use super::codec::{array, int, ms, string};
use super::{RedisStore, subscriber};
use crate::tasks::{
    AfterTake, Asked, CancelOutcome, NewTask, QueueStats, Queued, Requeue, RunCheck, TaskEnd, TaskId, TaskKey,
    TaskStatus, TaskStore, TaskView, TaskWork, UpdateOutcome,
};
use crate::types::UserKey;
use crate::{Result, StateError};
use async_trait::async_trait;
use redis::Value;
use std::time::Duration;

struct TaskKeys {
    record: String,
    work: String,
    open: String,
}

struct ShardKeys {
    stream: String,
    leases: String,
    entries: String,
    /// The shard's bell: a channel in the shard's slot, so that the enqueue script can ring it on a cluster too.
    bell: String,
}

/// A lease's member: `<user>/<task id>/<generation>` (neither part can hold a `/`).
fn member(key: &TaskKey, generation: u64) -> String {
    format!("{}/{}/{generation}", key.user.as_str(), key.id.as_str())
}

fn parse_member(m: &str) -> Option<(TaskKey, u64)> {
    let mut it = m.splitn(3, '/');
    let user = UserKey::new(it.next()?)?;
    let id = TaskId::parse(it.next()?)?;
    let generation = it.next()?.parse().ok()?;
    Some((TaskKey { user, id }, generation))
}

impl RedisStore {
    fn task_keys(&self, key: &TaskKey) -> TaskKeys {
        let base = self.user_base(&key.user);
        TaskKeys {
            record: format!("{base}:tk:{}", key.id.as_str()),
            work: format!("{base}:tw:{}", key.id.as_str()),
            open: format!("{base}:to"),
        }
    }

    fn shard_keys(&self, shard: u16) -> ShardKeys {
        let base = format!("{}{{tq:{shard}}}", self.inner.cfg.prefix);
        ShardKeys {
            stream: format!("{base}:q"),
            leases: format!("{base}:l"),
            entries: format!("{base}:e"),
            bell: format!("{base}:bell"),
        }
    }
}

impl RedisStore {
    /// The key of a task's record (read beside an admission).
    pub(super) fn task_record_key(&self, key: &TaskKey) -> String {
        self.task_keys(key).record
    }
}

/// A record's `HGETALL` reply (a map in RESP3, a flat array in RESP2), as a view.
pub(super) fn view_of(v: Value) -> Result<Option<TaskView>> {
    match v {
        Value::Map(m) => view(&m.into_iter().flat_map(|(k, v)| [k, v]).collect::<Vec<_>>()),
        Value::Array(a) => view(&a),
        Value::Nil => Ok(None),
        _ => Err(StateError::Protocol("bad task record")),
    }
}

/// A record's `HGETALL`, as a view.
fn view(flat: &[Value]) -> Result<Option<TaskView>> {
    if flat.is_empty() {
        return Ok(None);
    }
    let mut v = TaskView {
        status: TaskStatus::Queued,
        created_ms: 0,
        updated_ms: 0,
        ttl_ms: 0,
        poll_ms: 0,
        message: None,
        outcome: None,
        input_requests: Vec::new(),
        generation: 0,
        rerunnable: false,
        tool: String::new(),
        cancel_requested: false,
    };
    let mut status = None;
    let num = |s: &str| s.parse::<u64>().map_err(|_| StateError::Protocol("bad task field"));
    for pair in flat.chunks(2) {
        let [f, val] = pair else { return Err(StateError::Protocol("bad task record")) };
        let (f, val) = (string(f)?, string(val)?);
        match f.as_str() {
            "st" => status = TaskStatus::parse(&val),
            "ct" => v.created_ms = num(&val)?,
            "ut" => v.updated_ms = num(&val)?,
            "ttl" => v.ttl_ms = num(&val)?,
            "poll" => v.poll_ms = num(&val)?,
            "g" => v.generation = num(&val)?,
            "rr" => v.rerunnable = val == "1",
            "cx" => v.cancel_requested = val == "1",
            "tool" => v.tool = val,
            "msg" => v.message = Some(val),
            "out" => v.outcome = Some(val),
            other => {
                if let Some(k) = other.strip_prefix("i:") {
                    v.input_requests.push((k.to_owned(), val));
                }
            }
        }
    }
    v.status = status.ok_or(StateError::Protocol("bad task status"))?;
    v.input_requests.sort();
    Ok(Some(v))
}

/// Answer pairs (`HGETALL` fields and values), as a JSON object of the raw JSON values.
fn answers_object(pairs: &[Value]) -> Result<String> {
    let pairs = pairs
        .chunks(2)
        .map(|p| match p {
            [k, v] => Ok((string(k)?, string(v)?)),
            _ => Err(StateError::Protocol("bad answers")),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(crate::tasks::answers_json(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))))
}

#[async_trait]
impl TaskStore for RedisStore {
    async fn create_task(&self, t: &NewTask<'_>) -> Result<Option<u64>> {
        let k = self.task_keys(t.key);
        let mut inv = self.inner.tasks.create.key(&k.record);
        inv.key(&k.work).key(&k.open);
        inv.arg(t.max_open)
            .arg(ms(t.ttl))
            .arg(ms(t.poll_interval))
            .arg(t.tool)
            .arg(t.args)
            .arg(t.capabilities)
            .arg(t.principal)
            .arg(t.trace_id)
            .arg(if t.rerunnable { "1" } else { "0" })
            .arg(t.running_on.unwrap_or(""))
            .arg(t.key.id.as_str());
        // Answers gathered before the task existed, as key/value pairs (values are kept as the client sent them).
        if let Ok(serde_json::Value::Object(answers)) = serde_json::from_str::<serde_json::Value>(t.answers) {
            for (key, value) in &answers {
                inv.arg(key).arg(value.to_string());
            }
        }
        let created = match int(&self.run("task_create", inv).await?)? {
            0 => return Ok(None),
            -1 => return Err(StateError::Conflict),
            created => u64::try_from(created).map_err(|_| StateError::Protocol("bad creation time"))?,
        };
        // The handle promises a durable task: before it leaves, a replica of Redis should hold the record too.
        self.durable(&k.record).await?;
        Ok(Some(created))
    }

    async fn get_task(&self, key: &TaskKey) -> Result<Option<TaskView>> {
        let k = self.task_keys(key);
        view_of(self.query("task_get", redis::cmd("HGETALL").arg(&k.record)).await?)
    }

    async fn update_task(&self, key: &TaskKey, answers: &[(String, String)]) -> Result<Option<UpdateOutcome>> {
        let k = self.task_keys(key);
        let mut inv = self.inner.tasks.update.key(&k.record);
        inv.key(&k.work);
        for (key, value) in answers {
            inv.arg(key).arg(value);
        }
        let r = array(self.run("task_update", inv).await?)?;
        match r.as_slice() {
            [c] if int(c)? == -1 => Ok(None),
            [n, resumed] => {
                Ok(Some(UpdateOutcome { accepted: usize::try_from(int(n)?).unwrap_or(0), resumed: int(resumed)? == 1 }))
            }
            _ => Err(StateError::Protocol("bad task update reply")),
        }
    }

    async fn cancel_task(&self, key: &TaskKey) -> Result<Option<CancelOutcome>> {
        let k = self.task_keys(key);
        let mut inv = self.inner.tasks.cancel.key(&k.record);
        inv.key(&k.work).key(&k.open).arg(key.id.as_str());
        Ok(match int(&self.run("task_cancel", inv).await?)? {
            0 => Some(CancelOutcome::AlreadyEnded),
            1 => Some(CancelOutcome::Cancelled),
            2 => Some(CancelOutcome::Requested),
            _ => None,
        })
    }

    async fn start_task(&self, key: &TaskKey, generation: u64, replica: &str) -> Result<Option<TaskWork>> {
        let k = self.task_keys(key);
        let mut inv = self.inner.tasks.start.key(&k.record);
        inv.key(&k.work).arg(generation).arg(replica);
        let r = array(self.run("task_start", inv).await?)?;
        match r.as_slice() {
            [c, tool, trace, rr, args, caps, principal, answers @ ..] if int(c)? == 1 => Ok(Some(TaskWork {
                tool: string(tool)?,
                trace_id: string(trace)?,
                rerunnable: string(rr)? == "1",
                args: string(args)?,
                capabilities: string(caps)?,
                principal: string(principal)?,
                answers: answers_object(answers)?,
            })),
            _ => Ok(None),
        }
    }

    async fn ask_task(&self, key: &TaskKey, generation: u64, input: &str, request: &str) -> Result<Asked> {
        let k = self.task_keys(key);
        let mut inv = self.inner.tasks.ask.key(&k.record);
        inv.key(&k.work).arg(generation).arg(input).arg(request);
        let r = array(self.run("task_ask", inv).await?)?;
        match r.as_slice() {
            [c, answer] if int(c)? == 1 => Ok(Asked::Answer(string(answer)?)),
            [c] if int(c)? == 2 => Ok(Asked::Pending),
            _ => Ok(Asked::Stop),
        }
    }

    async fn check_task(&self, key: &TaskKey, generation: u64) -> Result<RunCheck> {
        let k = self.task_keys(key);
        let v: Vec<Option<String>> =
            self.query("task_check", redis::cmd("HMGET").arg(&k.record).arg("st").arg("g").arg("cx")).await?;
        let status = v.first().cloned().flatten().and_then(|s| TaskStatus::parse(&s));
        let same = v.get(1).cloned().flatten().and_then(|g| g.parse::<u64>().ok()) == Some(generation);
        Ok(match status {
            Some(s) if !s.is_terminal() && same => {
                if v.get(2).cloned().flatten().as_deref() == Some("1") {
                    RunCheck::CancelRequested
                } else {
                    RunCheck::Run
                }
            }
            _ => RunCheck::Gone,
        })
    }

    async fn finish_task(&self, key: &TaskKey, generation: u64, end: &TaskEnd) -> Result<Option<TaskView>> {
        let k = self.task_keys(key);
        let mut inv = self.inner.tasks.finish.key(&k.record);
        inv.key(&k.work).key(&k.open).arg(generation);
        match end {
            TaskEnd::Completed(result) => inv.arg("completed").arg(result).arg(""),
            TaskEnd::Failed { error, message } => inv.arg("failed").arg(error).arg(message),
            TaskEnd::Cancelled => inv.arg("cancelled").arg("").arg(""),
        };
        inv.arg(key.id.as_str());
        let r = array(self.run("task_finish", inv).await?)?;
        match r.split_first() {
            Some((c, rest)) if int(c)? == 1 => {
                // A terminal state never changes: a failover must not take it back (the run's lease is gone).
                self.durable(&k.record).await?;
                view(rest)
            }
            _ => Ok(None),
        }
    }

    async fn requeue_task(&self, key: &TaskKey, generation: u64) -> Result<Requeue> {
        let k = self.task_keys(key);
        let mut inv = self.inner.tasks.requeue.key(&k.record);
        inv.key(&k.work).key(&k.open).arg(generation).arg(key.id.as_str());
        let r = array(self.run("task_requeue", inv).await?)?;
        match r.as_slice() {
            [c, g] if int(c)? == 1 => Ok(Requeue::Queued(u64::try_from(int(g)?).unwrap_or(0))),
            [c] if int(c)? == 2 => Ok(Requeue::Cancelled),
            _ => Ok(Requeue::Refused),
        }
    }

    async fn lease_task(&self, shard: u16, key: &TaskKey, generation: u64, ttl: Duration) -> Result<()> {
        let s = self.shard_keys(shard);
        let mut inv = self.inner.tasks.renew.key(&s.leases);
        inv.arg(ms(ttl)).arg("add").arg(member(key, generation));
        self.run("task_lease", inv).await?;
        // The lease is how a dead runner's task is found again: it must outlive a failover.
        self.durable(&s.leases).await
    }

    async fn enqueue(&self, shard: u16, key: &TaskKey, generation: u64, check: Duration) -> Result<()> {
        let s = self.shard_keys(shard);
        let mut inv = self.inner.tasks.enqueue.key(&s.stream);
        inv.key(&s.leases).key(&s.entries).key(&s.bell);
        inv.arg(member(key, generation)).arg(ms(check)).arg(key.user.as_str()).arg(key.id.as_str()).arg(generation);
        inv.arg(shard);
        self.run("task_enqueue", inv).await?;
        // A queued task nobody can find again would sit until its TTL: the entry must outlive a failover.
        self.durable(&s.stream).await
    }

    async fn dequeue(&self, shard: u16, consumer: &str, count: usize, stale_after: Duration) -> Result<Vec<Queued>> {
        let s = self.shard_keys(shard);
        let mut inv = self.inner.tasks.dequeue.key(&s.stream);
        inv.arg(consumer).arg(count.max(1)).arg(ms(stale_after));
        let r = array(self.run("task_dequeue", inv).await?)?;
        let mut out = Vec::new();
        for e in r.chunks(4) {
            let [entry, user, id, generation] = e else { return Err(StateError::Protocol("bad dequeue reply")) };
            let entry = string(entry)?;
            match (UserKey::new(&string(user)?), TaskId::parse(&string(id)?), string(generation)?.parse::<u64>()) {
                (Some(user), Some(id), Ok(generation)) => {
                    out.push(Queued { entry, key: TaskKey { user, id }, generation });
                }
                // Not an entry of ours: drop it, so that no worker takes it again.
                _ => {
                    let mut inv = self.inner.tasks.settle.key(&s.stream);
                    inv.key(&s.leases).key(&s.entries).arg(&entry).arg("").arg("keep").arg(0);
                    self.run("task_settle", inv).await?;
                }
            }
        }
        Ok(out)
    }

    async fn settle(&self, shard: u16, entry: &Queued, then: AfterTake) -> Result<()> {
        let s = self.shard_keys(shard);
        let mut inv = self.inner.tasks.settle.key(&s.stream);
        inv.key(&s.leases).key(&s.entries).arg(&entry.entry).arg(member(&entry.key, entry.generation));
        match then {
            AfterTake::Lease(ttl) => inv.arg("lease").arg(ms(ttl)),
            AfterTake::Release => inv.arg("release").arg(0),
            AfterTake::Keep => inv.arg("keep").arg(0),
        };
        self.run("task_settle", inv).await?;
        Ok(())
    }

    async fn renew_task_leases(
        &self,
        shard: u16,
        runs: &[(TaskKey, u64)],
        ttl: Duration,
    ) -> Result<Vec<(TaskKey, u64)>> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let s = self.shard_keys(shard);
        let mut inv = self.inner.tasks.renew.key(&s.leases);
        inv.arg(ms(ttl)).arg("renew");
        for (key, generation) in runs {
            inv.arg(member(key, *generation));
        }
        let lost = array(self.run("task_renew", inv).await?)?;
        Ok(lost.iter().filter_map(|m| string(m).ok().and_then(|m| parse_member(&m))).collect())
    }

    async fn release_task_lease(&self, shard: u16, key: &TaskKey, generation: u64) -> Result<()> {
        let s = self.shard_keys(shard);
        let _: i64 = self.query("task_release", redis::cmd("ZREM").arg(&s.leases).arg(member(key, generation))).await?;
        Ok(())
    }

    async fn expired_task_leases(&self, shard: u16, grace: Duration, limit: usize) -> Result<Vec<(TaskKey, u64)>> {
        let s = self.shard_keys(shard);
        let mut inv = self.inner.tasks.expired.key(&s.stream);
        inv.key(&s.leases).key(&s.entries).arg(ms(grace)).arg(limit.max(1));
        let due = array(self.run("task_expired", inv).await?)?;
        let mut out = Vec::new();
        for m in &due {
            let m = string(m)?;
            match parse_member(&m) {
                Some(run) => out.push(run),
                None => {
                    let _: i64 = self.query("task_release", redis::cmd("ZREM").arg(&s.leases).arg(&m)).await?;
                }
            }
        }
        Ok(out)
    }

    async fn subscribe_queue(&self, shards: u16) -> Result<Box<dyn crate::Subscription>> {
        let mut bells = Vec::with_capacity(usize::from(shards));
        for shard in 0..shards.max(1) {
            bells
                .push(self.inner.subscriber.subscribe(self.shard_keys(shard).bell, subscriber::DOORBELL_BUFFER).await?);
        }
        Ok(Box::new(super::subscriber::Merged(bells)))
    }

    async fn tidy_consumers(&self, shard: u16, leaving: Option<&str>, idle: Duration) -> Result<u64> {
        let s = self.shard_keys(shard);
        let mut inv = self.inner.tasks.tidy.key(&s.stream);
        inv.arg(leaving.unwrap_or("")).arg(ms(idle));
        Ok(u64::try_from(int(&self.run("task_tidy", inv).await?)?).unwrap_or(0))
    }

    async fn queue_stats(&self, shard: u16) -> Result<QueueStats> {
        let s = self.shard_keys(shard);
        let mut inv = self.inner.tasks.stats.key(&s.stream);
        inv.key(&s.leases);
        let r = array(self.run("task_stats", inv).await?)?;
        let [len, pending, leased, oldest] = r.as_slice() else { return Err(StateError::Protocol("bad stats reply")) };
        let count = |v: &Value| int(v).map(|n| u64::try_from(n).unwrap_or(0));
        let (len, taken, leased) = (count(len)?, count(pending)?, count(leased)?);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let oldest = string(oldest)?
            .split_once('-')
            .and_then(|(ms, _)| ms.parse::<u64>().ok())
            .map(|at| now.saturating_sub(Duration::from_millis(at)));
        Ok(QueueStats { waiting: len.saturating_sub(taken), taken, oldest, leased })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_members_round_trip() {
        let key = TaskKey { user: UserKey::anonymous(), id: TaskId::random() };
        assert_eq!(parse_member(&member(&key, 7)), Some((key, 7)));
        assert_eq!(parse_member("a/b/c"), None);
    }

    #[test]
    fn answers_become_one_json_object() {
        let pairs = [Value::BulkString(b"k\"1".to_vec()), Value::BulkString(br#"{"action":"accept"}"#.to_vec())];
        let obj = answers_object(&pairs).unwrap_or_default();
        let parsed: serde_json::Value = serde_json::from_str(&obj).unwrap_or_default();
        assert_eq!(parsed["k\"1"]["action"], "accept");
    }
}
