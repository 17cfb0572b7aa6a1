//! The pages of a URL-mode authorization (docs/DOWNSTREAM.md, "URL mode"), served by every replica under the
//! fleet's public origin; each step may land on any replica, because each step's state is in the store under a
//! single-use key:
//!
//! 1. `GET /downstream/start/{id}`: the URL the client showed the user. The authorization under `id` must exist
//!    (10 minutes, not used). The browser user signs in to the fleet's own issuer (with `--auth dev`, the dev
//!    sign-in, as the name typed here), with PKCE; `si.<state>` keeps the step.
//! 2. `GET /downstream/signed-in`: the fleet's sign-in answers with a code; its token is verified by the
//!    replica's own authenticator. Unless (issuer, subject) are the principal's that asked, the page refuses and
//!    nothing changes. Else the authorization is taken (single use), and the browser goes to the third party's
//!    consent (PKCE, `co.<state>`).
//! 3. `GET /downstream/callback`: the third party's code, exchanged; the grant sealed and stored for the user; a
//!    2025 session told (`notifications/elicitation/complete` on its standalone stream).
//!
//! No URL carries a credential or personal data: only single-use, unguessable ids and states. Every page is a
//! small static HTML page that loads and runs nothing.

use crate::AppState;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use mcpfleet_auth::dev_oauth::{PAGE_CONTENT_TYPE, PAGE_CSP};
use mcpfleet_core::escape_markup;
use mcpfleet_core::time::epoch_secs;
use mcpfleet_downstream::{Downstreams, Pending, pkce, random_id};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Duration;

/// How long each step's state is kept.
const STEP_TTL: Duration = Duration::from_secs(600);

/// The routes, when a URL-mode downstream is configured.
pub(crate) fn routes(r: Router<AppState>) -> Router<AppState> {
    r.route("/downstream/start/{id}", get(start))
        .route("/downstream/signed-in", get(signed_in))
        .route(mcpfleet_downstream::CALLBACK_PATH, get(callback))
}

/// A page: a status, a title and one paragraph, escaped.
fn page(status: StatusCode, title: &str, text: &str) -> Response {
    let body = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t}</title></head><body><h1>{t}</h1><p id=\"m\">{m}</p></body></html>",
        t = escape_markup(title.chars()),
        m = escape_markup(text.chars()),
    );
    html(status, body, PAGE_CSP)
}

fn html(status: StatusCode, body: String, csp: &'static str) -> Response {
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(PAGE_CONTENT_TYPE));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(csp));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    r
}

fn redirect(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn gone() -> Response {
    page(
        StatusCode::GONE,
        "This link has expired",
        "This authorization link has expired or was already used. Go back to your client and try again.",
    )
}

fn unavailable() -> Response {
    page(StatusCode::SERVICE_UNAVAILABLE, "Try again in a minute", "The service is unavailable right now.")
}

/// Why a step stops before it acts: its link is gone (expired, used, unknown), or the store did not answer.
enum Stop {
    Gone,
    Unavailable,
}

impl Stop {
    fn page(self) -> Response {
        match self {
            Self::Gone => gone(),
            Self::Unavailable => unavailable(),
        }
    }
}

/// The URL-mode downstreams, if there are any.
fn downstreams(app: &AppState) -> Option<(&Downstreams, &str)> {
    let ds = app.downstreams.as_deref()?;
    Some((ds, ds.pages_origin()?))
}

#[derive(Deserialize)]
struct StartQuery {
    login_hint: Option<String>,
}

/// Step 1: the start page. With `--auth dev` it asks for the name to sign in as, then goes to the dev sign-in.
async fn start(State(app): State<AppState>, Path(id): Path<String>, Query(q): Query<StartQuery>) -> Response {
    let Some((ds, origin)) = downstreams(&app) else { return gone() };
    match ds.pending(&id).await {
        Ok(Some(_)) => {}
        Ok(None) => return gone(),
        Err(_) => return unavailable(),
    }
    let redirect_uri = format!("{origin}/downstream/signed-in");
    let resource = app.config.protected_resource.as_ref().map(|p| p.resource.clone()).unwrap_or_default();
    if ds.has_signin() {
        // The fleet's issuer signs the user in (its own login page, its own session).
        let (verifier, challenge) = pkce();
        let state = random_id();
        let step = json!({ "id": id, "verifier": verifier }).to_string();
        if app.store.put_authorization(&format!("si.{state}"), &step, STEP_TTL).await.is_err() {
            return unavailable();
        }
        return match ds.signin_url(&redirect_uri, &state, &challenge, &resource) {
            Ok(url) => redirect(&url),
            Err(_) => unavailable(),
        };
    }
    let Some(dev) = app.config.dev_oauth.as_deref() else {
        return page(
            StatusCode::NOT_IMPLEMENTED,
            "Sign-in is not configured",
            "This server cannot sign you in to finish the authorization.",
        );
    };
    let Some(login) = q.login_hint.filter(|l| !l.is_empty()) else {
        // The dev sign-in takes the name the user types (there is no password in dev).
        let body = format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>Sign in</title></head><body><h1>Sign in to \
             continue</h1><form method=\"get\" action=\"{origin}/downstream/start/{id}\"><label>Your name \
             <input name=\"login_hint\" id=\"login\" autocomplete=\"username\"></label> <button id=\"signin\" \
             type=\"submit\">Sign in</button></form></body></html>",
            origin = escape_markup(origin.chars()),
            id = escape_markup(id.chars()),
        );
        return html(StatusCode::OK, body, DEV_FORM_CSP);
    };
    let Some(client_id) = register(dev, &redirect_uri) else { return unavailable() };
    let (verifier, challenge) = pkce();
    let state = random_id();
    let step = json!({ "id": id, "verifier": verifier, "client": client_id }).to_string();
    if app.store.put_authorization(&format!("si.{state}"), &step, STEP_TTL).await.is_err() {
        return unavailable();
    }
    let query: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs([
            ("response_type", "code"),
            ("client_id", &client_id),
            ("redirect_uri", &redirect_uri),
            ("state", &state),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
            ("resource", &resource),
            ("login_hint", &login),
        ])
        .finish();
    redirect(&format!("{origin}{}?{query}", mcpfleet_auth::dev_oauth::AUTHORIZE_PATH))
}

