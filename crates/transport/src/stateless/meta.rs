//! What a stateless request says of itself: whether a POST is of this generation at all (its version header, or
//! a `_meta` version outside the session generation), and its `_meta` (the protocol version, which must agree with
//! the header and be served here, the client's capabilities and log level), checked in the conformance order
//! (`-32602`, then `-32020`, then `-32022`).

use crate::ProtocolVersion;
use crate::error::TransportError;
use crate::extract::McpHeaders;
use crate::mcp;
use crate::request::Result;
use mcpfleet_tools::{JsonObject, LOG_LEVELS};
use serde_json::Value;

const VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";
const CAPABILITIES_KEY: &str = "io.modelcontextprotocol/clientCapabilities";
const LOG_LEVEL_KEY: &str = "io.modelcontextprotocol/logLevel";

/// Whether a POSTed message is answered in the 2026-07-28 generation: its version header says a stateless version,
/// or its `_meta` names a protocol version that is not one of the session generation's (the session generation
/// has no such field; a `_meta` naming a session version is left to the session path, which asks for a session).
pub(crate) fn is_stateless(h: &McpHeaders, params: Option<&JsonObject>) -> bool {
    let header = crate::request::stateless_header(h);
    let meta = params.and_then(|p| p.get("_meta")).and_then(|m| m.get(VERSION_KEY));
    header
        || meta.is_some_and(|v| v.as_str().and_then(ProtocolVersion::parse).is_none_or(ProtocolVersion::is_stateless))
}

/// What a stateless request says of itself in `_meta`.
pub(crate) struct Meta {
    pub(crate) capabilities: Value,
    /// The lowest log level the client wants (`notifications/message` is sent only when set).
    pub(crate) log_level: Option<usize>,
}

