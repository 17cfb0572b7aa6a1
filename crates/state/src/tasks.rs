//! Durable tasks (the 2026-07-28 `io.modelcontextprotocol/tasks` extension): the task record, under its
//! principal's hash tag, and the shared work queue that hands task work to whichever replica is free.
//!
//! A record moves `queued → working ⇄ input_required → completed | failed | cancelled`; the three last are
//! terminal, and the store (a script, not the caller) refuses to change a terminal record. Every run of a task has
//! a generation: a reclaimed task runs again under the next one, and anything the earlier run writes afterwards is
//! refused.
//!
//! The queue is `shards` Redis Streams, each with its own hash tag (`{tq:<n>}`), read through one consumer group.
//! Beside each stream, a lease set holds every task of the shard that some replica must watch: a queued task
//! (until its entry is taken) or a running one (renewed by its runner). A lease that runs out is taken by a
//! sweeper, which reclaims the task: it runs again (if its tool is safe to re-run) or fails with an explanation.
//! A queued task whose entry is still in its stream is not taken: it is waiting its turn.

use crate::types::UserKey;
use std::fmt;
use std::time::Duration;

/// A task id: 24 base64url characters, 144 random bits. Anything else names no task, without a store call.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TaskId(String);

impl TaskId {
    /// Length of the ids this server issues.
    pub const LEN: usize = 24;

    /// A new random id.
    #[must_use]
    pub fn random() -> Self {
        use base64::Engine as _;
        let bytes: [u8; 18] = rand::random();
        Self(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
    }

    /// The id the client sent, if it can name a task.
    #[must_use]
    pub fn parse(raw: &str) -> Option<Self> {
        (raw.len() == Self::LEN && raw.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
            .then(|| Self(raw.to_owned()))
    }

    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The queue shard of this task, among `shards`.
    #[must_use]
    pub fn shard(&self, shards: u16) -> u16 {
        let h = self.0.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
        u16::try_from(h % u32::from(shards.max(1))).unwrap_or(0)
    }
}

impl fmt::Debug for TaskId {
    // A task id is a capability of its owner: never print it whole.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TaskId({}…)", &self.0[..6.min(self.0.len())])
    }
}

/// Answers (input key, the client's answer as JSON) as one JSON object, in the order given; the values are kept
/// as the client sent them.
pub(crate) fn answers_json<'a>(answers: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::from("{");
    for (i, (k, v)) in answers.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::Value::from(k).to_string());
        out.push(':');
        out.push_str(v);
    }
    out.push('}');
    out
}

/// A task as seen by one principal: the owner is part of the key, so another principal's key names nothing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TaskKey {
    pub user: UserKey,
    pub id: TaskId,
}

/// Where a task stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskStatus {
    /// Waiting in the queue for a worker (the wire says `working`).
    Queued,
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl TaskStatus {
    /// The stored name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Working => "working",
            Self::InputRequired => "input_required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// The name on the wire (a queued task is `working`).
    #[must_use]
    pub fn wire(self) -> &'static str {
        match self {
            Self::Queued => "working",
            other => other.as_str(),
        }
    }

    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => Self::Queued,
            "working" => Self::Working,
            "input_required" => Self::InputRequired,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            _ => return None,
        })
    }

    #[must_use]
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
}

/// A task to create.
#[derive(Clone, Debug)]
pub struct NewTask<'a> {
    pub key: &'a TaskKey,
    pub tool: &'a str,
    /// The call's arguments (a JSON object), for whichever worker runs it.
    pub args: &'a str,
    /// The capabilities the creating request declared (JSON), which its input requests need.
    pub capabilities: &'a str,
    /// The principal that created it (JSON), for whichever replica runs it.
    pub principal: &'a str,
    /// Answers gathered before the task existed (JSON object by input key), if any.
    pub answers: &'a str,
    pub trace_id: &'a str,
    /// From creation; the record expires with it.
    pub ttl: Duration,
    pub poll_interval: Duration,
    /// The tool is safe to run again from the start when its replica dies.
    pub rerunnable: bool,
    /// `None`: queued for a worker. `Some(replica)`: already running there (a call that became a task).
    pub running_on: Option<&'a str>,
    /// Most open (non-terminal) tasks the principal may have; 0: no cap.
    pub max_open: u64,
}

