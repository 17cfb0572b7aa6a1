//! Safe re-issue of side-effecting calls. A `tools/call` may carry a client-chosen key in
//! `params._meta["io.mcpfleet/idempotencyKey"]`. For one (principal, tool, key), the first call runs and its
//! result is kept in the store for `--idempotency-ttl`; a repeat on any replica gets that result without running
//! the tool, and a concurrent repeat waits for the first instead of running twice. The key is bound to the
//! arguments: the same key with other arguments is refused. Works in both protocol generations.

use crate::AppState;
use crate::code;
use mcpfleet_state::{Claim, ClaimSpec, IdempotencyKey, UserKey};
use mcpfleet_tools::JsonObject;
use serde_json::Value;
use std::time::Duration;

/// The `_meta` key of a call's idempotency key.
pub const META_KEY: &str = "io.mcpfleet/idempotencyKey";
/// Longest idempotency key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 255;
/// How long a running call's claim lasts without renewal (renewed every third of it while the call runs).
const LEASE: Duration = Duration::from_secs(6);

/// A call's idempotency record, as the request named it.
#[derive(Clone, Debug)]
pub(crate) struct Idempotent {
    key: IdempotencyKey,
    digest: String,
}

/// The idempotency key of a `tools/call`, if it carries one.
///
/// # Errors
/// The message the caller reads (as `Invalid params`) when the key is not a string of 1 to 255 visible ASCII
/// characters.
pub(crate) fn from_params(
    user: &UserKey,
    tool: &str,
    params: &JsonObject,
    args: &JsonObject,
) -> Result<Option<Idempotent>, String> {
    let Some(raw) = params.get("_meta").and_then(|m| m.get(META_KEY)) else { return Ok(None) };
    let key = raw
        .as_str()
        .filter(|k| !k.is_empty() && k.len() <= MAX_KEY_BYTES && k.bytes().all(|b| (0x21..=0x7e).contains(&b)))
        .ok_or_else(|| {
            format!("params._meta[\"{META_KEY}\"] must be a string of 1 to {MAX_KEY_BYTES} visible ASCII characters")
        })?;
    Ok(Some(Idempotent { key: IdempotencyKey::new(user, tool, key), digest: digest(tool, args) }))
}

/// SHA-256 (hex) of a tool name and its arguments, serialized with sorted keys: equal calls digest equally.
pub(crate) fn digest(tool: &str, args: &JsonObject) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(tool.as_bytes());
    h.update([0]);
    h.update(serde_json::to_vec(args).unwrap_or_default());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// How a call with a key went.
pub(crate) enum Ran<E> {
    /// The tool ran here (or the record refused it: the error).
    Here(Result<Value, E>),
    /// An earlier call with the same key had run; this is its result, and the tool did not run.
    Replayed(Value),
}

/// Runs `call` at most once per key: claims the record, runs and stores the result, or returns the stored one.
/// A concurrent duplicate polls until the first finishes (or its claim lapses, and then runs it itself), for at
/// most `wait`. Only complete results are kept; an `input_required` round, a protocol error or a cancelled call
/// releases the claim so that a retry runs.
pub(crate) async fn run<F, E>(app: &AppState, idem: Option<&Idempotent>, wait: Duration, call: F) -> Ran<E>
where
    F: std::future::Future<Output = Result<Value, E>>,
    E: From<(i64, String)>,
{
    let Some(idem) = idem else { return Ran::Here(call.await) };
    let token = crate::random_token();
    let spec = ClaimSpec { digest: &idem.digest, token: &token, lease: LEASE };
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
                return Ran::Here(Err((
                    code::INVALID_PARAMS,
                    format!(
                        "the idempotency key in params._meta[\"{META_KEY}\"] was already used for this tool with other \
                         arguments: use a new key for a new call"
                    ),
                )
                    .into()));
            }
            Ok(Claim::Running) if tokio::time::Instant::now() + backoff < give_up => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(250));
            }
            Ok(Claim::Running) => {
                return Ran::Here(Err((
                    code::INVALID_REQUEST,
                    "a call with this idempotency key is still running: retry later with the same key".to_owned(),
                )
                    .into()));
            }
            Err(e) => {
                // Fail closed: running a side-effecting call without its record could run it twice.
                tracing::warn!(error = %e, "idempotency record unavailable");
                return Ran::Here(Err((code::UNAVAILABLE, "service temporarily unavailable".to_owned()).into()));
            }
        }
    }
    let renewer = renew(app, idem.key.clone(), token.clone());
    let _stop = renewer.drop_guard();
    // Dropped before it finished (the call was stopped: cancelled, or past its timeout): the claim is released at
    // once, so that a re-issue runs instead of waiting for the lease to lapse.
    let mut held = Held { app: app.clone(), key: idem.key.clone(), token: token.clone(), settled: false };
    let result = call.await;
    held.settled = true;
    let keep = match &result {
        Ok(v) => v.get("resultType").and_then(Value::as_str) != Some("input_required"),
        Err(_) => false,
    };
    let stored = match &result {
        Ok(v) if keep => store.complete_claim(&idem.key, &token, &v.to_string(), app.config.idempotency_ttl).await,
        _ => store.release_claim(&idem.key, &token).await.map(|()| true),
    };
    if let Err(e) = stored {
        tracing::warn!(error = %e, "idempotency record not updated; a repeat will run once its claim lapses");
    }
    Ran::Here(result)
}

/// A claim held by a running call; released (from a task of its own) if the call is dropped before it settles.
struct Held {
    app: AppState,
    key: IdempotencyKey,
    token: String,
    settled: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let (store, key, token) = (self.app.store.clone(), self.key.clone(), std::mem::take(&mut self.token));
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
                    Ok(false) => return,
                    Err(e) => tracing::warn!(error = %e, "idempotency claim renewal failed"),
                },
            }
        }
    });
    stop
}
