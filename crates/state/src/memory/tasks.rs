//! Durable tasks in memory (see `crate::tasks`): the same records, queue and leases as Redis, in maps. [`Tasks`]
//! holds them and does what each [`TaskStore`](crate::TaskStore) call asks; the
//! [`MemoryStore`](super::MemoryStore) runs every call on it under its task lock. Each shard's "stream" is an
//! ordered map of waiting entries beside a map of entries taken and not yet settled (Redis' pending entries list),
//! and its lease set is a map from run to expiry.
//!
//! Epoch milliseconds (`created_ms`, `updated_ms`, entry ids) come from [`epoch_ms`]; every expiry is an
//! [`Instant`], like the rest of the memory store.

use crate::tasks::{
    AfterTake, Asked, CancelOutcome, NewTask, QueueStats, Queued, Requeue, RunCheck, TaskEnd, TaskKey, TaskStatus,
    TaskView, TaskWork, UpdateOutcome,
};
use crate::{Result, Ring, StateError};
use mcpfleet_core::time::epoch_ms;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

/// Expired records are dropped on access, and all of them every this many calls.
const SWEEP_EVERY: usize = 1024;

/// The position of a queue entry: its id `<ms>-<seq>`, as numbers so that it orders like a stream id.
type Pos = (u64, u64);

/// One run of a task: the record's key and generation (a lease set's member).
type Run = (TaskKey, u64);

/// The task records and every shard of the work queue.
#[derive(Debug, Default)]
pub(super) struct Tasks {
    records: HashMap<TaskKey, Task>,
    shards: HashMap<u16, Shard>,
    /// The last entry id handed out, for strictly increasing ids across every shard.
    last_entry: Pos,
    /// Calls since the last sweep of expired records.
    since_sweep: usize,
    /// The queue's bell, once someone listens: rung by every enqueue.
    bell: Option<broadcast::Sender<Ring>>,
}

#[derive(Debug)]
struct Task {
    tool: String,
    args: String,
    capabilities: String,
    principal: String,
    trace_id: String,
    rerunnable: bool,
    status: TaskStatus,
    created_ms: u64,
    updated_ms: u64,
    ttl_ms: u64,
    poll_ms: u64,
    /// From creation: the record is gone after this.
    expires: Instant,
    generation: u64,
    /// The runner was asked to stop.
    cancel_requested: bool,
    message: Option<String>,
    outcome: Option<String>,
    /// Outstanding input requests: input key → `{method, params}` JSON.
    requests: BTreeMap<String, String>,
    /// Answers so far: input key → JSON. They outlive a requeue.
    answers: BTreeMap<String, String>,
}

/// One shard of the queue.
#[derive(Debug, Default)]
struct Shard {
    /// Entries no consumer has taken yet, oldest first.
    waiting: BTreeMap<Pos, Entry>,
    /// Entries taken and not settled, with the time they were (last) taken.
    taken: BTreeMap<Pos, (Entry, Instant)>,
    /// Runs some replica must watch.
    leases: HashMap<Run, Lease>,
}

#[derive(Clone, Debug)]
struct Entry {
    key: TaskKey,
    generation: u64,
    /// When it was added, for the age of the oldest waiting entry.
    added: Instant,
}

#[derive(Debug)]
struct Lease {
    expires: Instant,
    /// The run's queue entry, from `enqueue` until it is settled.
    entry: Option<Pos>,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `now + d`, or a time no check outlives if that overflows the clock.
fn after(now: Instant, d: Duration) -> Instant {
    now.checked_add(d).or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400))).unwrap_or(now)
}

/// The answers of a new task: a JSON object by input key, each value written again as compact JSON (as Redis stores
/// them). Anything that is not a JSON object (an empty string included) brings no answers.
fn parse_answers(raw: &str) -> BTreeMap<String, String> {
    match serde_json::from_str::<serde_json::Value>(raw) {
        Ok(serde_json::Value::Object(m)) => m.into_iter().map(|(k, v)| (k, v.to_string())).collect(),
        _ => BTreeMap::new(),
    }
}

fn entry_id((ms, seq): Pos) -> String {
    format!("{ms}-{seq}")
}

fn parse_entry_id(id: &str) -> Option<Pos> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

impl Task {
    fn view(&self) -> TaskView {
        TaskView {
            status: self.status,
            created_ms: self.created_ms,
            updated_ms: self.updated_ms,
            ttl_ms: self.ttl_ms,
            poll_ms: self.poll_ms,
            message: self.message.clone(),
            outcome: self.outcome.clone(),
            input_requests: self.requests.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            generation: self.generation,
            rerunnable: self.rerunnable,
            tool: self.tool.clone(),
            cancel_requested: self.cancel_requested,
        }
    }