/// Checks the version (header and `_meta` must agree, and be served here) and the required `_meta` fields.
pub(crate) fn meta(h: &McpHeaders, params: &JsonObject) -> Result<Meta> {
    let header =
        h.raw_version().map_err(|_| TransportError::HeaderMismatch("MCP-Protocol-Version is malformed".into()))?;
    let meta = match params.get("_meta") {
        None => None,
        Some(Value::Object(m)) => Some(m),
        Some(_) => return Err(TransportError::InvalidMeta("params._meta must be an object".into())),
    };
    // Required fields first (-32602), then the header against the body (-32020), then the version (-32022).
    let body = match meta.and_then(|m| m.get(VERSION_KEY)) {
        None => {
            return Err(TransportError::InvalidMeta(format!("params._meta[\"{VERSION_KEY}\"] is required")));
        }
        Some(Value::String(v)) => v.as_str(),
        Some(_) => {
            return Err(TransportError::InvalidMeta(format!("params._meta[\"{VERSION_KEY}\"] must be a string")));
        }
    };
    let capabilities = match meta.and_then(|m| m.get(CAPABILITIES_KEY)) {
        Some(c @ Value::Object(_)) => c.clone(),
        Some(_) => {
            return Err(TransportError::InvalidMeta(format!("params._meta[\"{CAPABILITIES_KEY}\"] must be an object")));
        }
        None => return Err(TransportError::InvalidMeta(format!("params._meta[\"{CAPABILITIES_KEY}\"] is required"))),
    };
    match header {
        None => return Err(TransportError::HeaderMismatch("the MCP-Protocol-Version header is required".into())),
        Some(hv) if hv != body => {
            return Err(TransportError::HeaderMismatch(format!(
                "MCP-Protocol-Version header value '{}' does not match body value '{}'",
                mcp::truncate(hv, 32),
                mcp::truncate(body, 32)
            )));
        }
        Some(_) => {}
    }
    if !ProtocolVersion::parse(body).is_some_and(ProtocolVersion::is_stateless) {
        return Err(TransportError::ProtocolVersion(mcp::truncate(body, 32)));
    }
    let log_level = match meta.and_then(|m| m.get(LOG_LEVEL_KEY)) {
        None => None,
        Some(v) => Some(v.as_str().and_then(|l| LOG_LEVELS.iter().position(|x| *x == l)).ok_or_else(|| {
            TransportError::InvalidMeta(format!(
                "params._meta[\"{LOG_LEVEL_KEY}\"] must be one of {}",
                LOG_LEVELS.join(", ")
            ))
        })?),
    };
    Ok(Meta { capabilities, log_level })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(v: Value) -> JsonObject {
        v.as_object().cloned().unwrap_or_default()
    }

    fn stateless_meta(extra: Value) -> JsonObject {
        let mut meta = json!({ VERSION_KEY: "2026-07-28", CAPABILITIES_KEY: {} });
        if let (Some(m), Some(e)) = (meta.as_object_mut(), extra.as_object()) {
            m.extend(e.clone());
        }
        params(json!({ "_meta": meta }))
    }

    #[test]
    fn the_generation_is_the_header_or_a_meta_version_outside_the_session_generation() {
        let none = McpHeaders::of(&[]);
        let header = McpHeaders::of(&[("mcp-protocol-version", "2026-07-28")]);
        assert!(is_stateless(&header, None));
        assert!(!is_stateless(&none, None));
        assert!(is_stateless(&none, Some(&stateless_meta(json!({})))));
        let session = params(json!({ "_meta": { VERSION_KEY: "2025-11-25" } }));
        assert!(!is_stateless(&none, Some(&session)), "a session version in _meta takes the session path");
        let odd = params(json!({ "_meta": { VERSION_KEY: 7 } }));
        assert!(is_stateless(&none, Some(&odd)), "a malformed _meta version is refused by the stateless checks");
    }

    #[test]
    fn meta_checks_run_in_the_conformance_order() {
        let h = McpHeaders::of(&[("mcp-protocol-version", "2026-07-28")]);
        let err = |h: &McpHeaders, p: &JsonObject| meta(h, p).err().map(|e| (e.status_code().as_u16(), e.to_string()));
        // Required fields first (-32602), whatever the header says.
        let (s, m) = err(&McpHeaders::of(&[]), &params(json!({}))).unwrap_or_default();
        assert_eq!(s, 400);
        assert!(m.contains("protocolVersion\"] is required"), "{m}");
        let no_caps = params(json!({ "_meta": { VERSION_KEY: "2026-07-28" } }));
        assert!(err(&h, &no_caps).is_some_and(|(_, m)| m.contains("clientCapabilities\"] is required")));
        let not_object = params(json!({ "_meta": 1 }));
        assert!(err(&h, &not_object).is_some_and(|(_, m)| m.contains("must be an object")));
        // Then the header against the body.
        let missing = err(&McpHeaders::of(&[]), &stateless_meta(json!({}))).unwrap_or_default().1;
        assert!(missing.contains("header is required"), "{missing}");
        let other = McpHeaders::of(&[("mcp-protocol-version", "2025-11-25")]);
        let mismatch = err(&other, &stateless_meta(json!({}))).unwrap_or_default().1;
        assert!(mismatch.contains("does not match body value '2026-07-28'"), "{mismatch}");
        // Then the version.
        let future = McpHeaders::of(&[("mcp-protocol-version", "2027-01-01")]);
        let p = params(json!({ "_meta": { VERSION_KEY: "2027-01-01", CAPABILITIES_KEY: {} } }));
        assert!(matches!(meta(&future, &p), Err(TransportError::ProtocolVersion(v)) if v == "2027-01-01"));
        // The log level, when given, must be a level.
        let bad_level = stateless_meta(json!({ LOG_LEVEL_KEY: "loud" }));
        assert!(err(&h, &bad_level).is_some_and(|(_, m)| m.contains("must be one of debug")));
        let ok = meta(&h, &stateless_meta(json!({ LOG_LEVEL_KEY: "warning" }))).ok();
        assert_eq!(ok.and_then(|m| m.log_level), LOG_LEVELS.iter().position(|l| *l == "warning"));
    }
}
