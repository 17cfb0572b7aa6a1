//! JSON-RPC error codes: the standard ones, the codes MCP and this server allocate, and the 2026-07-28 mapping.

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// Transport-level refusals (origin, session, version, cursor).
pub const SERVER_ERROR: i64 = -32000;
/// The session named by `MCP-Session-Id` does not exist for this caller.
pub const SESSION_NOT_FOUND: i64 = -32001;
/// `resources/read` of an unknown URI.
pub const RESOURCE_NOT_FOUND: i64 = -32002;
/// The replica running a request stopped before it answered; the client should retry the request.
pub const REQUEST_LOST: i64 = -32003;
/// The events after `Last-Event-ID` are no longer retained.
pub const CURSOR_GONE: i64 = -32004;
/// The state store is unavailable.
pub const UNAVAILABLE: i64 = -32005;
/// A limit refused the request (429): the rate limit or a per-principal cap. `error.data` says which.
pub const LIMITED: i64 = -32006;
/// 2026-07-28: the HTTP headers do not match the body, or a required one is missing or malformed (400).
pub const HEADER_MISMATCH: i64 = -32020;
/// 2025-11-25: the request needs a URL-mode elicitation completed first (`URLElicitationRequiredError`); its
/// `data.elicitations` lists them.
pub const URL_ELICITATION_REQUIRED: i64 = -32042;
/// 2026-07-28: the request needs a client capability the request did not declare (400).
pub const MISSING_CLIENT_CAPABILITY: i64 = -32021;
/// The requested protocol version is not served here (400); `error.data` lists the supported ones.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
/// 2026-07-28 answers keep out of the legacy sub-range (-32000 to -32019): a limit refused the request (429).
pub const STATELESS_LIMITED: i64 = -31429;
/// 2026-07-28: the state store is unavailable (503).
pub const STATELESS_UNAVAILABLE: i64 = -31503;

/// The code a 2026-07-28 answer carries for `code`: the legacy sub-range is not used there (the spec's
/// allocation policy); transport refusals become `Invalid Request`, the store's unavailability and limit
/// refusals get codes outside the JSON-RPC reserved range.
#[must_use]
pub fn stateless(code: i64) -> i64 {
    match code {
        SERVER_ERROR | SESSION_NOT_FOUND | REQUEST_LOST | CURSOR_GONE => INVALID_REQUEST,
        RESOURCE_NOT_FOUND => INVALID_PARAMS,
        UNAVAILABLE => STATELESS_UNAVAILABLE,
        LIMITED => STATELESS_LIMITED,
        other => other,
    }
}
