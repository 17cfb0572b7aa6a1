//! The HTTP face of the `--auth dev` sign-in ([`mcpfleet_auth::dev_oauth`], which holds the protocol): the RFC 8414
//! metadata and the registration, authorization and token endpoints. Routed only with `--auth dev`, whose listener
//! is loopback only. (The client's `Host`, which names the RFC 9728 metadata and every challenge, is kept by
//! `origin::with_host`.)
//!
//! Every endpoint passes the DNS-rebinding checks first: the `Host` must be allowed (the name becomes the issuer
//! and the resource the client reads), and the endpoints that act (`/oauth/*`) also check the `Origin`. The
//! metadata is open to any origin, like the RFC 9728 metadata; registration and token answer CORS to the allowed
//! origins (browser clients such as the Inspector sign in from their own page); the authorization endpoint is a
//! navigation and answers no CORS, and shows its refusals as a page when the browser asks for HTML.

use crate::AppState;
use crate::origin::{self, allowed_host};
use crate::well_known::{self, Refusal};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use mcpfleet_auth::dev_oauth::{self as protocol, AuthorizeOutcome, DevAuthServer, ErrorCode, OAuthError};
use mcpfleet_core::time::epoch_secs;

/// The routes of the sign-in: RFC 8414 metadata (and its OpenID twin), registration, authorization, token.
/// `register` and `token` answer CORS to the allowed origins (`origin::cors`).
pub(crate) fn routes(mut r: Router<AppState>, app: &AppState) -> Router<AppState> {
    for path in protocol::METADATA_PATHS {
        r = r.route(path, get(metadata).options(well_known::preflight));
    }
    let cors = || axum::middleware::from_fn_with_state((app.clone(), origin::CorsFor::OAuth), origin::cors);
    r.route(protocol::REGISTER_PATH, post(register).options(refused_preflight).layer(cors()))
        .route(protocol::AUTHORIZE_PATH, get(authorize))
        .route(protocol::TOKEN_PATH, post(token).options(refused_preflight).layer(cors()))
}

/// The sign-in and the client's host, after the DNS-rebinding checks (the `Origin` too when `act`).
fn site<'a>(
    app: &'a AppState,
    headers: &HeaderMap,
    act: bool,
) -> Result<(&'a DevAuthServer, String), Refusal<'static>> {
    let Some(dev) = app.config.dev_oauth.as_deref() else {
        return Err(Refusal(StatusCode::NOT_FOUND, "the dev sign-in is served with --auth dev only"));
    };
    if act && origin::check(headers, &app.config.allowed_origins, &app.config.allowed_hosts).is_err() {
        return Err(Refusal(StatusCode::FORBIDDEN, "origin or host not allowed"));
    }
    match allowed_host(headers, &app.config.allowed_hosts) {
        Some(host) => Ok((dev, host)),
        None => Err(Refusal(StatusCode::FORBIDDEN, "host not allowed")),
    }
}

/// RFC 6749 §5.2: 401 for `invalid_client` (with a Basic challenge), 500 for `server_error`, 400 otherwise.
fn oauth_error(e: &OAuthError) -> Response {
    let status = match e.code {
        ErrorCode::InvalidClient => StatusCode::UNAUTHORIZED,
        ErrorCode::ServerError => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::BAD_REQUEST,
    };
    let mut resp = (status, axum::Json(e.body())).into_response();
    if status == StatusCode::UNAUTHORIZED {
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"mcpfleet-dev\""));
    }
    resp
}

/// Codes, tokens and secrets are never cached.
fn no_store(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    resp
}

/// An `OPTIONS` that `origin::cors` did not answer: a preflight whose Origin or Host is not allowed (403), or no
/// preflight at all (405).
async fn refused_preflight(State(app): State<AppState>, headers: HeaderMap) -> Response {
    match site(&app, &headers, true) {
        Ok(_) => (StatusCode::METHOD_NOT_ALLOWED, [(header::ALLOW, HeaderValue::from_static("POST"))]).into_response(),
        Err(refused) => refused.into_response(),
    }
}

/// The body, at most [`protocol::MAX_BODY_BYTES`], within the body timeout.
async fn read(app: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, Refusal<'static>> {
    let too_large = || Refusal(StatusCode::PAYLOAD_TOO_LARGE, "the request body is larger than 16 KiB");
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > protocol::MAX_BODY_BYTES) {
        return Err(too_large());
    }
    match tokio::time::timeout(app.config.body_timeout, axum::body::to_bytes(body, protocol::MAX_BODY_BYTES)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(too_large()),
        Err(_) => Err(Refusal(StatusCode::REQUEST_TIMEOUT, "the request body did not arrive in time")),
    }
}

async fn metadata(State(app): State<AppState>, headers: HeaderMap) -> Response {
    match site(&app, &headers, false) {
        Ok((dev, host)) => well_known::public_json(dev.metadata(&host)),
        Err(refused) => refused.into_response(),
    }
}

async fn register(State(app): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let dev = match site(&app, &headers, true) {
        Ok((dev, _)) => dev,
        Err(refused) => return refused.into_response(),
    };
    let resp = match read(&app, &headers, body).await {
        Ok(body) => match dev.register(&headers, &body, epoch_secs()) {
            Ok(client) => (StatusCode::CREATED, axum::Json(client)).into_response(),
            Err(e) => oauth_error(&e),
        },
        Err(refused) => refused.into_response(),
    };
    no_store(resp)
}

async fn authorize(State(app): State<AppState>, headers: HeaderMap, uri: Uri) -> Response {
    let (dev, host) = match site(&app, &headers, true) {
        Ok(site) => site,
        Err(Refusal(status, why)) => return no_store(shown(&headers, status, &invalid_request(why))),
    };
    let resp = match dev.authorize(&host, uri.query().unwrap_or(""), epoch_secs()) {
        AuthorizeOutcome::Redirect(location) => match HeaderValue::from_str(&location) {
            Ok(location) => (StatusCode::FOUND, [(header::LOCATION, location)]).into_response(),
            Err(_) => {
                let e = invalid_request("the redirect URI cannot be sent in a Location header");
                shown(&headers, StatusCode::BAD_REQUEST, &e)
            }
        },
        AuthorizeOutcome::Refused(e) => shown(&headers, StatusCode::BAD_REQUEST, &e),
    };
    no_store(resp)
}

fn invalid_request(description: &str) -> OAuthError {
    OAuthError { code: ErrorCode::InvalidRequest, description: description.to_owned() }
}

/// A refusal of the authorization endpoint, which the browser shows to a person: a page when the request prefers
/// HTML (a navigation), the JSON body otherwise.
fn shown(headers: &HeaderMap, status: StatusCode, e: &OAuthError) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let mut resp = if protocol::prefers_html(accept) {
        let page_headers = [
            (header::CONTENT_TYPE, protocol::PAGE_CONTENT_TYPE),
            (header::CONTENT_SECURITY_POLICY, protocol::PAGE_CSP),
        ];
        (status, page_headers, e.page()).into_response()
    } else {
        (status, axum::Json(e.body())).into_response()
    };
    resp.headers_mut().append(header::VARY, HeaderValue::from_static("Accept"));
    resp
}

async fn token(State(app): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let dev = match site(&app, &headers, true) {
        Ok((dev, _)) => dev,
        Err(refused) => return refused.into_response(),
    };
    let resp = match read(&app, &headers, body).await {
        Ok(body) => match dev.token(&headers, &body, epoch_secs()) {
            Ok(tokens) => axum::Json(tokens).into_response(),
            Err(e) => oauth_error(&e),
        },
        Err(refused) => refused.into_response(),
    };
    no_store(resp)
}
