//! `subscriptions/listen`: a long-lived SSE stream of the notifications a client opted into (list changes,
//! resource updates, its tasks), from the principal's notice channel, which every replica feeds; each is tagged
//! with the subscription's id.

use super::discover::capabilities;
use super::reply::{complete, send_bounded};
use crate::error::TransportError;
use crate::request::{Post, Result, admit};
use crate::sse::{self, Frame};
use axum::response::Response;
use mcpfleet_limits as limits;
use mcpfleet_state::{Ring, SlotSet};
use mcpfleet_tools::JsonObject;
use serde_json::{Value, json};

const SUBSCRIPTION_KEY: &str = "io.modelcontextprotocol/subscriptionId";
/// Most resource URIs one `subscriptions/listen` may name.
const MAX_SUBSCRIPTIONS: usize = 256;
/// Longest resource URI a subscription may name, in bytes.
const MAX_URI_BYTES: usize = 2048;

impl Post<'_> {
    /// `subscriptions/listen`: a long-lived SSE stream of the notifications the client opted into, from the
    /// principal's notice channel (fed by every replica), each tagged with the subscription's id.
    pub(super) async fn listen(&mut self, id: &Value, params: &JsonObject, client: &Value) -> Result<Response> {
        let app = self.app;
        let filter = Filter::parse(params, &capabilities(app))?;
        if filter.asked_tasks && !crate::tasks::declared(client) {
            return Err(TransportError::MissingCapability(vec![crate::tasks::EXTENSION.to_owned()]));
        }
        let req = limits::Request { slot: Some(SlotSet::Streams), ..self.asker.request() };
        let granted = admit(app, self.info, &req).await?;
        let slot = granted.slot.map(|l| app.limits.hold(l));
        // Subscribed before the acknowledgment goes out: nothing published after it is missed.
        let mut sub = app.store.subscribe_user(&self.asker.caller.user).await?;
        let (tx, rx) = sse::channel();
        let mut ack = json!({ "notifications": filter.acknowledged() });
        ack["_meta"] = json!({ SUBSCRIPTION_KEY: id });
        let ack = crate::jsonrpc::notification("notifications/subscriptions/acknowledged", ack);
        tx.try_send(Frame::Unsequenced { data: ack.to_string() });
        let (id, shutdown) = (id.clone(), app.shutdown.clone());
        let end = complete(app, json!({ "_meta": { SUBSCRIPTION_KEY: id } }), false);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tx.closed() => return,
                    () = shutdown.cancelled() => {
                        // A graceful end: the listen request's own response, then the stream closes.
                        let done = crate::jsonrpc::result(&id, end);
                        send_bounded(&tx, Frame::Unsequenced { data: done.to_string() }).await;
                        return;
                    }
                    ring = sub.recv() => match ring {
                        Some(Ring::Notice(msg)) => {
                            if let Some(n) = filter.pass(&msg, &id) {
                                // A client that stopped reading loses notifications, never the replica's memory.
                                tx.try_send(Frame::Unsequenced { data: n });
                            }
                        }
                        Some(_) => {}
                        None => return,
                    },
                }
            }
        });
        let held = sse::Held { slot, feeder_handles_shutdown: true, ..sse::Held::default() };
        Ok(sse::response(app, rx, "subscription", held, &self.asker.caller.user))
    }
}

/// What a `subscriptions/listen` asked for, cut to what this server honours.
struct Filter {
    tools: bool,
    prompts: bool,
    resources: bool,
    uris: Vec<String>,
    /// Task ids whose `notifications/tasks` the stream carries (tasks extension). Any well-formed id is taken:
    /// another principal's task never notifies this principal's channel, so the acknowledgment tells nothing.
    tasks: Vec<String>,
    /// The request asked for task notifications (well-formed ids or not): it needs the extension.
    asked_tasks: bool,
}

