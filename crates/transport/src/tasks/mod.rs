//! The tasks extension (`io.modelcontextprotocol/tasks`) of the 2026-07-28 generation: a `tools/call` answered
//! with a durable task handle, which any replica answers for (`tasks/get`, `tasks/update`, `tasks/cancel`) and
//! any replica may run.
//!
//! The server decides per tool ([`TaskMode`](mcpfleet_tools::TaskMode)): `Always` tools are queued at once
//! (lease, record, then the queue entry, so that a replica dying between two steps leaves something a sweeper
//! finds); `After(d)` tools run inline and become a task when still running after `d`, keeping their run where it
//! started under a lease ([`link`]). A queued task is taken by whichever replica has a free worker
//! ([`worker`]), runs through the one call pipeline as a third sink ([`run`]), and is reclaimed when its replica
//! dies: run again if its tool is safe to re-run, else ended `failed` with what to do. What these share sits
//! beside them: [`held`] a run held here and why it stops early, [`notice`] what goes out on the principal's notice
//! channel, [`wire`](mod@wire) a task as a client reads it, [`principal`] the principal as a task keeps it.
//!
//! The state lives in the store (`mcpfleet_state::TaskStore`); a replica holds only the runs it is executing.

mod held;
mod link;
mod notice;
mod principal;
mod run;
mod wire;
mod worker;

pub(crate) use link::{LinkWatch, TaskLink};
pub(crate) use principal::principal_json;
pub(crate) use wire::created_result;
pub use worker::start;

use held::{Handoff, Held};
use notice::{notify, poke};
use wire::wire;

use crate::error::TransportError;
use crate::request::{Post, admit};
use crate::{AppState, Principal, code};
use mcpfleet_state::{CancelOutcome, TaskId, TaskKey};
use mcpfleet_tools::JsonObject;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The extension's identifier, in capabilities.
pub const EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// How this replica runs tasks. Every replica of a fleet needs the same `shards`.
#[derive(Clone, Debug)]
pub struct TaskConfig {
    /// Queued tasks this replica runs at once (`--task-workers`).
    pub workers: usize,
    /// Streams of the work queue (`--task-queue-shards`).
    pub shards: u16,
    /// How long a run's claim lasts without renewal: a dead replica's tasks are reclaimed this long after it died.
    pub lease: Duration,
    /// A task's `ttlMs`: the record (and its result) is kept this long from creation.
    pub ttl: Duration,
    /// The `pollIntervalMs` suggested to clients.
    pub poll_interval: Duration,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            workers: 8,
            shards: 4,
            lease: Duration::from_secs(10),
            ttl: Duration::from_secs(3600),
            poll_interval: Duration::from_secs(2),
        }
    }
}

/// This replica's part in the tasks of the fleet: the runs it holds, and its workers' wake-up.
#[derive(Debug)]
pub struct Tasks {
    cfg: TaskConfig,
    /// The consumer name of this replica in the queue, and the owner written into the records it runs.
    replica: String,
    held: Mutex<HashMap<TaskKey, Arc<Held>>>,
    /// Rung when work is queued here or a worker frees up.
    wake: Notify,
    /// Fired on shutdown: stop taking queued work, hand re-runnable runs back.
    stop: CancellationToken,
    metrics: TaskMetrics,
    /// Whether this replica's task loops run ([`crate::start_workers`] starts them once).
    pub(crate) started: std::sync::atomic::AtomicBool,
}

