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

/// Where audit records go. `record` must return at once: it queues the record or counts it as dropped.
pub trait AuditSink: Send + Sync + std::fmt::Debug {
    fn record(&self, record: AuditRecord);
}