/// What the store says of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskView {
    pub status: TaskStatus,
    /// Milliseconds since the Unix epoch, from the store's clock.
    pub created_ms: u64,
    pub updated_ms: u64,
    pub ttl_ms: u64,
    pub poll_ms: u64,
    pub message: Option<String>,
    /// The tool's result (completed) or the JSON-RPC error object (failed), as JSON.
    pub outcome: Option<String>,
    /// Outstanding input requests, by key, each `{method, params}` as JSON, in key order.
    pub input_requests: Vec<(String, String)>,
    /// The current run's generation.
    pub generation: u64,
    pub rerunnable: bool,
    pub tool: String,
    /// The client asked to cancel it (a running task: its runner is told).
    pub cancel_requested: bool,
}

/// What a worker needs to run a task it took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskWork {
    pub tool: String,
    pub args: String,
    pub capabilities: String,
    pub principal: String,
    pub trace_id: String,
    pub rerunnable: bool,
    /// Answers known so far (JSON object by input key).
    pub answers: String,
}

/// How a run ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskEnd {
    /// The tool's result (JSON), an `isError` one included.
    Completed(String),
    /// A JSON-RPC error object (JSON) and a status message.
    Failed {
        error: String,
        message: String,
    },
    Cancelled,
}

/// What `ask` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Asked {
    /// The client's answer (JSON).
    Answer(String),
    /// Outstanding: the task is `input_required` until `update` brings it.
    Pending,
    /// The run is over for this worker: cancellation requested, the task ended, or a newer run took it.
    Stop,
}

/// What a runner learns when it checks its task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunCheck {
    Run,
    CancelRequested,
    /// Ended, expired, or taken by a newer run.
    Gone,
}

/// What `tasks/cancel` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// It was already terminal: nothing changes.
    AlreadyEnded,
    /// It was still queued: it is `cancelled` now.
    Cancelled,
    /// It is running: its runner is asked to stop.
    Requested,
}

/// What `tasks/update` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpdateOutcome {
    /// Answers taken (for outstanding keys); the rest were ignored.
    pub accepted: usize,
    /// The last outstanding request was answered: the task is `working` again.
    pub resumed: bool,
}

/// What `requeue_task` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeue {
    /// Back in line, for this generation's run.
    Queued(u64),
    /// Its client had asked to cancel it: it ended `cancelled` instead.
    Cancelled,
    /// It had ended, or a newer run holds it: nothing changed.
    Refused,
}

/// One queue entry handed to a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queued {
    pub entry: String,
    pub key: TaskKey,
    pub generation: u64,
}

/// What becomes of a taken entry's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterTake {
    /// The worker started the task: the lease is its, for this long.
    Lease(Duration),
    /// The entry was stale and the task has ended: drop its lease.
    Release,
    /// The entry was stale but the task lives on (a newer run is queued): leave its lease alone.
    Keep,
}

/// One shard of the queue, as the metrics see it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Entries no worker has taken yet.
    pub waiting: u64,
    /// Entries taken by a worker that has not started them yet.
    pub taken: u64,
    /// Age of the oldest waiting entry.
    pub oldest: Option<Duration>,
    /// Tasks whose lease is held (queued or running).
    pub leased: u64,
}

/// The task records and the work queue.
#[async_trait::async_trait]
pub trait TaskStore: Send + Sync + fmt::Debug {
    /// Creates the record, unless the principal already has `max_open` open tasks (`None`). Returns the creation
    /// time (ms since the epoch, the store's clock).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn create_task(&self, task: &NewTask<'_>) -> crate::Result<Option<u64>>;

    /// The task, if it exists for this principal.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn get_task(&self, key: &TaskKey) -> crate::Result<Option<TaskView>>;

    /// Takes the answers (`(key, JSON)`) whose keys are outstanding; ignores the others. `None`: no such task.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn update_task(&self, key: &TaskKey, answers: &[(String, String)]) -> crate::Result<Option<UpdateOutcome>>;

