//! The input requests of one stateless request, round by round (multi round-trip requests, MRTR): the answers it
//! carries (a retry's `requestState` must verify, see [`super::mrtr`]), what this round asks for, and how the round
//! ends (an `InputRequiredResult` with a sealed state, a refusal for a capability the client lacks, or the
//! handler's own outcome).

use super::meta::Meta;
use super::mrtr::{RequestState, StateRefusal};
use crate::error::TransportError;
use crate::input;
use crate::request::{Post, Result};
use crate::{AppState, Principal};
use mcpfleet_tools::{JsonObject, ToolError};
use serde_json::{Value, json};

/// The input requests of this round (MRTR), and the capabilities they needed that the client lacks.
#[derive(Default)]
pub(super) struct Round {
    pub(super) asked: Vec<(String, Value)>,
    pub(super) missing: Vec<String>,
    /// The keys whose answers the handler read: only these ride in the next state.
    used: Vec<String>,
    /// How many input requests of each kind the tool made so far: the keys are `<kind>-<n>`, stable across rounds.
    counts: std::collections::HashMap<&'static str, u32>,
    /// The call is becoming a task (tasks extension): no more rounds; input is asked through the task.
    pub(super) task: bool,
}

/// Where an input request goes.
pub(super) enum Asking {
    /// Answered from the request (or refused) here.
    Done(std::result::Result<Value, ToolError>),
    /// Through the task the call became; the request's params, handed back.
    Task(Value),
}

/// The input requests (MRTR) of one request: the answers it carries, and what this round asks for.
pub(super) struct Inputs {
    pub(super) meta: Meta,
    /// Answers by input request key: the earlier rounds' (from the state) and this retry's.
    answers: JsonObject,
    round: std::sync::Mutex<Round>,
    /// The method and the digest of the salient parameters, which the state is bound to.
    method: &'static str,
    digest: String,
}

impl Inputs {
    pub(super) fn new(answers: JsonObject, meta: Meta, method: &'static str, digest: String) -> Self {
        Self { meta, answers, round: std::sync::Mutex::default(), method, digest }
    }

    pub(super) fn round(&self) -> std::sync::MutexGuard<'_, Round> {
        self.round.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The answer under `key`, if the request carries it; else the request joins this round's `inputRequests`
    /// and the handler is told to stop (it runs again, from the start, on the retry).
    pub(super) fn ask(&self, key: &str, method: &str, params: Value) -> Asking {
        let Some(kind) = input::kind(method) else {
            return Asking::Done(Err(ToolError::ClientUnsupported("requests")));
        };
        if let Some(answer) = self.answers.get(key) {
            self.round().used.push(key.to_owned());
            return Asking::Done(input::answer_value(key, answer));
        }
        let mut round = self.round();
        if round.task {
            // The call is becoming (or became) a task: input goes through it.
            return Asking::Task(params);
        }
        if self.meta.capabilities.get(kind).is_none() {
            round.missing.push(kind.to_owned());
            return Asking::Done(Err(ToolError::ClientUnsupported(kind)));
        }
        round.asked.push((key.to_owned(), json!({ "method": method, "params": params })));
        Asking::Done(Err(ToolError::Cancelled))
    }

    /// A key for an input request the handler did not name: `<kind>-<n>`, stable across rounds.
    pub(super) fn auto_key(&self, method: &str) -> String {
        let kind = input::kind(method).unwrap_or("request");
        let mut round = self.round();
        let n = round.counts.entry(kind).or_insert(0);
        *n += 1;
        format!("{kind}-{n}")
    }

    /// How this round ends regardless of what the handler returned: an `InputRequiredResult` when it asked for
    /// input it does not have yet, a refusal when it needs a capability the client lacks; `None` when its own
    /// outcome stands.
    pub(super) fn decide(
        &self,
        app: &AppState,
        principal: &Principal,
        r: &std::result::Result<Value, ToolError>,
    ) -> Option<std::result::Result<Value, TransportError>> {
        let round = std::mem::take(&mut *self.round());
        if let Err(ToolError::ClientUnsupported(cap)) = r
            && input::is_capability(cap)
        {
            return Some(Err(TransportError::MissingCapability(vec![(*cap).to_owned()])));
        }
        if !round.missing.is_empty() {
            return Some(Err(TransportError::MissingCapability(round.missing)));
        }
        if round.asked.is_empty() {
            return None;
        }
        let mut state = RequestState::new(principal.user.as_str(), self.method, &self.digest);
        // Only the answers the handler used: whatever else the client sent does not grow the state.
        state.a = round.used.iter().filter_map(|k| Some((k.clone(), self.answers.get(k)?.clone()))).collect();
        state.q = round.asked.iter().map(|(k, _)| k.clone()).collect();
        let requests: JsonObject = round.asked.into_iter().collect();
        Some(Ok(json!({
            "resultType": "input_required",
            "inputRequests": requests,
            "requestState": app.config.request_state.seal(state),
        })))
    }
}

impl Post<'_> {
    /// The answers a request carries for its input requests. A retry with a `requestState` must verify it for
    /// this caller, method and parameters; its earlier answers come from the state, and only the keys that state
    /// asked for are taken from `inputResponses`. A request without a state may carry answers too (they are the
    /// client's own words either way; the tool validates them).
    pub(super) fn input_answers(&mut self, method: &str, digest: &str, params: &JsonObject) -> Result<JsonObject> {
        let app = self.app;
        let responses = match params.get("inputResponses") {
            None => None,
            Some(Value::Object(r)) => Some(r),
            Some(_) => return Err(TransportError::InvalidMeta("params.inputResponses must be an object".into())),
        };
        let token = match params.get("requestState") {
            None => return Ok(responses.cloned().unwrap_or_default()),
            Some(Value::String(t)) => t,
            Some(_) => return Err(TransportError::InvalidMeta(StateRefusal::Malformed.message().to_owned())),
        };
        let state = match app.config.request_state.open(token, self.asker.caller.user.as_str(), method, digest) {
            Ok(s) => s,
            Err(refusal) => {
                app.metrics.request_state_refusals.with_label_values(&[refusal.label()]).inc();
                self.span.error = Some("request_state".to_owned());
                return Err(TransportError::InvalidMeta(refusal.message().to_owned()));
            }
        };
        let mut answers = state.a;
        for k in &state.q {
            if let Some(v) = responses.and_then(|r| r.get(k)) {
                answers.insert(k.clone(), v.clone());
            }
        }
        Ok(answers)
    }
}