impl Tasks {
    /// This process gets a random name in the queue: a restarted replica is a new consumer, and the entries its
    /// predecessor took and never started go to whoever claims them.
    #[must_use]
    pub fn new(cfg: TaskConfig, metrics: TaskMetrics) -> Self {
        let replica = crate::random_token()[..16].to_owned();
        Self {
            cfg,
            replica,
            held: Mutex::default(),
            wake: Notify::new(),
            stop: CancellationToken::new(),
            metrics,
            started: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Stops taking queued work and hands the re-runnable runs back to the queue (the drain calls it on SIGTERM);
    /// the others run on within the shutdown grace.
    pub fn stop(&self) {
        self.stop.cancel();
        for held in self.held.lock().unwrap_or_else(PoisonError::into_inner).values() {
            if held.rerunnable {
                held.hand_off(Handoff::HandedBack);
            }
        }
    }

    #[must_use]
    pub fn config(&self) -> &TaskConfig {
        &self.cfg
    }

    pub(crate) fn replica(&self) -> &str {
        &self.replica
    }

    pub(crate) fn metrics(&self) -> &TaskMetrics {
        &self.metrics
    }

    pub(crate) fn shard_of(&self, id: &TaskId) -> u16 {
        id.shard(self.cfg.shards)
    }

    pub(crate) fn hold(&self, key: &TaskKey, held: Arc<Held>) {
        // A newer run of a task whose older run lost its lease here replaces it (the older one's release no
        // longer matches): counted once.
        if self.held.lock().unwrap_or_else(PoisonError::into_inner).insert(key.clone(), held).is_none() {
            self.metrics.running.inc();
        }
    }

    pub(crate) fn release(&self, key: &TaskKey, generation: u64) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.get(key).is_some_and(|h| h.generation == generation) {
            held.remove(key);
            self.metrics.running.dec();
            drop(held);
            self.wake.notify_one();
        }
    }

    /// Whether this replica holds `generation` of `key`.
    pub(crate) fn holds(&self, key: &TaskKey, generation: u64) -> bool {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).get(key).is_some_and(|h| h.generation == generation)
    }

    /// Runs taken from the queue and still running here.
    pub(crate) fn busy_workers(&self) -> usize {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).values().filter(|h| h.worker).count()
    }

    /// Every held run, by shard: for the lease renewals.
    pub(crate) fn held_by_shard(&self) -> HashMap<u16, Vec<(TaskKey, u64)>> {
        let mut out: HashMap<u16, Vec<(TaskKey, u64)>> = HashMap::new();
        for (k, h) in self.held.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            out.entry(h.shard).or_default().push((k.clone(), h.generation));
        }
        out
    }

    pub(crate) fn lost(&self, key: &TaskKey, generation: u64) {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner).get(key).cloned();
        if let Some(h) = held.filter(|h| h.generation == generation) {
            tracing::warn!(task = ?key.id, "task lease lost: another replica took the task over");
            h.hand_off(Handoff::LeaseLost);
        }
    }
}

/// The tasks' metrics, in the `mcp_` namespace; documented in docs/METRICS.md.
#[derive(Clone, Debug)]
pub struct TaskMetrics {
    pub(crate) created: IntCounterVec,
    pub(crate) ended: IntCounterVec,
    pub(crate) running: IntGauge,
    pub(crate) reclaims: IntCounterVec,
    pub(crate) queue_depth: IntGauge,
    pub(crate) queue_taken: IntGauge,
    pub(crate) queue_oldest: prometheus::Gauge,
    pub(crate) leased: IntGauge,
}

