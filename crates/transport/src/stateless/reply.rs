//! How the stateless generation answers: a result marked complete (`resultType`, `serverInfo`, the caching hints),
//! a JSON-RPC error of the method itself with the stateless code allocation (HTTP 200), and the frames of a stream
//! of its own (how far a slow client may fall behind, and how long a final message waits for one that stopped
//! reading).

use crate::sse::{Frame, Live};
use crate::{AppState, code};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::time::Duration;

const SERVER_INFO_KEY: &str = "io.modelcontextprotocol/serverInfo";

/// Marks a result complete and names the server in its `_meta`; `cache` adds the caching hints.
pub(crate) fn complete(app: &AppState, mut result: Value, cacheable: bool) -> Value {
    if let Value::Object(o) = &mut result {
        o.entry("resultType").or_insert_with(|| json!("complete"));
        if cacheable {
            let ttl = u64::try_from(app.config.cache_ttl.as_millis()).unwrap_or(u64::MAX);
            o.insert("ttlMs".into(), json!(ttl));
            // Lists filtered by the caller's scopes, and anything read under a token, are the caller's own.
            let scope = if app.config.protected_resource.is_some() { "private" } else { "public" };
            o.insert("cacheScope".into(), json!(scope));
        }
        let meta = o.entry("_meta").or_insert_with(|| json!({}));
        if let Value::Object(m) = meta {
            m.insert(SERVER_INFO_KEY.into(), server_info(app));
        }
    }
    result
}

fn server_info(app: &AppState) -> Value {
    json!({ "name": app.config.server_name, "version": app.config.server_version })
}

pub(super) fn ok(id: &Value, result: Value) -> Response {
    axum::Json(crate::jsonrpc::result(id, result)).into_response()
}

/// A JSON-RPC error answered with HTTP 200 (an error of the method itself, with the stateless code allocation).
pub(super) fn rpc_error(id: &Value, (c, message): (i64, String), data: Option<Value>) -> Response {
    let error = crate::jsonrpc::error_object(code::stateless(c), &message, data);
    axum::Json(crate::jsonrpc::error(Some(id), error)).into_response()
}

/// Longest a final message waits for room on a stream whose client stopped reading; then it is dropped (the
/// client gave up on its answer), so that a stalled client never holds a call's task and slot.
const FINAL_SEND_WAIT: Duration = Duration::from_secs(30);

/// Sends a stream's final message, waiting at most [`FINAL_SEND_WAIT`] for room.
pub(super) async fn send_bounded(tx: &Live, frame: Frame) {
    tx.send_timeout(frame, FINAL_SEND_WAIT).await;
}