    /// Whether it counts against its principal's cap.
    fn is_open(&self, now: Instant) -> bool {
        self.expires > now && !self.status.is_terminal()
    }

    fn touch(&mut self) {
        self.updated_ms = epoch_ms();
    }
}

impl Tasks {
    /// Counts a call, and drops every expired record once every [`SWEEP_EVERY`] calls.
    pub(super) fn tick(&mut self) {
        self.since_sweep += 1;
        if self.since_sweep >= SWEEP_EVERY {
            self.since_sweep = 0;
            let now = Instant::now();
            self.records.retain(|_, t| t.expires > now);
            self.shards.retain(|_, s| !(s.waiting.is_empty() && s.taken.is_empty() && s.leases.is_empty()));
        }
    }

    /// The record of `key`, unless it expired (an expired one is dropped).
    fn live(&mut self, key: &TaskKey) -> Option<&mut Task> {
        let now = Instant::now();
        if self.records.get(key).is_some_and(|t| t.expires <= now) {
            self.records.remove(key);
        }
        self.records.get_mut(key)
    }

    /// The record of `key` while run `generation` may write to it: live, not terminal, and that generation.
    fn run(&mut self, key: &TaskKey, generation: u64) -> Option<&mut Task> {
        self.live(key).filter(|t| t.generation == generation && !t.status.is_terminal())
    }

    fn shard(&mut self, shard: u16) -> &mut Shard {
        self.shards.entry(shard).or_default()
    }

    fn next_entry(&mut self) -> Pos {
        let now = epoch_ms();
        let (ms, seq) = self.last_entry;
        self.last_entry = if now > ms { (now, 0) } else { (ms, seq + 1) };
        self.last_entry
    }
}

impl Shard {
    /// Whether the entry is still in line: waiting, or taken and not settled.
    fn holds(&self, pos: Pos) -> bool {
        self.waiting.contains_key(&pos) || self.taken.contains_key(&pos)
    }
}

/// The [`TaskStore`](crate::TaskStore) calls, each under the task lock (after [`Tasks::tick`]).
impl Tasks {
    pub(super) fn create_task(&mut self, task: &NewTask<'_>) -> Result<Option<u64>> {
        let now = Instant::now();
        if task.max_open > 0 {
            let open = self.records.iter().filter(|(k, t)| k.user == task.key.user && t.is_open(now)).count();
            if u64::try_from(open).unwrap_or(u64::MAX) >= task.max_open {
                return Ok(None);
            }
        }
        if self.live(task.key).is_some() {
            return Err(StateError::Conflict);
        }
        let created_ms = epoch_ms();
        let record = Task {
            tool: task.tool.to_owned(),
            args: task.args.to_owned(),
            capabilities: task.capabilities.to_owned(),
            principal: task.principal.to_owned(),
            trace_id: task.trace_id.to_owned(),
            rerunnable: task.rerunnable,
            status: if task.running_on.is_some() { TaskStatus::Working } else { TaskStatus::Queued },
            created_ms,
            updated_ms: created_ms,
            ttl_ms: millis(task.ttl),
            poll_ms: millis(task.poll_interval),
            expires: after(now, task.ttl),
            generation: 1,
            cancel_requested: false,
            message: None,
            outcome: None,
            requests: BTreeMap::new(),
            answers: parse_answers(task.answers),
        };
        self.records.insert(task.key.clone(), record);
        Ok(Some(created_ms))
    }

    pub(super) fn get_task(&mut self, key: &TaskKey) -> Result<Option<TaskView>> {
        Ok(self.live(key).map(|t| t.view()))
    }

    pub(super) fn update_task(&mut self, key: &TaskKey, answers: &[(String, String)]) -> Result<Option<UpdateOutcome>> {
        let Some(t) = self.live(key) else { return Ok(None) };
        let mut out = UpdateOutcome { accepted: 0, resumed: false };
        if t.status.is_terminal() {
            return Ok(Some(out));
        }
        for (k, v) in answers {
            if t.requests.remove(k).is_some() {
                t.answers.insert(k.clone(), v.clone());
                out.accepted += 1;
            }
        }
        if out.accepted > 0 {
            t.touch();
            if t.requests.is_empty() && t.status == TaskStatus::InputRequired {
                t.status = TaskStatus::Working;
                out.resumed = true;
            }
        }
        Ok(Some(out))
    }

    pub(super) fn cancel_task(&mut self, key: &TaskKey) -> Result<Option<CancelOutcome>> {
        let Some(t) = self.live(key) else { return Ok(None) };
        Ok(Some(match t.status {
            s if s.is_terminal() => CancelOutcome::AlreadyEnded,
            TaskStatus::Queued => {
                t.status = TaskStatus::Cancelled;
                t.answers.clear();
                t.touch();
                CancelOutcome::Cancelled
            }
            _ => {
                t.cancel_requested = true;
                CancelOutcome::Requested
            }
        }))
    }