impl TaskMetrics {
    /// Creates the metrics and registers them with `registry`, each known label set at 0.
    ///
    /// # Errors
    /// A metric of the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self {
            created: IntCounterVec::new(
                Opts::new(
                    "mcp_tasks_created_total",
                    "Tasks created on this replica, by how: queued (a tool that always runs as a task) or converted (a call still running after its tool's delay).",
                ),
                &["how"],
            )?,
            ended: IntCounterVec::new(
                Opts::new(
                    "mcp_tasks_ended_total",
                    "Tasks that reached a terminal status on this replica, by status: completed, failed or cancelled.",
                ),
                &["status"],
            )?,
            running: IntGauge::new(
                "mcp_tasks_running",
                "Task runs this replica holds now (taken from the queue, or calls that became tasks here).",
            )?,
            reclaims: IntCounterVec::new(
                Opts::new(
                    "mcp_task_reclaims_total",
                    "Tasks this replica's sweeper took over after their lease ran out, by outcome: rerun (queued again: its tool is safe to re-run), failed_replica_lost (ended failed: it may be half done), requeued (a queued task whose queue entry was lost), and handed_back (re-runnable runs this replica gave back on shutdown).",
                ),
                &["outcome"],
            )?,
            queue_depth: IntGauge::new(
                "mcp_task_queue_depth",
                "Queue entries no worker has taken yet, over every shard: the same fleet-wide value on every replica (aggregate with max, not sum).",
            )?,
            queue_taken: IntGauge::new(
                "mcp_task_queue_taken",
                "Queue entries taken by a worker that has not started them yet (the consumer group's pending entries), over every shard.",
            )?,
            queue_oldest: prometheus::Gauge::new(
                "mcp_task_queue_oldest_seconds",
                "Age of the oldest queue entry no worker has taken yet, in seconds (0 when the queue is empty); fleet-wide.",
            )?,
            leased: IntGauge::new(
                "mcp_task_leases",
                "Tasks some replica must watch (queued or running), over every shard; fleet-wide.",
            )?,
        };
        registry.register(Box::new(m.created.clone()))?;
        registry.register(Box::new(m.ended.clone()))?;
        registry.register(Box::new(m.running.clone()))?;
        registry.register(Box::new(m.reclaims.clone()))?;
        registry.register(Box::new(m.queue_depth.clone()))?;
        registry.register(Box::new(m.queue_taken.clone()))?;
        registry.register(Box::new(m.queue_oldest.clone()))?;
        registry.register(Box::new(m.leased.clone()))?;
        // Every known series from the start, at 0.
        for how in ["queued", "converted"] {
            m.created.with_label_values(&[how]);
        }
        for status in ["completed", "failed", "cancelled"] {
            m.ended.with_label_values(&[status]);
        }
        for outcome in ["rerun", "failed_replica_lost", "requeued", "handed_back"] {
            m.reclaims.with_label_values(&[outcome]);
        }
        Ok(m)
    }
}

/// Whether a request's capabilities declare the extension.
pub(crate) fn declared(capabilities: &Value) -> bool {
    capabilities.get("extensions").and_then(|e| e.get(EXTENSION)).is_some()
}

/// The task a `tasks/*` request names, if it can name one of this principal's.
fn task_key(caller: &Principal, params: &JsonObject) -> Result<Option<TaskKey>, TransportError> {
    match params.get("taskId") {
        Some(Value::String(id)) => Ok(TaskId::parse(id).map(|id| TaskKey { user: caller.user.clone(), id })),
        Some(_) => Err(TransportError::InvalidMeta("params.taskId must be a string".into())),
        None => Err(TransportError::InvalidMeta("params.taskId is required".into())),
    }
}

/// The error of a task this principal does not have: unknown, expired, malformed or another principal's, all
/// alike.
fn not_found() -> (i64, String) {
    (code::INVALID_PARAMS, "Failed to retrieve task: Task not found".to_owned())
}

