//! Safe re-issue of side-effecting calls. A `tools/call` may carry a client-chosen key in
//! `params._meta["io.mcpfleet/idempotencyKey"]`. For one (principal, tool, key), the first call runs and its
//! outcome is kept in the store for `--idempotency-ttl`; a repeat on any replica gets that outcome without running
//! the tool, and a concurrent repeat waits for the first instead of running twice. The key is bound to the
//! arguments: the same key with other arguments is refused. Works in both protocol generations.
//!
//! What is kept: the tool's own result (an `isError` result the tool returned, or a refusal it made with
//! `ToolError::Failed`, included), and "did not finish in time" for a call stopped at its timeout (its side effect
//! may be half done, so a re-issue must not run it again). What is not: an `input_required` round, a protocol
//! error, a transient failure (the store, the client, an internal error) or a cancelled call; their key is released
//! at once and a re-issue runs.

use crate::AppState;
use crate::code;
use crate::error::TransportError;
use mcpfleet_state::{Claim, ClaimSpec, IdempotencyKey, UserKey};
use mcpfleet_tools::JsonObject;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The `_meta` key of a call's idempotency key.
pub const META_KEY: &str = "io.mcpfleet/idempotencyKey";
/// Longest idempotency key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 255;
/// Largest result kept for repeats; a larger one is not kept (a repeat runs the tool again), and is logged.
pub const MAX_KEPT_BYTES: usize = 1024 * 1024;
/// How long a running call's claim lasts without renewal (renewed every third of it while the call runs).
const LEASE: Duration = Duration::from_secs(6);

/// A call's idempotency record, as the request named it, and this call's claim on it.
#[derive(Clone, Debug)]
pub(crate) struct Idempotent {
    key: IdempotencyKey,
    digest: String,
    /// This call's claim token.
    token: String,
    /// Set once the claim is completed or released by its runner (or settled by [`settle_stopped`]): a claim
    /// left unsettled when the run is dropped is released.
    settled: Arc<AtomicBool>,
}

/// The idempotency key of a `tools/call`, if it carries one.
///
/// # Errors
/// [`TransportError::InvalidMeta`] when the key is not a string of 1 to 255 visible ASCII characters.
pub(crate) fn from_params(
    user: &UserKey,
    tool: &str,
    params: &JsonObject,
    args: &JsonObject,
) -> Result<Option<Idempotent>, TransportError> {
    let Some(raw) = params.get("_meta").and_then(|m| m.get(META_KEY)) else { return Ok(None) };
    let key = raw
        .as_str()
        .filter(|k| !k.is_empty() && k.len() <= MAX_KEY_BYTES && k.bytes().all(|b| (0x21..=0x7e).contains(&b)))
        .ok_or_else(|| {
            TransportError::InvalidMeta(format!(
                "params._meta[\"{META_KEY}\"] must be a string of 1 to {MAX_KEY_BYTES} visible ASCII characters"
            ))
        })?;
    Ok(Some(Idempotent {
        key: IdempotencyKey::new(user, tool, key),
        digest: digest(tool, args),
        token: crate::random_token(),
        settled: Arc::default(),
    }))
}

/// SHA-256 (hex) of a tool name and its arguments, serialized with sorted keys: equal calls digest equally.
pub(crate) fn digest(tool: &str, args: &JsonObject) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(tool.as_bytes());
    h.update([0]);
    h.update(serde_json::to_vec(args).unwrap_or_default());
    mcpfleet_core::hex(&h.finalize())
}

/// How a call with a key went.
pub(crate) enum Ran<E> {
    /// The tool ran here (or the record refused it: the error).
    Here(Result<Value, E>),
    /// An earlier call with the same key had run; this is its result, and the tool did not run.
    Replayed(Value),
}