    pub(super) fn start_task(&mut self, key: &TaskKey, generation: u64) -> Result<Option<TaskWork>> {
        let Some(t) = self.run(key, generation).filter(|t| t.status == TaskStatus::Queued) else { return Ok(None) };
        t.status = TaskStatus::Working;
        t.touch();
        Ok(Some(TaskWork {
            tool: t.tool.clone(),
            args: t.args.clone(),
            capabilities: t.capabilities.clone(),
            principal: t.principal.clone(),
            trace_id: t.trace_id.clone(),
            rerunnable: t.rerunnable,
            answers: crate::tasks::answers_json(t.answers.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        }))
    }

    pub(super) fn ask_task(&mut self, key: &TaskKey, generation: u64, input: &str, request: &str) -> Result<Asked> {
        let Some(t) = self.run(key, generation).filter(|t| !t.cancel_requested) else { return Ok(Asked::Stop) };
        if let Some(answer) = t.answers.get(input) {
            return Ok(Asked::Answer(answer.clone()));
        }
        if !t.requests.contains_key(input) || t.status != TaskStatus::InputRequired {
            t.requests.entry(input.to_owned()).or_insert_with(|| request.to_owned());
            t.status = TaskStatus::InputRequired;
            t.touch();
        }
        Ok(Asked::Pending)
    }

    pub(super) fn check_task(&mut self, key: &TaskKey, generation: u64) -> Result<RunCheck> {
        Ok(match self.run(key, generation) {
            None => RunCheck::Gone,
            Some(t) if t.cancel_requested => RunCheck::CancelRequested,
            Some(_) => RunCheck::Run,
        })
    }

    pub(super) fn finish_task(&mut self, key: &TaskKey, generation: u64, end: &TaskEnd) -> Result<Option<TaskView>> {
        let Some(t) = self.run(key, generation) else { return Ok(None) };
        // An empty outcome or message is none, as in Redis.
        let some = |s: &String| (!s.is_empty()).then(|| s.clone());
        // The client asked to cancel it before this end: it is cancelled.
        let end = if t.cancel_requested { &TaskEnd::Cancelled } else { end };
        match end {
            TaskEnd::Completed(result) => {
                t.status = TaskStatus::Completed;
                t.outcome = some(result);
            }
            TaskEnd::Failed { error, message } => {
                t.status = TaskStatus::Failed;
                t.outcome = some(error);
                t.message = some(message);
            }
            TaskEnd::Cancelled => t.status = TaskStatus::Cancelled,
        }
        // No run will read the answers again.
        t.requests.clear();
        t.answers.clear();
        t.touch();
        Ok(Some(t.view()))
    }

    pub(super) fn requeue_task(&mut self, key: &TaskKey, generation: u64) -> Result<Requeue> {
        let Some(t) = self.run(key, generation) else { return Ok(Requeue::Refused) };
        t.requests.clear();
        t.touch();
        if t.cancel_requested {
            // Its client asked to stop it: it is not run again.
            t.status = TaskStatus::Cancelled;
            t.answers.clear();
            return Ok(Requeue::Cancelled);
        }
        t.generation += 1;
        t.status = TaskStatus::Queued;
        Ok(Requeue::Queued(t.generation))
    }

    pub(super) fn enqueue(&mut self, shard: u16, key: &TaskKey, generation: u64, check: Duration) -> Result<()> {
        let pos = self.next_entry();
        let now = Instant::now();
        let s = self.shard(shard);
        s.waiting.insert(pos, Entry { key: key.clone(), generation, added: now });
        s.leases.insert((key.clone(), generation), Lease { expires: after(now, check), entry: Some(pos) });
        if let Some(bell) = &self.bell {
            let _ = bell.send(Ring::Event(u64::from(shard)));
        }
        Ok(())
    }

    pub(super) fn dequeue(&mut self, shard: u16, count: usize, stale_after: Duration) -> Result<Vec<Queued>> {
        let count = count.max(1);
        let now = Instant::now();
        let s = self.shard(shard);
        let mut out = Vec::new();
        while out.len() < count {
            let Some((pos, e)) = s.waiting.pop_first() else { break };
            out.push(Queued { entry: entry_id(pos), key: e.key.clone(), generation: e.generation });
            s.taken.insert(pos, (e, now));
        }
        // Entries taken by a consumer that never settled them (it died) go to this one, oldest first.
        for (pos, (e, at)) in &mut s.taken {
            if out.len() >= count {
                break;
            }
            if now.saturating_duration_since(*at) > stale_after {
                *at = now;
                out.push(Queued { entry: entry_id(*pos), key: e.key.clone(), generation: e.generation });
            }
        }
        Ok(out)
    }

    pub(super) fn settle(&mut self, shard: u16, entry: &Queued, then: AfterTake) -> Result<()> {
        let s = self.shard(shard);
        let run = (entry.key.clone(), entry.generation);
        if let Some(pos) = parse_entry_id(&entry.entry) {
            s.waiting.remove(&pos);
            s.taken.remove(&pos);
            if let Some(lease) = s.leases.get_mut(&run).filter(|l| l.entry == Some(pos)) {
                lease.entry = None;
            }
        }
        match then {
            AfterTake::Lease(ttl) => {
                let expires = after(Instant::now(), ttl);
                s.leases.entry(run).and_modify(|l| l.expires = expires).or_insert(Lease { expires, entry: None });
            }
            AfterTake::Release => {
                s.leases.remove(&run);
            }
            AfterTake::Keep => {}
        }
        Ok(())
    }

    pub(super) fn renew_task_leases(&mut self, shard: u16, runs: &[Run], ttl: Duration) -> Result<Vec<Run>> {
        let expires = after(Instant::now(), ttl);
        let s = self.shard(shard);
        let mut lost = Vec::new();
        for (key, generation) in runs {
            match s.leases.get_mut(&(key.clone(), *generation)) {
                Some(l) => l.expires = expires,
                None => lost.push((key.clone(), *generation)),
            }
        }
        Ok(lost)
    }

    pub(super) fn lease_task(&mut self, shard: u16, key: &TaskKey, generation: u64, ttl: Duration) -> Result<()> {
        let expires = after(Instant::now(), ttl);
        // Like a `ZADD`: an existing lease keeps its queue entry.
        self.shard(shard)
            .leases
            .entry((key.clone(), generation))
            .and_modify(|l| l.expires = expires)
            .or_insert(Lease { expires, entry: None });
        Ok(())
    }

    pub(super) fn release_task_lease(&mut self, shard: u16, key: &TaskKey, generation: u64) -> Result<()> {
        self.shard(shard).leases.remove(&(key.clone(), generation));
        Ok(())
    }

    pub(super) fn expired_task_leases(&mut self, shard: u16, grace: Duration, limit: usize) -> Result<Vec<Run>> {
        let now = Instant::now();
        let s = self.shard(shard);
        let limit = limit.max(1);
        let mut expired: Vec<(Instant, Run)> =
            s.leases.iter().filter(|(_, l)| l.expires <= now).map(|(run, l)| (l.expires, run.clone())).collect();
        expired.sort_by_key(|(at, _)| *at);
        // Like Redis, look at a few more than `limit` (some may be waiting their turn), oldest first.
        expired.truncate(limit.saturating_mul(4));
        let mut out = Vec::new();
        for (_, run) in expired {
            let Some(l) = s.leases.get(&run) else { continue };
            let waits = l.entry.is_some_and(|pos| s.holds(pos));
            if let Some(l) = s.leases.get_mut(&run) {
                l.expires = after(now, grace);
                if !waits {
                    l.entry = None;
                }
            }
            if !waits {
                out.push(run);
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// A receiver of the queue's bell, which the first one sets up.
    pub(super) fn subscribe_queue(&mut self) -> broadcast::Receiver<Ring> {
        self.bell.get_or_insert_with(|| broadcast::channel(256).0).subscribe()
    }

    pub(super) fn queue_stats(&self, shard: u16) -> Result<QueueStats> {
        let Some(s) = self.shards.get(&shard) else { return Ok(QueueStats::default()) };
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        Ok(QueueStats {
            waiting: count(s.waiting.len()),
            taken: count(s.taken.len()),
            oldest: s.waiting.first_key_value().map(|(_, e)| Instant::now().saturating_duration_since(e.added)),
            leased: count(s.leases.len()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_answers, parse_entry_id};
    use crate::tasks::answers_json;

    fn answers_object(a: &std::collections::BTreeMap<String, String>) -> String {
        answers_json(a.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    #[test]
    fn answers_keep_their_json_and_come_back_as_one_object() {
        let parsed = parse_answers(r#"{"b": {"action": "accept"}, "a": 1}"#);
        assert_eq!(parsed.get("b").map(String::as_str), Some(r#"{"action":"accept"}"#));
        assert_eq!(answers_object(&parsed), r#"{"a":1,"b":{"action":"accept"}}"#);
        assert!(parse_answers("").is_empty());
        assert!(parse_answers("[1]").is_empty());
        assert_eq!(answers_object(&parse_answers("{}")), "{}");
    }

    #[test]
    fn entry_ids_round_trip() {
        assert_eq!(parse_entry_id("17-3"), Some((17, 3)));
        assert_eq!(parse_entry_id("17"), None);
        assert_eq!(parse_entry_id("x-3"), None);
    }
}
