//! One audited `tools/call`: what the transport hands to the audit trail when a call ends, however it ended. The
//! transport builds it; a sink (the database crate's writer) keeps it. A sink must never make the caller wait: it
//! queues, or counts what it has to drop.

use std::time::{Duration, SystemTime};

/// One call's audit record. It never holds the arguments or the result, only their digest and size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditRecord {
    /// When the call ended.
    pub at: SystemTime,
    /// The tool's name as called (at most 64 characters), or `unknown`.
    pub tool: String,
    /// The same label as the `outcome` of `mcp_tool_calls_total` and the audit log line.
    pub outcome: &'static str,
    /// The principal's opaque key (the hash of issuer and subject).
    pub principal: String,
    /// The token's `client_id` (or `azp`), when it names one.
    pub client_id: Option<String>,
    /// From admission to the end.
    pub duration: Duration,
    /// The request's W3C trace id.
    pub trace_id: String,
    /// SHA-256 of the arguments as received, hex.
    pub args_sha256: String,
    /// Size of the result as serialized, when the call produced one.
    pub result_bytes: Option<u64>,
    /// The protocol generation: `2025` (sessions) or `2026` (stateless).
    pub generation: &'static str,
}

/// What kind of downstream event a [`DownstreamRecord`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DownstreamEvent {
    /// A token exchange (RFC 8693) sent to an authorization server (audit kind `exchange`).
    Exchange,
    /// A third party's authorization for a user: started, completed, refreshed or dropped (audit kind
    /// `authorize`).
    Authorization,
}

/// One downstream event: who, which downstream, how it ended, and how long the token lives. Never a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DownstreamRecord {
    pub at: SystemTime,
    pub event: DownstreamEvent,
    /// The downstream's configured name.
    pub downstream: String,
    /// `issued`, `refused`, `unavailable`, `invalid_response` (an exchange).
    pub outcome: &'static str,
    /// The principal's opaque key.
    pub principal: String,
    pub client_id: Option<String>,
    /// How long the request to the authorization server took.
    pub duration: Duration,
    /// The W3C trace id of the call that needed the token.
    pub trace_id: String,
    /// The lifetime of the token issued, when one was.
    pub lifetime: Option<Duration>,
}

/// Where audit records go. `record` must return at once: it queues the record or counts it as dropped.
pub trait AuditSink: Send + Sync + std::fmt::Debug {
    fn record(&self, record: AuditRecord);

    /// Keeps a downstream event (docs/DOWNSTREAM.md); returns at once, like [`record`](Self::record). The default
    /// keeps nothing.
    fn record_downstream(&self, _record: DownstreamRecord) {}
}