/// Runs `call` at most once per key: claims the record, runs and keeps the outcome, or returns the kept one. A
/// concurrent duplicate polls until the first finishes (or its claim lapses, and then runs it itself), for at most
/// `wait`. `call` says, with its result, whether that result is the tool's own outcome (kept) or a transient
/// failure (released).
pub(crate) async fn run<F, E>(app: &AppState, idem: Option<&Idempotent>, wait: Duration, call: F) -> Ran<E>
where
    F: std::future::Future<Output = (Result<Value, E>, bool)>,
    E: From<(i64, String)>,
{
    let Some(idem) = idem else { return Ran::Here(call.await.0) };
    let spec = ClaimSpec { digest: &idem.digest, token: &idem.token, lease: LEASE };
    let store = &app.store;
    let give_up = tokio::time::Instant::now() + wait;
    let mut backoff = Duration::from_millis(20);
    loop {
        match store.claim(&idem.key, &spec).await {
            Ok(Claim::Run) => break,
            Ok(Claim::Done(stored)) => {
                app.metrics.idempotent_replays.inc();
                return match serde_json::from_str(&stored) {
                    Ok(v) => Ran::Replayed(v),
                    Err(_) => Ran::Here(Err((code::INTERNAL_ERROR, "internal error".to_owned()).into())),
                };
            }
            Ok(Claim::Mismatch) => {
                let message = format!(
                    "the idempotency key in params._meta[\"{META_KEY}\"] was already used for this tool with other \
                     arguments: use a new key for a new call"
                );
                return Ran::Here(Err((code::INVALID_PARAMS, message).into()));
            }
            Ok(Claim::Running) if tokio::time::Instant::now() + backoff < give_up => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(250));
            }
            Ok(Claim::Running) => {
                let message = "a call with this idempotency key is still running: retry later with the same key";
                return Ran::Here(Err((code::INVALID_REQUEST, message.to_owned()).into()));
            }
            Err(e) => {
                // Fail closed: running a side-effecting call without its record could run it twice.
                tracing::warn!(error = %e, "idempotency record unavailable");
                return Ran::Here(Err((code::UNAVAILABLE, "service temporarily unavailable".to_owned()).into()));
            }
        }
    }
    let renewer = renew(app, idem.key.clone(), idem.token.clone());
    let _stop = renewer.drop_guard();
    // Dropped before it settles (the call was cancelled or stopped): the claim is released at once, unless the
    // stopper settled it itself.
    let _held = Held { app: app.clone(), idem: idem.clone() };
    let (result, own) = call.await;
    let keep =
        own && result.as_ref().is_ok_and(|v| v.get("resultType").and_then(Value::as_str) != Some("input_required"));
    if idem.settled.swap(true, Ordering::SeqCst) {
        return Ran::Here(result);
    }
    let stored = match &result {
        Ok(v) if keep => complete(app, idem, v).await,
        _ => store.release_claim(&idem.key, &idem.token).await.map(|()| true),
    };
    match stored {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(tool.name = %idem.key.tool, "idempotency claim lost before the call ended (its lease lapsed)")
        }
        Err(e) => tracing::warn!(error = %e, "idempotency record not updated; a repeat will run once its claim lapses"),
    }
    Ran::Here(result)
}

/// Keeps `result` for repeats (unless it is too large to keep).
async fn complete(app: &AppState, idem: &Idempotent, result: &Value) -> mcpfleet_state::Result<bool> {
    let text = result.to_string();
    if text.len() > MAX_KEPT_BYTES {
        tracing::warn!(tool.name = %idem.key.tool, bytes = text.len(), "result too large to keep for its idempotency key");
        return app.store.release_claim(&idem.key, &idem.token).await.map(|()| true);
    }
    app.store.complete_claim(&idem.key, &idem.token, &text, app.config.idempotency_ttl).await
}

/// Settles the claim of a call being stopped at its timeout: its outcome (`result`, "did not finish") is kept, so
/// that a re-issue does not run a half-done side effect again. Call it before aborting the call's task.
pub(crate) async fn settle_stopped(app: &AppState, idem: Option<&Idempotent>, result: &Value) {
    let Some(idem) = idem else { return };
    if idem.settled.swap(true, Ordering::SeqCst) {
        return;
    }
    // Not ours (the call was still waiting for another one's claim): nothing to keep.
    if let Err(e) = complete(app, idem, result).await {
        tracing::warn!(error = %e, "idempotency record of a stopped call not kept; it lapses with its lease");
    }
}

/// A claim held by a running call; released (from a task of its own) if the call is dropped before it settles.
struct Held {
    app: AppState,
    idem: Idempotent,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.idem.settled.swap(true, Ordering::SeqCst) {
            return;
        }
        let (store, key, token) = (self.app.store.clone(), self.idem.key.clone(), self.idem.token.clone());
        tokio::spawn(async move {
            if let Err(e) = store.release_claim(&key, &token).await {
                tracing::warn!(error = %e, "idempotency claim not released; it lapses with its lease");
            }
        });
    }
}

/// Renews the claim every third of its lease until the returned token is cancelled (or dropped).
fn renew(app: &AppState, key: IdempotencyKey, token: String) -> tokio_util::sync::CancellationToken {
    let stop = tokio_util::sync::CancellationToken::new();
    let (store, done) = (app.store.clone(), stop.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = done.cancelled() => return,
                () = tokio::time::sleep(LEASE / 3) => match store.renew_claim(&key, &token, LEASE).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(tool.name = %key.tool, "idempotency claim lost while the call runs (its lease lapsed)");
                        return;
                    }
                    Err(e) => tracing::warn!(error = %e, "idempotency claim renewal failed"),
                },
            }
        }
    });
    stop
}
