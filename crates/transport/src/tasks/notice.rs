//! What goes out on a principal's notice channel about a task: `notifications/tasks` to the listeners
//! ([`notify`], [`announce_end`]), the nudge to a task's runner ([`poke`]), and which notices concern a task
//! ([`concerns`]).

use super::wire::wire;
use crate::AppState;
use mcpfleet_state::{TaskId, TaskKey, TaskView};
use serde_json::{Value, json};

/// The method of the internal nudge to a task's runner (a cancellation asked, answers arrived): published on the
/// principal's notice channel, never passed to a client.
const POKE: &str = "mcpfleet/tasks/poke";

/// Publishes `notifications/tasks` (the detailed task) to the principal's `subscriptions/listen` streams, on
/// every replica. Best effort: a client that misses one polls.
pub(crate) async fn notify(app: &AppState, key: &TaskKey, v: &TaskView) {
    let msg = crate::jsonrpc::notification("notifications/tasks", wire(&key.id, v, true)).to_string();
    if let Err(e) = app.store.publish_user(&key.user, &msg).await {
        tracing::debug!(error = %e, "task notification not published");
    }
}

/// Nudges the runner of a task, wherever it runs: it re-reads its task (a cancellation, answers).
pub(crate) async fn poke(app: &AppState, key: &TaskKey) {
    let msg = crate::jsonrpc::notification(POKE, json!({ "taskId": key.id.as_str() })).to_string();
    if let Err(e) = app.store.publish_user(&key.user, &msg).await {
        tracing::debug!(error = %e, "task poke not published");
    }
}

/// Whether a notice (a JSON-RPC notification on the principal's channel) concerns task `id`.
pub(crate) fn concerns(notice: &str, id: &TaskId) -> bool {
    // Cheap test first: most notices are about other things.
    notice.contains(id.as_str())
        && serde_json::from_str::<Value>(notice).ok().is_some_and(|n| {
            matches!(n.get("method").and_then(Value::as_str), Some("notifications/tasks" | POKE))
                && n.get("params").and_then(|p| p.get("taskId")).and_then(Value::as_str) == Some(id.as_str())
        })
}

/// Counts and announces a task the store ended cancelled on a requeue (its client had asked).
pub(super) async fn announce_end(app: &AppState, key: &TaskKey) {
    if let Ok(Some(v)) = app.store.get_task(key).await
        && v.status.is_terminal()
    {
        app.tasks.metrics().ended.with_label_values(&[v.status.as_str()]).inc();
        notify(app, key, &v).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_are_matched_to_their_task() {
        let id = TaskId::random();
        let other = TaskId::random();
        let n = |method: &str, task: &TaskId| {
            crate::jsonrpc::notification(method, json!({ "taskId": task.as_str() })).to_string()
        };
        assert!(concerns(&n("notifications/tasks", &id), &id));
        assert!(concerns(&n(POKE, &id), &id));
        assert!(!concerns(&n("notifications/tasks", &other), &id));
        assert!(!concerns(&n("notifications/tools/list_changed", &id), &id));
        assert!(!concerns(&format!("not json {}", id.as_str()), &id));
    }
}
