//! A task as a client reads it: its fields on the wire ([`wire`]: a `tasks/get` answer, the body of a
//! `notifications/tasks`) and the `CreateTaskResult` that answers the call that created it ([`created_result`]).

use crate::{AppState, code};
use mcpfleet_state::{TaskId, TaskView};
use mcpfleet_tools::JsonObject;
use serde_json::{Value, json};
use std::time::Duration;

/// The task's fields on the wire (a `CreateTaskResult` without `resultType`, or the body of a notification):
/// with `detailed`, what its status adds (`inputRequests`, `result` or `error`).
pub(crate) fn wire(id: &TaskId, v: &TaskView, detailed: bool) -> Value {
    let mut t = json!({
        "taskId": id.as_str(),
        "status": v.status.wire(),
        "createdAt": mcpfleet_core::time::rfc3339_millis(v.created_ms),
        "lastUpdatedAt": mcpfleet_core::time::rfc3339_millis(v.updated_ms),
        "ttlMs": v.ttl_ms,
        "pollIntervalMs": v.poll_ms.max(1),
    });
    if let Some(m) = &v.message {
        t["statusMessage"] = json!(m);
    }
    if !detailed {
        return t;
    }
    let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap_or(Value::Null);
    match v.status {
        mcpfleet_state::TaskStatus::InputRequired => {
            let requests: JsonObject = v.input_requests.iter().map(|(k, r)| (k.clone(), parse(r))).collect();
            t["inputRequests"] = Value::Object(requests);
        }
        mcpfleet_state::TaskStatus::Completed => {
            t["result"] = v.outcome.as_deref().map_or_else(|| json!({ "content": [] }), parse);
        }
        mcpfleet_state::TaskStatus::Failed => {
            t["error"] = v
                .outcome
                .as_deref()
                .map_or_else(|| json!({ "code": code::INTERNAL_ERROR, "message": "the task failed" }), parse);
        }
        _ => {}
    }
    t
}

/// The `CreateTaskResult` of a task created at `created_ms`.
pub(crate) fn created_result(app: &AppState, id: &TaskId, created_ms: u64, working: bool) -> Value {
    let cfg = app.tasks.config();
    let v = TaskView {
        status: if working { mcpfleet_state::TaskStatus::Working } else { mcpfleet_state::TaskStatus::Queued },
        created_ms,
        updated_ms: created_ms,
        ttl_ms: ms(cfg.ttl),
        poll_ms: ms(cfg.poll_interval),
        message: None,
        outcome: None,
        input_requests: Vec::new(),
        generation: 1,
        rerunnable: false,
        tool: String::new(),
        cancel_requested: false,
    };
    let mut r = wire(id, &v, false);
    r["resultType"] = json!("task");
    r
}

pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcpfleet_state::TaskStatus;

    fn view(status: TaskStatus, outcome: Option<&str>, requests: &[(&str, &str)]) -> TaskView {
        TaskView {
            status,
            created_ms: 1_796_083_200_000,
            updated_ms: 1_796_083_201_500,
            ttl_ms: 3_600_000,
            poll_ms: 1000,
            message: None,
            outcome: outcome.map(str::to_owned),
            input_requests: requests.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            generation: 1,
            rerunnable: true,
            tool: "t".to_owned(),
            cancel_requested: false,
        }
    }

    #[test]
    fn the_wire_carries_what_each_status_adds_and_nothing_else() {
        let id = TaskId::random();
        let base = wire(&id, &view(TaskStatus::Queued, None, &[]), true);
        assert_eq!(base["status"], "working", "a queued task is working on the wire");
        assert_eq!(base["createdAt"], "2026-12-01T00:00:00.000Z");
        assert_eq!(base["lastUpdatedAt"], "2026-12-01T00:00:01.500Z");
        assert_eq!((base["ttlMs"].clone(), base["pollIntervalMs"].clone()), (json!(3_600_000), json!(1000)));
        for k in ["result", "error", "inputRequests", "requestState", "ttl", "pollInterval", "resultType"] {
            assert!(base.get(k).is_none(), "{k}: {base}");
        }
        let asked = view(TaskStatus::InputRequired, None, &[("a", r#"{"method":"elicitation/create","params":{}}"#)]);
        let t = wire(&id, &asked, true);
        assert_eq!(t["inputRequests"]["a"]["method"], "elicitation/create");
        assert!(wire(&id, &asked, false).get("inputRequests").is_none(), "a handle is never detailed");
        let done = wire(&id, &view(TaskStatus::Completed, Some(r#"{"content":[],"isError":true}"#), &[]), true);
        assert_eq!((done["result"]["isError"].clone(), done.get("error")), (json!(true), None));
        let failed = wire(&id, &view(TaskStatus::Failed, Some(r#"{"code":-32603,"message":"m"}"#), &[]), true);
        assert_eq!((failed["error"]["code"].clone(), failed.get("result")), (json!(-32603), None));
    }
}
