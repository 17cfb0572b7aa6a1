//! One run's hold on its task, whatever runs it (a worker that took it from the queue, or a call that became a
//! task where it was running): it asks the client for input through the task, watches for a cancellation or a
//! hand-off, and writes the run's end into the record, then tells the principal's listeners.

use super::held::{Handoff, Held};
use super::notice::{announce_end, concerns, notify};
use crate::call::{CallEnd, Finished};
use crate::{AppState, code};
use mcpfleet_state::{Asked, Requeue, RunCheck, Subscription, TaskEnd, TaskKey};
use mcpfleet_tools::ToolError;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// How often a run re-reads its task when no notice arrives (a notice missed across a reconnect is caught here).
const RECHECK: Duration = Duration::from_secs(1);
/// How long a run keeps trying to write its end when the store fails; then its lease runs out and a sweeper
/// decides (a re-run, or `failed`).
const FINISH_RETRY_FOR: Duration = Duration::from_secs(10);
/// Largest result a task keeps; a larger one ends the task `failed` (never truncated).
pub const MAX_RESULT_BYTES: usize = 1 << 20;

/// A run's hold on its task. Dropping it forgets the run here (its lease is released by [`TaskLink::end`]).
#[derive(Debug)]
pub(crate) struct TaskLink {
    app: AppState,
    pub(crate) key: TaskKey,
    pub(crate) generation: u64,
    held: Arc<Held>,
}

/// A run's watch: the principal's notices, subscribed on first use.
#[derive(Default)]
pub(crate) struct LinkWatch {
    sub: Option<Box<dyn Subscription>>,
}

impl std::fmt::Debug for LinkWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkWatch").finish_non_exhaustive()
    }
}

impl LinkWatch {
    /// Waits for a notice about `link`'s task, or the recheck interval.
    async fn next(&mut self, link: &TaskLink) {
        if self.sub.is_none() {
            match link.app.store.subscribe_user(&link.key.user).await {
                Ok(s) => self.sub = Some(s),
                Err(e) => tracing::debug!(error = %e, "task watch: subscription failed; polling"),
            }
        }
        let tick = tokio::time::sleep(RECHECK);
        let Some(sub) = self.sub.as_mut() else { return tick.await };
        tokio::pin!(tick);
        loop {
            tokio::select! {
                () = &mut tick => return,
                ring = sub.recv() => match ring {
                    Some(mcpfleet_state::Ring::Notice(n)) if concerns(&n, &link.key.id) => return,
                    Some(_) => {}
                    None => {
                        self.sub = None;
                        return tick.await;
                    }
                },
            }
        }
    }
}

impl TaskLink {
    /// Holds `generation` of `key` on this replica (its lease is already set).
    pub(crate) fn hold(app: &AppState, key: TaskKey, generation: u64, rerunnable: bool, worker: bool) -> Self {
        let held = Arc::new(Held {
            shard: app.tasks.shard_of(&key.id),
            generation,
            rerunnable,
            worker,
            interrupt: tokio_util::sync::CancellationToken::new(),
            reason: std::sync::Mutex::new(None),
        });
        app.tasks.hold(&key, held.clone());
        if app.tasks.stop.is_cancelled() && rerunnable {
            held.hand_off(Handoff::HandedBack);
        }
        Self { app: app.clone(), key, generation, held }
    }

