//! What every request handler shares, whatever its generation: who is asking and its admission through the
//! limits, the POSTed message's context ([`Post`]), the access-log record, and the refusal charge. The HTTP shell
//! (`shell.rs`) and both front ends (`session/`, `stateless/`) build on it; it imports neither front end.

use crate::error::TransportError;
use crate::extract::McpHeaders;
use crate::observe::{RequestIds, RpcInfo};
use crate::policy::Plan;
use crate::{AppState, PeerAddr, Principal, ProtocolVersion, mcp, trace};
use axum::Extension;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mcpfleet_limits::{self as limits, Granted, LimitError, Refused};
use serde_json::Value;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) type Result<T, E = TransportError> = std::result::Result<T, E>;

/// Who is asking, for admission: the verified principal, its plan, and the peer address where the bucket is keyed
/// by it.
pub(crate) struct Asker<'a> {
    pub(crate) caller: &'a Principal,
    /// The caller's plan under the policy in force, resolved once per request.
    pub(crate) plan: Arc<Plan>,
    peer: Option<IpAddr>,
    /// The caller's token, for a tool's downstream tokens (only when downstreams are configured).
    pub(crate) subject: Option<mcpfleet_downstream::SubjectToken>,
    /// The caller's DPoP proof has gone into an admission.
    proof_used: AtomicBool,
}

impl<'a> Asker<'a> {
    pub(crate) fn new(app: &AppState, caller: &'a Principal, peer: Option<Extension<PeerAddr>>) -> Self {
        let peer = peer.filter(|_| app.config.rate_key_by_peer).map(|Extension(p)| p.0.ip());
        Self { caller, plan: app.policy.plan_of(caller), peer, subject: None, proof_used: AtomicBool::new(false) }
    }

    /// The same asker, with the caller's token for downstream exchanges.
    pub(crate) fn with_subject(mut self, subject: Option<mcpfleet_downstream::SubjectToken>) -> Self {
        self.subject = subject;
        self
    }

    pub(crate) fn request(&self) -> limits::Request<'_> {
        limits::Request {
            plan: Some(&self.plan.limits),
            token_id: self.caller.token_id.as_deref(),
            // The request's DPoP proof rides on its first admission only: a second admission of the same request
            // (none is expected) must not find its own record and call it a replay.
            proof: self.caller.proof.as_ref().filter(|_| !self.proof_used.swap(true, Ordering::Relaxed)),
            ..limits::Request::new(&self.caller.user, self.peer)
        }
    }
}

/// Admits a request (bucket, session, caps, quota: one store call), noting the caller's bucket for the
/// `RateLimit` headers.
pub(crate) async fn admit(
    app: &AppState,
    info: &mut RpcInfo,
    req: &limits::Request<'_>,
) -> Result<Granted, LimitError> {
    info.charged = true;
    match app.limits.admit(req).await {
        Ok(g) => {
            info.rate = g.rate;
            Ok(g)
        }
        Err(Refused { rate, error }) => {
            info.rate = rate;
            if matches!(error, LimitError::ProofReplayed) {
                // A stolen proof, or a client that reuses them: either way someone to look at.
                app.metrics.auth_refusals.with_label_values(&["replayed_dpop_proof"]).inc();
                tracing::warn!(principal = req.user.as_str(), "a DPoP proof was presented again: refused");
            }
            Err(error)
        }
    }
}

/// Admission for a request on the session it names: unknown, ended and foreign sessions all look alike (404). A
/// session id that cannot be ours is refused without a store call (and charged by [`charge_unadmitted`]).
/// Every request from an identified caller takes a token from its bucket, exactly once. A request answered before
/// its admission (a malformed body, a missing header, a bad argument) takes it here; if the bucket is empty, the
/// caller gets the 429 instead.
pub(crate) async fn charge_unadmitted(
    app: &AppState,
    info: &mut RpcInfo,
    asker: &Asker<'_>,
    r: Result<Response>,
) -> Result<Response> {
    let from_store =
        matches!(&r, Err(TransportError::Limit(_) | TransportError::Unavailable(_) | TransportError::AuthUnavailable));
    if info.charged || from_store {
        return r;
    }
    match admit(app, info, &asker.request()).await {
        Err(e @ LimitError::RateLimited { .. }) => Err(e.into()),
        _ => r,
    }
}

pub(crate) fn rpc_json(id: &Value, r: mcp::RpcResult) -> Response {
    axum::Json(crate::jsonrpc::response(id, r)).into_response()
}

pub(crate) fn accepted() -> Response {
    StatusCode::ACCEPTED.into_response()
}

/// One POSTed message being answered.
pub(crate) struct Post<'a> {
    pub(crate) app: &'a AppState,
    pub(crate) ids: &'a RequestIds,
    pub(crate) trace_id: &'a str,
    pub(crate) span: &'a mut trace::SpanGuard,
    pub(crate) asker: &'a Asker<'a>,
    pub(crate) info: &'a mut RpcInfo,
}

/// What the access log and the metrics learn of a request: its method label, the caller's hash and the session's.
pub(crate) fn rpc_info(method: Option<&'static str>, caller: &Principal, h: &McpHeaders) -> RpcInfo {
    RpcInfo { method, principal: Some(caller.user.as_str().to_owned()), session: h.session_tag(), ..RpcInfo::default() }
}

/// Whether a request's `MCP-Protocol-Version` names the stateless generation: a GET or DELETE is then 405, and a
/// body that cannot be read is answered in that generation.
pub(crate) fn stateless_header(h: &McpHeaders) -> bool {
    matches!(h.raw_version(), Ok(Some(v)) if ProtocolVersion::parse(v).is_some_and(ProtocolVersion::is_stateless))
}
