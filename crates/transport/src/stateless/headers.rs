//! The standard headers of a stateless request against its body: `Mcp-Method`, `Mcp-Name` (the tool, prompt,
//! resource or task the body names) and the `Mcp-Param-*` headers a tool mirrors (`x-mcp-header`), each possibly
//! in the `=?base64?…?=` encoding; a mismatch is `-32020`.

use crate::AppState;
use crate::error::TransportError;
use crate::extract::McpHeaders;
use crate::mcp;
use crate::request::Result;
use mcpfleet_tools::JsonObject;
use serde_json::Value;

/// Decodes a header value that may use the `=?base64?…?=` sentinel.
fn decode_header(v: &str) -> Option<String> {
    use base64::Engine as _;
    match v.strip_prefix("=?base64?").and_then(|r| r.strip_suffix("?=")) {
        Some(b) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(b).ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(v.to_owned()),
    }
}

/// `Mcp-Method` and (for `tools/call`, `resources/read`, `prompts/get` and the tasks extension's `tasks/get`,
/// `tasks/update` and `tasks/cancel`, where it is the task id) `Mcp-Name` must be present and match the body.
pub(crate) fn check_headers(h: &McpHeaders, method: &str, params: &JsonObject) -> Result<()> {
    let bad = |m: String| Err(TransportError::HeaderMismatch(m));
    match &h.mcp_method {
        Err(_) => return bad("the Mcp-Method header is malformed".into()),
        Ok(None) => return bad("the Mcp-Method header is required".into()),
        Ok(Some(m)) if m != method => {
            return bad(format!(
                "Mcp-Method header value '{}' does not match body value '{}'",
                mcp::truncate(m, 64),
                mcp::truncate(method, 64)
            ));
        }
        Ok(Some(_)) => {}
    }
    let field = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        "tasks/get" | "tasks/update" | "tasks/cancel" => "taskId",
        _ => return Ok(()),
    };
    let header = match &h.mcp_name {
        Err(_) => return bad("the Mcp-Name header is malformed".into()),
        Ok(None) => return bad(format!("the Mcp-Name header is required for {method}")),
        Ok(Some(v)) => v,
    };
    let Some(decoded) = decode_header(header) else {
        return bad("the Mcp-Name header is not valid =?base64?…?= encoding".into());
    };
    // A body without the field is refused by the method itself (-32602).
    if let Some(body) = params.get(field).and_then(Value::as_str)
        && body != decoded
    {
        return bad(format!(
            "Mcp-Name header value '{}' does not match body value '{}'",
            mcp::truncate(&decoded, 64),
            mcp::truncate(body, 64)
        ));
    }
    Ok(())
}

/// The `Mcp-Param-*` headers of a `tools/call` against its arguments: every parameter the tool mirrors
/// (`x-mcp-header`) that has a value needs its header, equal to the value once decoded (integers compare as
/// numbers); a parameter without a value needs none.
pub(crate) fn check_param_headers(h: &McpHeaders, app: &AppState, tool: &str, args: &JsonObject) -> Result<()> {
    let declared = app.validator.param_headers(tool);
    if declared.is_empty() {
        return Ok(());
    }
    for p in declared {
        let wanted = p.name.to_ascii_lowercase();
        let name = format!("Mcp-Param-{}", p.name);
        let sent = h.mcp_params.iter().find(|(n, _)| *n == wanted).map(|(_, v)| v);
        let (body, sent) = match (mcpfleet_tools::headers::header_text(p, args), sent) {
            (_, Some(Err(_))) => {
                return Err(TransportError::HeaderMismatch(format!("the {name} header has invalid characters")));
            }
            (None, None) | (Some(Err(())), _) => continue, // (a value of the wrong type: the schema refuses it)
            (None, Some(Ok(_))) => {
                return Err(TransportError::HeaderMismatch(format!(
                    "the {name} header is sent but the body has no value for it"
                )));
            }
            (Some(Ok(_)), None) => {
                return Err(TransportError::HeaderMismatch(format!(
                    "the {name} header is required: the body has a value for it"
                )));
            }
            (Some(Ok(b)), Some(Ok(v))) => (b, v),
        };
        let Some(decoded) = decode_header(sent) else {
            return Err(TransportError::HeaderMismatch(format!(
                "the {name} header is not valid =?base64?…?= encoding"
            )));
        };
        let same = match p.kind {
            mcpfleet_tools::headers::ParamKind::Integer => same_integer(&decoded, &body),
            _ => decoded == body,
        };
        if !same {
            return Err(TransportError::HeaderMismatch(format!(
                "{name} header value '{}' does not match body value '{}'",
                mcp::truncate(&decoded, 64),
                mcp::truncate(&body, 64)
            )));
        }
    }
    Ok(())
}

