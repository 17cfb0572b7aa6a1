//! The checks of a `tools/call` that both generations run, in one function and one order, before anything runs
//! or is counted against a quota ([`Post::preflight`]): the call's target, the tool's scopes (403 step-up), the
//! front end's own checks, the arguments against the tool's published schema (an `isError` result naming each
//! pointer), the idempotency key, then admission with the in-flight slot and the tool's quota (an exhausted quota
//! is an `isError` result for the model). A front end says how it admits and how it words the early answers
//! ([`Front`]).

use super::audit::{CallEnd, RefusedCall};
use crate::AppState;
use crate::error::{TransportError, auth_rejection};
use crate::idempotency::{self, Idempotent};
use crate::mcp;
use crate::request::{Post, Result};
use async_trait::async_trait;
use mcpfleet_limits::{self as limits, Granted, LimitError};
use mcpfleet_state::SlotSet;
use mcpfleet_tools::JsonObject;
use serde_json::{Value, json};

/// Where a call stops before it runs.
pub(crate) enum Early {
    /// An answer in the response body: a result for the model (invalid arguments, an exhausted quota), or a
    /// JSON-RPC error.
    Answer(mcp::RpcResult),
    /// The request is refused (an HTTP error status).
    Refuse(TransportError),
}

impl From<TransportError> for Early {
    fn from(e: TransportError) -> Self {
        Self::Refuse(e)
    }
}

/// A call that passed its checks and was admitted: ready for the drive loop.
pub(crate) struct Cleared<T> {
    pub(crate) name: String,
    pub(crate) args: JsonObject,
    pub(crate) idem: Option<Idempotent>,
    /// What the front end's admission yields besides the grant (the session key, in the session generation).
    pub(crate) ticket: T,
    pub(crate) granted: Granted,
}