/// The dev form's CSP: nothing loads or runs. No `form-action`: browsers apply it to the redirects that follow the
/// submission too, and those go on to the fleet's sign-in and the third party's consent.
const DEV_FORM_CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; frame-ancestors 'none'";

/// A public client of the dev sign-in for `redirect_uri` (the registration is sealed into its id: nothing stored).
fn register(dev: &mcpfleet_auth::dev_oauth::DevAuthServer, redirect_uri: &str) -> Option<String> {
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let meta = json!({
        "redirect_uris": [redirect_uri],
        "token_endpoint_auth_method": "none",
        "client_name": "mcpfleet downstream authorization",
    });
    let reg = dev.register(&headers, meta.to_string().as_bytes(), epoch_secs()).ok()?;
    reg.get("client_id").and_then(Value::as_str).map(str::to_owned)
}

#[derive(Deserialize)]
struct CodeQuery {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

/// A step's state, taken (single use).
async fn take_step(app: &AppState, prefix: &str, state: Option<&str>) -> Result<HashMap<String, Value>, Stop> {
    let Some(state) = state.filter(|s| !s.is_empty() && s.len() <= 128) else { return Err(Stop::Gone) };
    match app.store.take_authorization(&format!("{prefix}.{state}")).await {
        Ok(Some(raw)) => serde_json::from_str(&raw).map_err(|_| Stop::Gone),
        Ok(None) => Err(Stop::Gone),
        Err(_) => Err(Stop::Unavailable),
    }
}

fn text<'a>(step: &'a HashMap<String, Value>, key: &str) -> &'a str {
    step.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// Step 2: the fleet's sign-in answered; the browser user must be the principal that asked.
async fn signed_in(State(app): State<AppState>, Query(q): Query<CodeQuery>) -> Response {
    let Some((ds, origin)) = downstreams(&app) else { return gone() };
    let step = match take_step(&app, "si", q.state.as_deref()).await {
        Ok(s) => s,
        Err(stop) => return stop.page(),
    };
    let (Some(code), None) = (q.code.as_deref(), q.error.as_deref()) else {
        return page(StatusCode::FORBIDDEN, "Not signed in", "The sign-in did not complete. Nothing was authorized.");
    };
    let id = text(&step, "id");
    let Some(principal) = sign_in(&app, ds, origin, &step, code).await else {
        return page(StatusCode::FORBIDDEN, "Not signed in", "The sign-in did not complete. Nothing was authorized.");
    };
    let pending = match ds.pending(id).await {
        Ok(Some(p)) => p,
        Ok(None) => return gone(),
        Err(_) => return unavailable(),
    };
    if principal.user.as_str() != pending.user {
        tracing::warn!(
            downstream = pending.downstream.as_str(),
            asked_by = pending.user.as_str(),
            opened_by = principal.user.as_str(),
            "an authorization link was opened by another user: refused"
        );
        return page(
            StatusCode::FORBIDDEN,
            "This link is not yours",
            "You are signed in as a different user than the one who asked for this authorization. Nothing was \
             authorized.",
        );
    }
    let pending = match ds.take_pending(id).await {
        Ok(Some(p)) => p,
        Ok(None) => return gone(),
        Err(_) => return unavailable(),
    };
    let (verifier, challenge) = pkce();
    let state = random_id();
    let step = json!({ "pending": pending, "verifier": verifier, "id": id }).to_string();
    if app.store.put_authorization(&format!("co.{state}"), &step, STEP_TTL).await.is_err() {
        return unavailable();
    }
    match ds.consent_url(&pending.downstream, &state, &challenge) {
        Ok(url) => redirect(&url),
        Err(_) => gone(),
    }
}