impl Post<'_> {
    /// `tasks/get`, `tasks/update` and `tasks/cancel`. The extension must be declared on this request (-32021);
    /// each costs one token of the bucket and one store call (plus the nudge to the runner, for an update or a
    /// cancellation). `Ok(Err(..))` is an error of the method (HTTP 200).
    pub(crate) async fn task_method(
        &mut self,
        method: &str,
        params: &JsonObject,
        capabilities: &Value,
    ) -> Result<Result<Value, (i64, String)>, TransportError> {
        if !declared(capabilities) {
            return Err(TransportError::MissingCapability(vec![EXTENSION.to_owned()]));
        }
        let app = self.app;
        let key = task_key(self.asker.caller, params)?;
        let answers = if method == "tasks/update" {
            match params.get("inputResponses") {
                Some(Value::Object(r)) => r.iter().map(|(k, v)| (k.clone(), v.to_string())).collect::<Vec<_>>(),
                Some(_) => return Err(TransportError::InvalidMeta("params.inputResponses must be an object".into())),
                None => return Err(TransportError::InvalidMeta("params.inputResponses is required".into())),
            }
        } else {
            Vec::new()
        };
        // A poll reads its task in the admission's round trip.
        let read = if method == "tasks/get" { key.as_ref() } else { None };
        let granted = admit(app, self.info, &mcpfleet_limits::Request { task: read, ..self.asker.request() }).await?;
        let Some(key) = key else { return Ok(Err(not_found())) };
        let ack = json!({ "resultType": "complete" });
        match method {
            "tasks/get" => {
                let view = match granted.task {
                    Some(v) => v,
                    None => app.store.get_task(&key).await?,
                };
                Ok(match view {
                    Some(v) => {
                        let mut t = wire(&key.id, &v, true);
                        t["resultType"] = json!("complete");
                        Ok(t)
                    }
                    None => Err(not_found()),
                })
            }
            "tasks/update" => match app.store.update_task(&key, &answers).await? {
                None => Ok(Err(not_found())),
                Some(u) => {
                    if u.accepted > 0 {
                        poke(app, &key).await;
                    }
                    if u.resumed
                        && let Ok(Some(v)) = app.store.get_task(&key).await
                    {
                        notify(app, &key, &v).await;
                    }
                    Ok(Ok(ack))
                }
            },
            _ => match app.store.cancel_task(&key).await? {
                None => Ok(Err(not_found())),
                Some(CancelOutcome::AlreadyEnded) => Ok(Ok(ack)),
                Some(CancelOutcome::Requested) => {
                    poke(app, &key).await;
                    Ok(Ok(ack))
                }
                Some(CancelOutcome::Cancelled) => {
                    app.tasks.metrics().ended.with_label_values(&["cancelled"]).inc();
                    if let Ok(Some(v)) = app.store.get_task(&key).await {
                        notify(app, &key, &v).await;
                    }
                    Ok(Ok(ack))
                }
            },
        }
    }
}

/// Queues a call of an `Always` tool as a task: its lease first, then its record (at the principal's cap), then
/// its queue entry; then the handle goes out. Returns the `CreateTaskResult`.
pub(crate) async fn create_queued(
    app: &AppState,
    caller: &Principal,
    tool: &str,
    args: &JsonObject,
    capabilities: &Value,
    answers: &JsonObject,
    trace_id: &str,
) -> Result<Value, TransportError> {
    let tasks = &app.tasks;
    let cfg = tasks.config();
    let key = TaskKey { user: caller.user.clone(), id: TaskId::random() };
    let shard = tasks.shard_of(&key.id);
    app.store.lease_task(shard, &key, 1, cfg.lease).await?;
    let (args, caps, answers) =
        (Value::Object(args.clone()).to_string(), capabilities.to_string(), Value::Object(answers.clone()).to_string());
    let principal = principal_json(caller);
    let max_open = app.policy.plan_of(caller).limits.max_tasks;
    let new = mcpfleet_state::NewTask {
        key: &key,
        tool,
        args: &args,
        capabilities: &caps,
        principal: &principal,
        answers: &answers,
        trace_id,
        ttl: cfg.ttl,
        poll_interval: cfg.poll_interval,
        rerunnable: app.catalog.tool_task(tool).rerunnable,
        running_on: None,
        max_open,
    };
    let created = match app.store.create_task(&new).await {
        Ok(Some(c)) => c,
        Ok(None) => {
            let _ = app.store.release_task_lease(shard, &key, 1).await;
            return Err(TransportError::Limit(app.limits.tasks_refused(max_open)));
        }
        Err(e) => {
            let _ = app.store.release_task_lease(shard, &key, 1).await;
            return Err(e.into());
        }
    };
    // If this fails, the sweeper finds the lease and queues the task itself.
    if let Err(e) = app.store.enqueue(shard, &key, 1, cfg.lease).await {
        tracing::warn!(error = %e, "task queued without its entry: the sweeper adds it");
    }
    tasks.metrics().created.with_label_values(&["queued"]).inc();
    tasks.wake.notify_one();
    Ok(created_result(app, &key.id, created, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extension_is_declared_per_request() {
        assert!(declared(&json!({ "extensions": { EXTENSION: {} } })));
        assert!(!declared(&json!({ "extensions": {} })));
        assert!(!declared(&json!({ "tasks": {} })), "the v1 slot is not the extension");
    }
}