    /// Cancels a queued task, or asks the runner of a running one to stop. `None`: no such task.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn cancel_task(&self, key: &TaskKey) -> crate::Result<Option<CancelOutcome>>;

    /// Starts a queued task for generation `generation` on `replica`; `None` if it is not queued at that
    /// generation (ended, cancelled, or a newer run).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn start_task(&self, key: &TaskKey, generation: u64, replica: &str) -> crate::Result<Option<TaskWork>>;

    /// The answer to input request `input` (`{method, params}` JSON), or records it as outstanding.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn ask_task(&self, key: &TaskKey, generation: u64, input: &str, request: &str) -> crate::Result<Asked>;

    /// Whether the run may go on.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn check_task(&self, key: &TaskKey, generation: u64) -> crate::Result<RunCheck>;

    /// Ends the run: the record becomes terminal, unless it already is or a newer run holds it (`None`). A run
    /// whose client asked to cancel it ends `cancelled`, whatever `end` says (the cancellation came first).
    /// Returns the final view.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn finish_task(&self, key: &TaskKey, generation: u64, end: &TaskEnd) -> crate::Result<Option<TaskView>>;

    /// Puts a task back in line for a new run: the next generation, `queued`; or, if its client asked to cancel it,
    /// ends it `cancelled`. Changes nothing if it ended or a newer run holds it.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn requeue_task(&self, key: &TaskKey, generation: u64) -> crate::Result<Requeue>;

    /// Sets the lease of a run that is about to exist (before its record is written, so that a replica dying in
    /// between leaves a lease the sweeper finds), or that runs where it was created.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn lease_task(&self, shard: u16, key: &TaskKey, generation: u64, ttl: Duration) -> crate::Result<()>;

    /// Adds the entry for a queued task to its shard's stream, with its lease (for the sweeper, `check` from now).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn enqueue(&self, shard: u16, key: &TaskKey, generation: u64, check: Duration) -> crate::Result<()>;

    /// Takes up to `count` entries for `consumer`: new ones, then entries another consumer took more than
    /// `stale_after` ago and never settled (it died).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn dequeue(
        &self,
        shard: u16,
        consumer: &str,
        count: usize,
        stale_after: Duration,
    ) -> crate::Result<Vec<Queued>>;

    /// Removes a taken entry from the queue and sets its task's lease.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn settle(&self, shard: u16, entry: &Queued, then: AfterTake) -> crate::Result<()>;

    /// Renews the leases of the runs this replica holds; returns the ones it lost (reclaimed by a sweeper).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn renew_task_leases(
        &self,
        shard: u16,
        runs: &[(TaskKey, u64)],
        ttl: Duration,
    ) -> crate::Result<Vec<(TaskKey, u64)>>;

    /// Drops a run's lease (it ended).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn release_task_lease(&self, shard: u16, key: &TaskKey, generation: u64) -> crate::Result<()>;

    /// Leases the sweeper must look at: expired, and not a queued task whose entry still waits in the stream.
    /// Each is held for `grace` by the caller (so that one sweeper handles it) and must be released, or re-leased
    /// by [`TaskStore::enqueue`], once handled.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn expired_task_leases(
        &self,
        shard: u16,
        grace: Duration,
        limit: usize,
    ) -> crate::Result<Vec<(TaskKey, u64)>>;

    /// Subscribes to the bells of shards `0..shards`: every [`TaskStore::enqueue`], on any replica, rings
    /// [`Ring::Event`](crate::Ring) with its shard, so that idle workers need not poll. At most once: a worker
    /// still looks at the queue now and then.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn subscribe_queue(&self, shards: u16) -> crate::Result<Box<dyn crate::Subscription>>;

    /// Removes the queue's consumers that hold no entry: `leaving` (this replica, shutting down) and any idle
    /// longer than `idle` (replicas long gone). Returns how many.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn tidy_consumers(&self, shard: u16, leaving: Option<&str>, idle: Duration) -> crate::Result<u64>;

    /// The shard's queue, for the metrics.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn queue_stats(&self, shard: u16) -> crate::Result<QueueStats>;
}