/// The fleet's sign-in code, exchanged and verified by this replica's authenticator: who the browser user is.
async fn sign_in(
    app: &AppState,
    ds: &Downstreams,
    origin: &str,
    step: &HashMap<String, Value>,
    code: &str,
) -> Option<mcpfleet_core::Principal> {
    let resource = app.config.protected_resource.as_ref().map(|p| p.resource.clone()).unwrap_or_default();
    let redirect_uri = format!("{origin}/downstream/signed-in");
    let token = if ds.has_signin() {
        match ds.signin_token(code, text(step, "verifier"), &redirect_uri, &resource).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "the fleet's sign-in code was not exchanged");
                return None;
            }
        }
    } else {
        dev_token(app, step, code, &redirect_uri, &resource)?
    };
    let (parts, ()) = axum::http::Request::builder()
        .uri("/downstream/signed-in")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(())
        .ok()?
        .into_parts();
    app.auth.authenticate(&parts).await.ok()
}

/// The dev sign-in's code, exchanged in process.
fn dev_token(
    app: &AppState,
    step: &HashMap<String, Value>,
    code: &str,
    redirect_uri: &str,
    resource: &str,
) -> Option<String> {
    let dev = app.config.dev_oauth.as_deref()?;
    let body: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs([
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect_uri),
            ("code_verifier", text(step, "verifier")),
            ("client_id", text(step, "client")),
            ("resource", resource),
        ])
        .finish();
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-www-form-urlencoded"));
    let answer = dev.token(&headers, body.as_bytes(), epoch_secs()).ok()?;
    answer.get("access_token").and_then(Value::as_str).map(str::to_owned)
}

/// Step 3: the third party's answer; the grant stored for the user who asked, and their session told.
async fn callback(State(app): State<AppState>, Query(q): Query<CodeQuery>) -> Response {
    let Some((ds, _)) = downstreams(&app) else { return gone() };
    let step = match take_step(&app, "co", q.state.as_deref()).await {
        Ok(s) => s,
        Err(stop) => return stop.page(),
    };
    let Some(pending) = step.get("pending").cloned().and_then(|p| serde_json::from_value::<Pending>(p).ok()) else {
        return gone();
    };
    let name = pending.downstream.clone();
    let Some(code) = q.code.as_deref().filter(|_| q.error.is_none()) else {
        return page(
            StatusCode::OK,
            "Not authorized",
            &format!("Access to {name} was not given. You can close this window."),
        );
    };
    let trace_id = mcpfleet_core::hex(&rand::random::<[u8; 16]>());
    if let Err(e) = ds.complete(&pending, code, text(&step, "verifier"), &trace_id).await {
        tracing::warn!(downstream = name.as_str(), error = %e, trace_id, "the third party's code was not exchanged");
        return page(
            StatusCode::BAD_GATEWAY,
            "Not connected",
            &format!("{name} did not confirm the authorization. Go back to your client and try again."),
        );
    }
    notify_session(&app, &pending, text(&step, "id")).await;
    page(
        StatusCode::OK,
        "Connected",
        &format!("{name} is connected. You can close this window and go back to your client."),
    )
}

/// `notifications/elicitation/complete` on the asking 2025 session's standalone stream, wherever it is held.
async fn notify_session(app: &AppState, pending: &Pending, elicitation_id: &str) {
    let (Some(user), Some(id)) = (
        mcpfleet_core::UserKey::new(&pending.user),
        pending.session.as_deref().and_then(mcpfleet_state::SessionId::parse),
    ) else {
        return;
    };
    let key = mcpfleet_state::SessionKey { user, id };
    let msg =
        crate::jsonrpc::notification("notifications/elicitation/complete", json!({ "elicitationId": elicitation_id }))
            .to_string();
    let opts = mcpfleet_state::AppendOptions::default();
    if let Err(e) = app.store.append(&key, mcpfleet_state::STANDALONE_STREAM, &msg, &opts).await {
        tracing::info!(error = %e, "the session was not told the authorization completed");
    }
}