/// Whether a header's integer text (`42`, or `42.0`) names the body's integer, exactly, within JavaScript's safe
/// range (±(2^53 − 1)), as the spec asks of `x-mcp-header` integers.
fn same_integer(header: &str, body: &str) -> bool {
    const SAFE: i128 = (1 << 53) - 1;
    let Ok(b) = body.parse::<i128>() else { return false };
    let h = match header.parse::<i128>() {
        Ok(h) => h,
        Err(_) => match header.split_once('.') {
            Some((int, frac)) if !frac.is_empty() && frac.bytes().all(|c| c == b'0') => match int.parse::<i128>() {
                Ok(h) => h,
                Err(_) => return false,
            },
            _ => return false,
        },
    };
    h == b && h.abs() <= SAFE
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(v: Value) -> JsonObject {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn method_and_name_headers_match_the_body() {
        let call = params(json!({ "name": "tool é" }));
        let b64 = {
            use base64::Engine as _;
            format!("=?base64?{}?=", base64::engine::general_purpose::STANDARD.encode("tool é"))
        };
        let check =
            |pairs: &[(&str, &str)], method: &str, p: &JsonObject| check_headers(&McpHeaders::of(pairs), method, p);
        assert!(check(&[("mcp-method", "tools/call"), ("mcp-name", &b64)], "tools/call", &call).is_ok());
        assert!(check(&[("mcp-method", "tools/list")], "tools/list", &JsonObject::new()).is_ok(), "no name needed");
        let msg = |r: Result<()>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg(check(&[], "tools/list", &JsonObject::new())).contains("Mcp-Method header is required"));
        assert!(msg(check(&[("mcp-method", "tools/list")], "ping", &JsonObject::new())).contains("does not match"));
        assert!(
            msg(check(&[("mcp-method", "tools/call")], "tools/call", &call)).contains("Mcp-Name header is required")
        );
        let other = check(&[("mcp-method", "tools/call"), ("mcp-name", "other")], "tools/call", &call);
        assert!(msg(other).contains("Mcp-Name header value 'other' does not match body value 'tool é'"));
        let broken = check(&[("mcp-method", "tools/call"), ("mcp-name", "=?base64?***?=")], "tools/call", &call);
        assert!(msg(broken).contains("not valid =?base64?…?= encoding"));
        let uri = params(json!({ "uri": "test://x" }));
        assert!(check(&[("mcp-method", "resources/read"), ("mcp-name", "test://x")], "resources/read", &uri).is_ok());
    }

    #[test]
    fn integer_headers_compare_exactly_within_the_safe_range() {
        assert!(same_integer("42", "42"));
        assert!(same_integer("42.0", "42") && same_integer("-7.00", "-7"));
        assert!(!same_integer("42.5", "42") && !same_integer("4.2e1", "42") && !same_integer("42.", "42"));
        assert!(!same_integer("43", "42") && !same_integer("x", "42") && !same_integer("42", "x"));
        let max = ((1_i64 << 53) - 1).to_string();
        let over = (1_i64 << 53).to_string();
        assert!(same_integer(&max, &max));
        assert!(!same_integer(&over, &over), "outside JavaScript's safe range");
    }
}
