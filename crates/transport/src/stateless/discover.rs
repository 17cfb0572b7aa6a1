//! `server/discover`: the versions served here and the catalog's capabilities as the stateless generation states
//! them.

use super::reply::complete;
use crate::{AppState, ProtocolVersion};
use serde_json::{Value, json};

/// The result of `server/discover`.
pub(super) fn discover(app: &AppState) -> Value {
    let mut r = json!({
        "supportedVersions": ProtocolVersion::NEWEST_FIRST.map(ProtocolVersion::as_str),
        "capabilities": capabilities(app),
    });
    if let Some(i) = app.catalog.instructions() {
        r["instructions"] = json!(i);
    }
    complete(app, r, true)
}

/// The catalog's capabilities as 2026-07-28 states them: no `logging` (levels are per request), no
/// `resources.subscribe` (resource updates come through `subscriptions/listen`), and the tasks extension (beside
/// the skills extension when skills are served).
pub(super) fn capabilities(app: &AppState) -> Value {
    let mut caps = crate::mcp::capabilities(app);
    if let Some(r) = caps.get_mut("resources").and_then(Value::as_object_mut) {
        r.remove("subscribe");
    }
    if let Value::Object(c) = &mut caps {
        let ext = c.entry("extensions").or_insert_with(|| json!({}));
        if let Value::Object(e) = ext {
            e.insert(crate::tasks::EXTENSION.into(), json!({}));
        }
    }
    caps
}