impl Filter {
    fn parse(params: &JsonObject, caps: &Value) -> Result<Self> {
        let bad = |m: &str| TransportError::InvalidMeta(m.to_owned());
        let n = match params.get("notifications") {
            Some(Value::Object(n)) => n,
            None => return Err(bad("params.notifications is required")),
            Some(_) => return Err(bad("params.notifications must be an object")),
        };
        let flag = |k: &str, cap: &str| -> Result<bool> {
            let asked = match n.get(k) {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(TransportError::InvalidMeta(format!("params.notifications.{k} must be a boolean")));
                }
            };
            Ok(asked && caps.get(cap).and_then(|c| c.get("listChanged")).and_then(Value::as_bool) == Some(true))
        };
        let uris = match n.get("resourceSubscriptions") {
            None => Vec::new(),
            Some(Value::Array(a)) if a.len() <= MAX_SUBSCRIPTIONS => a
                .iter()
                .map(|u| u.as_str().filter(|u| !u.is_empty() && u.len() <= MAX_URI_BYTES).map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("params.notifications.resourceSubscriptions must hold URIs of 1 to 2048 bytes"))?,
            Some(_) => {
                return Err(bad("params.notifications.resourceSubscriptions must be an array of at most 256 URIs"));
            }
        };
        let asked_tasks = n.get("taskIds").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
        let tasks = match n.get("taskIds") {
            None => Vec::new(),
            Some(Value::Array(a)) if a.len() <= MAX_SUBSCRIPTIONS => a
                .iter()
                .map(|t| t.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("params.notifications.taskIds must hold strings"))?
                .into_iter()
                .filter(|t| mcpfleet_state::TaskId::parse(t).is_some())
                .collect(),
            Some(_) => return Err(bad("params.notifications.taskIds must be an array of at most 256 task ids")),
        };
        let subscribe = caps.get("resources").is_some();
        Ok(Self {
            tools: flag("toolsListChanged", "tools")?,
            prompts: flag("promptsListChanged", "prompts")?,
            resources: flag("resourcesListChanged", "resources")?,
            uris: if subscribe { uris } else { Vec::new() },
            tasks,
            asked_tasks,
        })
    }

    fn acknowledged(&self) -> Value {
        let mut a = JsonObject::new();
        for (k, on) in [
            ("toolsListChanged", self.tools),
            ("promptsListChanged", self.prompts),
            ("resourcesListChanged", self.resources),
        ] {
            if on {
                a.insert(k.into(), json!(true));
            }
        }
        if !self.uris.is_empty() {
            a.insert("resourceSubscriptions".into(), json!(self.uris));
        }
        if !self.tasks.is_empty() {
            a.insert("taskIds".into(), json!(self.tasks));
        }
        Value::Object(a)
    }

    /// The notification to send for `msg`, tagged with the subscription, if the filter takes it.
    fn pass(&self, msg: &str, id: &Value) -> Option<String> {
        let mut n: Value = serde_json::from_str(msg).ok()?;
        let wanted = match n.get("method").and_then(Value::as_str)? {
            "notifications/tools/list_changed" => self.tools,
            "notifications/prompts/list_changed" => self.prompts,
            "notifications/resources/list_changed" => self.resources,
            "notifications/resources/updated" => {
                let uri = n.get("params").and_then(|p| p.get("uri")).and_then(Value::as_str)?;
                self.uris.iter().any(|u| u == uri)
            }
            "notifications/tasks" => {
                let task = n.get("params").and_then(|p| p.get("taskId")).and_then(Value::as_str)?;
                self.tasks.iter().any(|t| t == task)
            }
            _ => false,
        };
        if !wanted {
            return None;
        }
        let params = n.as_object_mut()?.entry("params").or_insert_with(|| json!({}));
        let meta = params.as_object_mut()?.entry("_meta").or_insert_with(|| json!({}));
        meta.as_object_mut()?.insert(SUBSCRIPTION_KEY.into(), id.clone());
        Some(n.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: Value) -> JsonObject {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn listen_filters_keep_what_was_asked_and_declared_and_tag_it() {
        let caps = json!({ "tools": { "listChanged": true }, "resources": {} });
        let asked = params(json!({ "notifications": {
            "toolsListChanged": true, "promptsListChanged": true, "resourceSubscriptions": ["test://a"] } }));
        let f = Filter::parse(&asked, &caps).ok().unwrap_or_else(|| panic!("a valid filter"));
        // Prompts were asked for but the client declared no prompts listChanged capability.
        assert_eq!(f.acknowledged(), json!({ "toolsListChanged": true, "resourceSubscriptions": ["test://a"] }));
        let id = json!("sub-1");
        let tagged = f.pass(r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#, &id);
        let tagged: Value = serde_json::from_str(&tagged.unwrap_or_default()).unwrap_or_default();
        assert_eq!(tagged["params"]["_meta"][SUBSCRIPTION_KEY], "sub-1");
        let updated = |uri: &str| {
            format!(r#"{{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{{"uri":"{uri}"}}}}"#)
        };
        assert!(f.pass(&updated("test://a"), &id).is_some());
        assert!(f.pass(&updated("test://b"), &id).is_none(), "not subscribed");
        assert!(f.pass(r#"{"jsonrpc":"2.0","method":"notifications/prompts/list_changed"}"#, &id).is_none());
        assert!(f.pass("not json", &id).is_none());
        // Without the resources capability, subscriptions are dropped; malformed filters are refused.
        let no_res = Filter::parse(&asked, &json!({})).ok().map(|f| f.acknowledged());
        assert_eq!(no_res, Some(json!({})));
        assert!(Filter::parse(&params(json!({})), &caps).is_err());
        assert!(Filter::parse(&params(json!({ "notifications": { "toolsListChanged": "yes" } })), &caps).is_err());
        let many: Vec<String> = (0..=MAX_SUBSCRIPTIONS).map(|i| format!("test://{i}")).collect();
        assert!(Filter::parse(&params(json!({ "notifications": { "resourceSubscriptions": many } })), &caps).is_err());
    }
}