    /// The client's answer to input request `input` (a `method` request), asked through the task: the task is
    /// `input_required` until a `tasks/update` (on any replica) brings it. Stops with [`ToolError::Cancelled`] if
    /// the run ends meanwhile (cancelled, handed off).
    pub(crate) async fn ask(
        &self,
        input: &str,
        method: &str,
        params: Value,
        capabilities: &Value,
    ) -> Result<Value, ToolError> {
        let Some(kind) = crate::input::kind(method) else {
            return Err(ToolError::ClientUnsupported("requests"));
        };
        if capabilities.get(kind).is_none() {
            return Err(ToolError::ClientUnsupported(kind));
        }
        let request = json!({ "method": method, "params": params }).to_string();
        let store = &self.app.store;
        let mut watch = LinkWatch::default();
        let mut announced = false;
        loop {
            if self.held.interrupt.is_cancelled() {
                return Err(ToolError::Cancelled);
            }
            match store.ask_task(&self.key, self.generation, input, &request).await {
                Ok(Asked::Answer(a)) => {
                    let answer = serde_json::from_str(&a).unwrap_or(Value::Null);
                    return crate::input::answer_value(input, &answer);
                }
                Ok(Asked::Stop) => return Err(ToolError::Cancelled),
                Ok(Asked::Pending) => {
                    if !announced {
                        announced = true;
                        if let Ok(Some(v)) = store.get_task(&self.key).await {
                            notify(&self.app, &self.key, &v).await;
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "task input: store failed; retrying"),
            }
            tokio::select! {
                () = watch.next(self) => {}
                () = self.held.interrupt.cancelled() => return Err(ToolError::Cancelled),
            }
        }
    }

    /// Waits for what stops the run early: a cancellation asked on any replica, a hand-off, or the task gone.
    /// Cancel-safe.
    pub(crate) async fn watch(&self, w: &mut LinkWatch) -> CallEnd {
        loop {
            if let Some(end) = self.interrupted() {
                return end;
            }
            match self.app.store.check_task(&self.key, self.generation).await {
                Ok(RunCheck::Run) => {}
                Ok(RunCheck::CancelRequested) => return CallEnd::Cancelled,
                Ok(RunCheck::Gone) => return CallEnd::HandedOver,
                Err(e) => tracing::debug!(error = %e, "task watch: store failed"),
            }
            tokio::select! {
                () = w.next(self) => {}
                () = self.held.interrupt.cancelled() => {}
            }
        }
    }

    fn interrupted(&self) -> Option<CallEnd> {
        self.held.interrupt.is_cancelled().then_some(CallEnd::HandedOver)
    }

    /// Writes the run's end into the record (a result it may keep, or `failed` with the JSON-RPC error; the store
    /// makes it `cancelled` if the client asked first), then tells the listeners and releases the lease. A store that fails is retried for a while; then the lease
    /// decides.
    pub(crate) async fn end(&self, finished: Finished) {
        let end = match finished {
            Finished::Answer(Ok(v)) => {
                let text = v.to_string();
                if text.len() > MAX_RESULT_BYTES {
                    let message = format!(
                        "The result is {} bytes, more than a task may keep ({MAX_RESULT_BYTES} bytes); it was not \
                         kept. Ask for less (a narrower query, fewer items).",
                        text.len()
                    );
                    failed(code::INTERNAL_ERROR, &message)
                } else {
                    TaskEnd::Completed(text)
                }
            }
            Finished::Answer(Err((c, m))) => failed(code::stateless(c), &m),
            Finished::Refused(e) => {
                let err = e.rpc_error(true);
                let m = err.get("message").and_then(Value::as_str).unwrap_or("refused").to_owned();
                TaskEnd::Failed { error: err.to_string(), message: m }
            }
        };
        self.write_end(&end).await;
    }

    /// The tool was stopped: a cancellation ends the task `cancelled`; a re-runnable run handed back on shutdown
    /// goes back to the queue at once; a lost lease leaves the task to its new run.
    pub(crate) async fn stopped(&self, end: CallEnd) {
        match (end, self.held.reason()) {
            (_, Some(Handoff::LeaseLost)) => self.forget(),
            (_, Some(Handoff::HandedBack)) => self.hand_back().await,
            (CallEnd::Cancelled, None) => self.write_end(&TaskEnd::Cancelled).await,
            _ => self.forget(),
        }
    }

    async fn hand_back(&self) {
        let app = &self.app;
        let shard = self.held.shard;
        match app.store.requeue_task(&self.key, self.generation).await {
            Ok(Requeue::Queued(next)) => {
                match app.store.enqueue(shard, &self.key, next, app.tasks.config().lease).await {
                    Ok(()) => {
                        let _ = app.store.release_task_lease(shard, &self.key, self.generation).await;
                    }
                    // The old lease stays: when it runs out, a sweeper queues the new run.
                    Err(e) => tracing::warn!(error = %e, "handed-back task not queued; the sweeper will"),
                }
                app.tasks.metrics().reclaims.with_label_values(&["handed_back"]).inc();
                tracing::info!(task = ?self.key.id, "shutting down: task handed back to the queue");
            }
            Ok(Requeue::Cancelled) => {
                // Its client had asked to cancel it: it ended cancelled instead.
                announce_end(app, &self.key).await;
                let _ = app.store.release_task_lease(shard, &self.key, self.generation).await;
            }
            Ok(Requeue::Refused) => {
                let _ = app.store.release_task_lease(shard, &self.key, self.generation).await;
            }
            Err(e) => tracing::warn!(error = %e, "task not handed back; its lease will run out"),
        }
        self.forget();
    }

    async fn write_end(&self, end: &TaskEnd) {
        let app = &self.app;
        let mut retry = crate::backoff::Backoff::for_up_to(FINISH_RETRY_FOR);
        let view = loop {
            match app.store.finish_task(&self.key, self.generation, end).await {
                Ok(v) => break v,
                Err(e) if retry.wait("the task's end", &e).await => {}
                Err(e) => {
                    tracing::error!(error = %e, task = ?self.key.id, "task end not written; its lease will run out");
                    self.forget();
                    return;
                }
            }
        };
        if let Some(v) = view {
            app.tasks.metrics().ended.with_label_values(&[v.status.as_str()]).inc();
            notify(app, &self.key, &v).await;
        }
        let _ = app.store.release_task_lease(self.held.shard, &self.key, self.generation).await;
        self.forget();
    }

    fn forget(&self) {
        self.app.tasks.release(&self.key, self.generation);
    }
}

impl Drop for TaskLink {
    fn drop(&mut self) {
        self.forget();
    }
}

fn failed(code: i64, message: &str) -> TaskEnd {
    TaskEnd::Failed { error: json!({ "code": code, "message": message }).to_string(), message: message.to_owned() }
}