/// A front end's part in the checks of a `tools/call`.
#[async_trait]
pub(crate) trait Front: Send {
    /// The protocol generation of its calls, in their audit rows: `call::SESSION_GENERATION` or `STATELESS_GENERATION`.
    const GENERATION: &'static str;
    type Ticket: Send;
    /// How a call whose `name` or `arguments` are missing or ill-typed is answered.
    fn bad_target(&self, e: (i64, String)) -> Early;
    /// How a call with a malformed idempotency key is answered.
    fn bad_key(&self, e: TransportError) -> Early;
    /// The front end's own checks: after the scopes (a caller who may not call the tool learns nothing of its
    /// parameters), before the arguments.
    fn check(&self, post: &Post<'_>, name: &str, args: &JsonObject) -> Result<()>;
    /// The last check before admission.
    fn ready(&mut self, post: &mut Post<'_>, name: &str, args: &JsonObject, params: &JsonObject) -> Result<()>;
    /// Admits the call (the bucket, and the session where there is one), with the in-flight slot and the tool's
    /// quota when given; a call refused for its arguments is admitted with neither.
    async fn admit(
        &mut self,
        post: &mut Post<'_>,
        slot: Option<SlotSet>,
        quota: Option<(&str, limits::Quota)>,
    ) -> Result<(Self::Ticket, Granted)>;
}

impl Post<'_> {
    /// Every check of a `tools/call` before its tool runs, in one order for both generations (see the module).
    ///
    /// # Errors
    /// [`Early`]: the answer the call gets instead of running.
    pub(crate) async fn preflight<F: Front>(
        &mut self,
        front: &mut F,
        params: &JsonObject,
        duplicate: Option<&str>,
    ) -> std::result::Result<Cleared<F::Ticket>, Early> {
        let app = self.app;
        let (name, args) = match mcp::target(params) {
            Ok(t) => t,
            Err(e) => {
                self.span.error = Some(e.0.to_string());
                return Err(front.bad_target(e));
            }
        };
        self.require_tool_scopes(&name, &args, F::GENERATION)?;
        self.require_plan_allows(&name, &args, F::GENERATION)?;
        front.check(self, &name, &args)?;
        // The arguments against the exact schema the tool publishes, before anything runs or is counted against
        // a quota. A refusal is still admitted (it takes its token, and checks the session where there is one).
        if let Some(invalid) = invalid_arguments(app, &name, params.get("arguments"), duplicate)? {
            front.admit(self, None, None).await?;
            self.record_refused(&name, &args, CallEnd::InvalidArguments, F::GENERATION);
            self.span.error = Some("invalid_arguments".to_owned());
            return Err(Early::Answer(Ok(invalid_result(&name, &invalid))));
        }
        // The plan's conditions read the validated arguments. A refusal is admitted as an invalid call is.
        if let Err(message) = app.policy.check_call(&self.asker.plan, self.asker.caller, &name, &args) {
            front.admit(self, None, None).await?;
            self.record_refused(&name, &args, CallEnd::RefusedByPolicy, F::GENERATION);
            self.span.error = Some("refused_by_policy".to_owned());
            return Err(Early::Answer(Ok(policy_result(&name, &message, self.trace_id))));
        }
        let idem =
            idempotency::from_params(&self.asker.caller.user, &name, params, &args).map_err(|e| front.bad_key(e))?;
        front.ready(self, &name, &args, params)?;
        // The quota the caller's tenant shares, beside its own: a unit of this replica's lease (docs/POLICY.md).
        let tenant =
            self.asker.caller.tenant.as_deref().and_then(|t| app.policy.tenant_quota(t, &name).map(|q| (t, q)));
        if let Some((t, q)) = tenant {
            match app.limits.take_tenant(t, &name, q).await {
                Ok(()) => {}
                Err(LimitError::TenantQuotaExhausted { tool, quota, retry_after }) => {
                    front.admit(self, None, None).await?;
                    self.record_refused(&name, &args, CallEnd::RefusedByLimit, F::GENERATION);
                    self.span.error = Some("quota_exhausted".to_owned());
                    let text = quota_result(&tool, quota, retry_after, self.trace_id, TENANT);
                    return Err(Early::Answer(Ok(text)));
                }
                Err(e) => return Err(TransportError::from(e).into()),
            }
        }
        let quota = self.asker.plan.limits.quota_for(&name, app.catalog.tool_quota(&name));
        let admitted = front.admit(self, Some(SlotSet::Calls), quota.map(|q| (name.as_str(), q))).await;
        if let (Err(_), Some((t, _))) = (&admitted, tenant) {
            app.limits.give_back_tenant(t, &name);
        }
        match admitted {
            Ok((ticket, granted)) => Ok(Cleared { name, args, idem, ticket, granted }),
            Err(TransportError::Limit(LimitError::QuotaExhausted { tool, quota, retry_after })) => {
                // Not a protocol error: the model reads it, and should ask its user instead of retrying.
                self.record_refused(&name, &args, CallEnd::RefusedByLimit, F::GENERATION);
                self.span.error = Some("quota_exhausted".to_owned());
                Err(Early::Answer(Ok(quota_result(&tool, quota, retry_after, self.trace_id, USER))))
            }
            Err(e @ TransportError::Limit(LimitError::RateLimited { .. } | LimitError::CapReached { .. })) => {
                self.record_refused(&name, &args, CallEnd::RefusedByLimit, F::GENERATION);
                Err(e.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Step-up (MCP authorization): a caller without the tool's scopes gets 403 insufficient_scope naming them,
    /// before anything runs or is counted against a quota; the refusal is audited.
    pub(crate) fn require_tool_scopes(
        &mut self,
        name: &str,
        args: &JsonObject,
        generation: &'static str,
    ) -> Result<()> {
        let app = self.app;
        let required = app.tool_scopes(name);
        if self.asker.caller.scopes.allow(&required) {
            return Ok(());
        }
        self.record_refused(name, args, CallEnd::Refused, generation);
        self.span.error = Some("insufficient_scope".to_owned());
        Err(auth_rejection(
            app,
            mcpfleet_auth::AuthError::InsufficientScope(required),
            self.asker.caller.proof.is_some(),
        ))
    }

    /// A tool the caller's plan does not list: refused where a missing scope is (before its arguments are read),
    /// with 403 and no challenge; counted and audited.
    fn require_plan_allows(&mut self, name: &str, args: &JsonObject, generation: &'static str) -> Result<()> {
        if self.asker.plan.allows(name) {
            return Ok(());
        }
        self.app.policy.metrics().refused(self.asker.plan.label(), "tools.allow");
        self.record_refused(name, args, CallEnd::RefusedByPolicy, generation);
        self.span.error = Some("refused_by_policy".to_owned());
        Err(TransportError::NotInPlan(mcp::truncate(name, 128)))
    }

    /// Counts and audits a call refused before it started.
    pub(crate) fn record_refused(&self, tool: &str, args: &JsonObject, end: CallEnd, generation: &'static str) {
        let principal = self.asker.caller;
        RefusedCall { app: self.app, principal, tool, args, trace_id: self.trace_id, end, generation }.record();
    }
}

/// The duplicate keys and schema violations of a call's arguments, if any. A duplicate key elsewhere in the
/// message is a malformed request.
pub(crate) fn invalid_arguments(
    app: &AppState,
    tool: &str,
    args: Option<&Value>,
    duplicate: Option<&str>,
) -> Result<Option<Vec<mcpfleet_tools::validate::Invalid>>> {
    use mcpfleet_tools::validate::Invalid;
    if let Some(at) = duplicate {
        // `classify` lets through only duplicates inside the arguments; any other is a malformed request.
        return match at.strip_prefix("/params") {
            Some(rest) if rest.starts_with("/arguments/") => {
                Ok(Some(vec![Invalid { pointer: rest.to_owned(), expected: "each key once (a duplicate key)".into() }]))
            }
            _ => Err(TransportError::Envelope(format!("the key at {} is given twice", mcp::truncate(at, 128)))),
        };
    }
    // Absent arguments are an empty object (MCP makes them optional), checked like any other.
    let empty = Value::Object(JsonObject::new());
    Ok(app.validator.check(tool, args.unwrap_or(&empty)).err())
}

/// The `isError` result of a call whose arguments do not match the tool's schema: every finding with its
/// pointer, and what to do. The values sent are not echoed.
pub(crate) fn invalid_result(tool: &str, found: &[mcpfleet_tools::validate::Invalid]) -> Value {
    let list = found.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
    let text = format!(
        "Invalid arguments for the tool {tool}: {list}. The tool did not run. Correct the arguments to match its \
         input schema and call it again."
    );
    json!({ "content": [{ "type": "text", "text": text }], "isError": true })
}

/// The `isError` result of a call a condition of the caller's plan refused: the operator's message, and that the
/// tool did not run.
pub(crate) fn policy_result(tool: &str, message: &str, trace_id: &str) -> Value {
    let text = format!(
        "Refused by policy: the call of the tool {tool} was not made. {message} Change the arguments to fit, or \
         tell the user. Trace id: {trace_id}."
    );
    json!({ "content": [{ "type": "text", "text": text }], "isError": true })
}

/// Whose quota refused a call: the principal's own, or its tenant's, which its users share.
const USER: &str = "this user";
const TENANT: &str = "this user's organization (a quota its users share)";

/// The `isError` result of a call refused by its tool's quota (`whose`: [`USER`] or [`TENANT`]): it names the tool,
/// the quota and when to come back, and tells the model to ask its user rather than retry.
pub(crate) fn quota_result(tool: &str, quota: limits::Quota, retry_after: u64, trace_id: &str, whose: &str) -> Value {
    let text = format!(
        "Quota exhausted: the tool {tool} may be called {quota} by {whose}, and that is used up. It can be \
         called again in {retry_after} s. Do not retry it before then, and do not retry blindly: tell the user, \
         and ask whether to wait or to do something else. Trace id: {trace_id}."
    );
    json!({ "content": [{ "type": "text", "text": text }], "isError": true })
}
