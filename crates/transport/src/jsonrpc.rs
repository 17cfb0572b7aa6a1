//! The one builder of JSON-RPC bodies: every result, error, request and notification the transport sends, on a
//! JSON response, an SSE stream or a resumed tail, is made here.

use serde_json::{Map, Value, json};

/// An error object: `{"code", "message"}`, and `"data"` when given.
pub(crate) fn error_object(code: i64, message: &str, data: Option<Value>) -> Value {
    let mut e = Map::new();
    e.insert("code".to_owned(), Value::from(code));
    e.insert("message".to_owned(), Value::from(message));
    if let Some(d) = data.filter(|d| !d.is_null()) {
        e.insert("data".to_owned(), d);
    }
    Value::Object(e)
}

/// A response carrying `result`.
pub(crate) fn result(id: &Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// A response carrying an error object (see [`error_object`]); `id` is `null` when the request's is unknown.
pub(crate) fn error(id: Option<&Value>, error: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id.unwrap_or(&Value::Null), "error": error })
}

/// A response: `Ok` is the result, `Err((code, message))` an error without data.
pub(crate) fn response(id: &Value, r: Result<Value, (i64, String)>) -> Value {
    match r {
        Ok(v) => result(id, v),
        Err((code, message)) => error(Some(id), error_object(code, &message, None)),
    }
}

/// A server→client request.
pub(crate) fn request(id: &Value, method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

/// A notification.
pub(crate) fn notification(method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "method": method, "params": params })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_exactly_the_members_json_rpc_defines() {
        let id = json!(7);
        assert_eq!(result(&id, json!({})), json!({ "jsonrpc": "2.0", "id": 7, "result": {} }));
        assert_eq!(
            response(&id, Err((-32602, "bad".to_owned()))),
            json!({ "jsonrpc": "2.0", "id": 7, "error": { "code": -32602, "message": "bad" } })
        );
        assert_eq!(
            error(None, error_object(-32000, "x", Some(json!({ "a": 1 })))),
            json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32000, "message": "x", "data": { "a": 1 } } })
        );
        assert_eq!(error_object(1, "m", Some(Value::Null)), json!({ "code": 1, "message": "m" }), "null data is none");
        assert_eq!(
            request(&json!("s1"), "roots/list", json!({})),
            json!({ "jsonrpc": "2.0", "id": "s1", "method": "roots/list", "params": {} })
        );
        assert_eq!(notification("n", json!([])), json!({ "jsonrpc": "2.0", "method": "n", "params": [] }));
    }
}
