//! The sign-in of `--auth dev`: a minimal OAuth 2.1 authorization server, so that real MCP clients (the official
//! SDKs, the Inspector) can sign in to a dev server on loopback without an IdP.
//!
//! - RFC 8414 metadata ([`DevAuthServer::metadata`]) and RFC 9728 protected-resource metadata
//!   ([`DevAuthServer::protected_resource`]), both derived from the `Host` the client used, so that a client that
//!   connected to `localhost` reads `localhost` and one that connected to `127.0.0.1` reads `127.0.0.1`;
//! - dynamic client registration (RFC 7591, [`DevAuthServer::register`]) of loopback redirect URIs only;
//! - the authorization code grant with PKCE S256 only ([`DevAuthServer::authorize`]), approved at once (there is
//!   no user to ask: the subject is `login_hint`, or `dev`), with the RFC 9207 `iss` parameter;
//! - the token endpoint ([`DevAuthServer::token`]): `authorization_code` and `refresh_token`, RFC 8707
//!   `resource`, client authentication `none`, `client_secret_post` or `client_secret_basic`;
//! - a refresh token only for a grant that includes [`OFFLINE_ACCESS`], as production authorization servers do
//!   (OIDC Core §11): a client that did not ask for one re-authorizes when it needs more, which is how the
//!   1.x SDKs step up to a tool's scope (a refresh cannot widen a grant).
//!
//! It is stateless, because the replicas of a dev fleet share nothing but the dev key file: a client id carries
//! its registration (redirect URIs, authentication method), an authorization code and a refresh token carry
//! their grant, each MACed (HMAC-SHA256, 128-bit tags) under a key derived from the dev key with a label of its
//! own, and a client secret is a MAC of its client id. The price: a code cannot be strictly single-use across
//! replicas (it lives 60 s and is useless without the PKCE verifier), and a refresh token cannot be revoked (it
//! lives 7 days; rotating the dev key file revokes everything).
//!
//! Access tokens are signed by the dev key exactly like [`DevIssuer::mint`]'s (`typ: at+jwt`, EdDSA,
//! `iss: urn:mcpfleet:dev`), with `aud` = [the RFC 8707 resource, `urn:mcpfleet:dev`], so the dev verifier
//! accepts them next to the tokens of `mcpfleet token`.
//!
//! This module speaks the protocol only: the transport checks the `Host` and `Origin`, bounds and reads the
//! bodies, and turns an [`OAuthError`] into a status (401 for `invalid_client`, 400 otherwise).

use crate::ProtectedResource;
use crate::dev::{DEV_AUDIENCE, DEV_ISSUER, DevIssuer};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD as B64};
use hmac::Mac as _;
use http::{HeaderMap, header};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

type HmacSha256 = hmac::Hmac<Sha256>;

/// Where the authorization endpoint is served.
pub const AUTHORIZE_PATH: &str = "/oauth/authorize";
/// Where the token endpoint is served.
pub const TOKEN_PATH: &str = "/oauth/token";
/// Where the registration endpoint is served.
pub const REGISTER_PATH: &str = "/oauth/register";
/// Where the RFC 8414 metadata is served (the second path is the OpenID discovery one, which some clients try).
pub const METADATA_PATHS: [&str; 2] = ["/.well-known/oauth-authorization-server", "/.well-known/openid-configuration"];
/// Where the dev issuer's JWKS is served.
pub const JWKS_PATH: &str = "/.well-known/jwks.json";

/// Largest registration or token request body.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// How long an authorization code is valid.
pub const CODE_TTL: Duration = Duration::from_secs(60);
/// How long an access token is valid.
pub const ACCESS_TTL: Duration = Duration::from_secs(3600);
/// How long a refresh token is valid.
pub const REFRESH_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// The scope that asks for a refresh token (OIDC Core §11). The authorization server lists it in its metadata and
/// grants it; it is not a resource scope, so the protected-resource metadata never names it and no tool needs it.
pub const OFFLINE_ACCESS: &str = "offline_access";

/// Most redirect URIs one client may register.
const MAX_REDIRECT_URIS: usize = 8;
/// Longest redirect URI.
const MAX_REDIRECT_URI_BYTES: usize = 512;
/// Longest client id: the verifier accepts a `client_id` claim of at most 1024 bytes.
const MAX_CLIENT_ID_BYTES: usize = 1000;
/// Longest `login_hint` taken as the subject.
const MAX_SUBJECT_BYTES: usize = 64;
/// The subject when the client gives no usable `login_hint`.
const DEFAULT_SUBJECT: &str = "dev";

/// The labels of the three signed blobs: each is part of what its MAC covers, so one kind never passes for another.
const CLIENT: &str = "mcpdev-c1";
const CODE: &str = "mcpdev-ac1";
const REFRESH: &str = "mcpdev-rt1";
const SECRET: &str = "mcpdev-cs1";

/// An error code of RFC 6749 §4.1.2.1 and §5.2, RFC 7591 §3.2.2 and RFC 8707 §2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    InvalidRequest,
    /// Client authentication failed (the transport answers 401).
    InvalidClient,
    InvalidGrant,
    UnsupportedGrantType,
    UnsupportedResponseType,
    InvalidScope,
    /// RFC 8707: the `resource` is not this server.
    InvalidTarget,
    /// RFC 7591.
    InvalidRedirectUri,
    /// RFC 7591.
    InvalidClientMetadata,
    /// The token could not be signed (the transport answers 500).
    ServerError,
}

impl ErrorCode {
    /// The code as the protocol spells it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::InvalidClient => "invalid_client",
            Self::InvalidGrant => "invalid_grant",
            Self::UnsupportedGrantType => "unsupported_grant_type",
            Self::UnsupportedResponseType => "unsupported_response_type",
            Self::InvalidScope => "invalid_scope",
            Self::InvalidTarget => "invalid_target",
            Self::InvalidRedirectUri => "invalid_redirect_uri",
            Self::InvalidClientMetadata => "invalid_client_metadata",
            Self::ServerError => "server_error",
        }
    }
}

/// What an endpoint of the dev sign-in tells a client it refused: an OAuth error response, not a failure of this
/// crate. The description is safe to show: it names parameters, never echoes a code, a token or a secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {description}", code.as_str())]
pub struct OAuthError {
    pub code: ErrorCode,
    pub description: String,
}

impl OAuthError {
    fn new(code: ErrorCode, description: impl Into<String>) -> Self {
        Self { code, description: description.into() }
    }

    /// The JSON body: `{"error": ..., "error_description": ...}`.
    #[must_use]
    pub fn body(&self) -> Value {
        json!({ "error": self.code.as_str(), "error_description": self.description })
    }
}

fn invalid_request(description: impl Into<String>) -> OAuthError {
    OAuthError::new(ErrorCode::InvalidRequest, description)
}

/// The answer of the authorization endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthorizeOutcome {
    /// Send the user agent here (302): the client's redirect URI with `code`, `state` and `iss`, or with `error`,
    /// `error_description`, `state` and `iss` (RFC 6749 §4.1.2.1).
    Redirect(String),
    /// The client or its redirect URI could not be trusted, so nothing is sent back to it: show this (400).
    Refused(OAuthError),
}

/// How a client authenticates at the token endpoint (RFC 7591 `token_endpoint_auth_method`). A client with a
/// secret may use either secret method, whichever it registered: the TypeScript SDK picks one from the server's
/// metadata, not from its registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum AuthMethod {
    #[serde(rename = "none")]
    None,
    #[serde(rename = "client_secret_post")]
    Post,
    #[serde(rename = "client_secret_basic")]
    Basic,
}

impl AuthMethod {
    fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(Value::String(s.to_owned())).ok()
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Post => "client_secret_post",
            Self::Basic => "client_secret_basic",
        }
    }
}

/// What a client id carries: its registration.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Client {
    /// The token endpoint authentication method.
    m: AuthMethod,
    /// The redirect URIs, as registered.
    r: Vec<String>,
    /// A nonce: two registrations of the same URIs are two clients.
    n: String,
}

/// What an authorization code carries.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Code {
    /// Digest of the client id.
    c: String,
    /// Digest of the redirect URI.
    r: String,
    /// Whether the authorization request named the redirect URI (then the token request must name it too).
    x: bool,
    /// The PKCE S256 challenge.
    p: String,
    /// The granted scope, space-separated.
    s: String,
    /// The resource (RFC 8707).
    a: String,
    /// The subject.
    u: String,
    /// Expiry, Unix seconds.
    e: u64,
    /// A nonce, so that no two codes are alike.
    n: String,
}

/// What a refresh token carries.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Refresh {
    /// Digest of the client id.
    c: String,
    /// The granted scope, space-separated.
    s: String,
    /// The resource (RFC 8707).
    a: String,
    /// The subject.
    u: String,
    /// Expiry, Unix seconds.
    e: u64,
    /// A nonce, so that no two refresh tokens are alike.
    n: String,
}

/// The authorization server of `--auth dev`. Every replica that shares the dev key file builds the same one.
#[derive(Clone)]
pub struct DevAuthServer {
    issuer: DevIssuer,
    mac: HmacSha256,
    scopes_supported: Vec<String>,
    required_scopes: Vec<String>,
}

impl std::fmt::Debug for DevAuthServer {
    // Never print the MAC key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevAuthServer").field("scopes_supported", &self.scopes_supported).finish_non_exhaustive()
    }
}

/// Now, in Unix seconds.
#[must_use]
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `http://<host>`: the issuer identifier of the dev sign-in as a client that used `host` sees it.
#[must_use]
pub fn issuer_url(host: &str) -> String {
    format!("http://{host}")
}

/// Whether `host` (as in a URL, IPv6 in brackets) is a loopback name: `localhost`, `127.0.0.1` or `[::1]`.
fn loopback(host: &str) -> bool {
    ["localhost", "127.0.0.1", "[::1]"].iter().any(|l| host.eq_ignore_ascii_case(l))
}

/// The port of a `Host` value (80 when it names none).
fn host_port(host: &str) -> Option<u16> {
    let after_name = match host.strip_prefix('[') {
        Some(v6) => v6.split_once(']')?.1,
        None => host.find(':').map_or("", |i| &host[i..]),
    };
    match after_name.strip_prefix(':') {
        Some(port) => port.parse().ok(),
        None if after_name.is_empty() => Some(80),
        None => None,
    }
}

/// An absolute `http`/`https` URL on a loopback host, without user info or fragment.
fn loopback_url(raw: &str) -> Option<http::Uri> {
    if raw.contains('#') {
        return None;
    }
    let uri: http::Uri = raw.parse().ok()?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    let authority = uri.authority()?;
    (scheme_ok && !authority.as_str().contains('@') && loopback(authority.host())).then_some(uri)
}

/// RFC 7636 §4.1: 43 to 128 characters of `[A-Za-z0-9-._~]`.
fn pkce_value(s: &str) -> bool {
    (43..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
}

/// `login_hint` as a subject: `[A-Za-z0-9._@-]{1,64}`.
fn subject(hint: Option<&str>) -> &str {
    match hint {
        Some(h)
            if !h.is_empty()
                && h.len() <= MAX_SUBJECT_BYTES
                && h.bytes().all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b)) =>
        {
            h
        }
        _ => DEFAULT_SUBJECT,
    }
}

/// A short, stable digest of a client id or a redirect URI, to bind a code or a refresh token to it.
fn digest(s: &str) -> String {
    B64.encode(&Sha256::digest(s.as_bytes())[..16])
}

fn nonce() -> String {
    let n: [u8; 12] = rand::random();
    B64.encode(n)
}

/// A name from the client, cut for an error description.
fn shown(s: &str) -> String {
    s.chars().take(64).collect()
}

/// The parameters of a query string or a form body. A parameter without a value counts as absent, and one
/// given twice is refused (RFC 6749 §3.1, §3.2).
fn params(raw: &[u8]) -> Result<BTreeMap<String, String>, OAuthError> {
    let mut map = BTreeMap::new();
    for (name, value) in form_urlencoded::parse(raw) {
        if value.is_empty() {
            continue;
        }
        if map.insert(name.to_string(), value.into_owned()).is_some() {
            return Err(invalid_request(format!("the parameter {} is given more than once", shown(&name))));
        }
    }
    Ok(map)
}

/// `uri` with `pairs` appended to its query (absent values are left out).
fn with_query(uri: &str, pairs: &[(&str, Option<&str>)]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        if let Some(v) = value {
            query.append_pair(name, v);
        }
    }
    let sep = if uri.contains('?') { '&' } else { '?' };
    format!("{uri}{sep}{}", query.finish())
}

/// Whether the single `Content-Type` is `expected` (parameters such as `charset` ignored).
fn content_type_is(headers: &HeaderMap, expected: &str) -> bool {
    let mut all = headers.get_all(header::CONTENT_TYPE).iter();
    match (all.next(), all.next()) {
        (Some(v), None) => v
            .to_str()
            .is_ok_and(|v| v.split(';').next().is_some_and(|essence| essence.trim().eq_ignore_ascii_case(expected))),
        _ => false,
    }
}

impl DevAuthServer {
    /// The sign-in of `issuer`'s key for the resource described by `resource` (its scopes; the URLs come from
    /// each request's `Host`).
    #[must_use]
    pub fn new(issuer: &DevIssuer, resource: &ProtectedResource) -> Self {
        // HMAC pads a short key with zeros to the block size (64 bytes): this is HMAC under the 32-byte key.
        let mut key = [0u8; 64];
        key[..32].copy_from_slice(issuer.oauth_key());
        let mac = <HmacSha256 as hmac::KeyInit>::new(&key.into());
        Self {
            issuer: issuer.clone(),
            mac,
            scopes_supported: resource.scopes_supported.clone(),
            required_scopes: resource.required_scopes.clone(),
        }
    }

    /// The RFC 9728 metadata as a client that used `host` sees it: `resource` `http://<host>/mcp`, and this
    /// server (`http://<host>`) as the authorization server.
    #[must_use]
    pub fn protected_resource(&self, host: &str) -> ProtectedResource {
        ProtectedResource {
            resource: format!("http://{host}/mcp"),
            authorization_servers: vec![issuer_url(host)],
            scopes_supported: self.scopes_supported.clone(),
            required_scopes: self.required_scopes.clone(),
        }
    }

    /// The RFC 8414 metadata as a client that used `host` sees it.
    #[must_use]
    pub fn metadata(&self, host: &str) -> Value {
        let issuer = issuer_url(host);
        json!({
            "issuer": issuer,
            "authorization_endpoint": format!("{issuer}{AUTHORIZE_PATH}"),
            "token_endpoint": format!("{issuer}{TOKEN_PATH}"),
            "registration_endpoint": format!("{issuer}{REGISTER_PATH}"),
            "jwks_uri": format!("{issuer}{JWKS_PATH}"),
            "scopes_supported": self.grantable_scopes(),
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none", "client_secret_post", "client_secret_basic"],
            "authorization_response_iss_parameter_supported": true,
        })
    }

    /// What the authorization endpoint grants: the resource's scopes, then [`OFFLINE_ACCESS`].
    fn grantable_scopes(&self) -> Vec<&str> {
        let mut scopes: Vec<&str> = self.scopes_supported.iter().map(String::as_str).collect();
        if !scopes.contains(&OFFLINE_ACCESS) {
            scopes.push(OFFLINE_ACCESS);
        }
        scopes
    }

    fn mac(&self, kind: &str, payload: &str) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(kind.as_bytes());
        mac.update(b"\0");
        mac.update(payload.as_bytes());
        mac
    }

    /// `<kind>.<base64url(JSON)>.<base64url(128-bit tag)>`.
    fn seal<T: Serialize>(&self, kind: &str, claims: &T) -> String {
        let payload = B64.encode(serde_json::to_vec(claims).unwrap_or_default());
        let tag = self.mac(kind, &payload).finalize().into_bytes();
        format!("{kind}.{payload}.{}", B64.encode(&tag[..16]))
    }

    /// The claims of a blob of `kind` whose tag checks out.
    fn open<T: DeserializeOwned>(&self, kind: &str, blob: &str) -> Option<T> {
        let (payload, tag) = blob.strip_prefix(kind)?.strip_prefix('.')?.split_once('.')?;
        let tag = B64.decode(tag).ok().filter(|t| t.len() == 16)?;
        self.mac(kind, payload).verify_truncated_left(&tag).ok()?;
        serde_json::from_slice(&B64.decode(payload).ok()?).ok()
    }

    fn client_secret(&self, client_id: &str) -> String {
        B64.encode(self.mac(SECRET, client_id).finalize().into_bytes())
    }

    fn secret_matches(&self, client_id: &str, secret: &str) -> bool {
        B64.decode(secret).is_ok_and(|s| self.mac(SECRET, client_id).verify_slice(&s).is_ok())
    }

    /// Dynamic client registration (RFC 7591): `body` is the client metadata (JSON). The answer (201) echoes it
    /// with `client_id`, and `client_secret` (`client_secret_expires_at: 0`) unless the method is `none`.
    ///
    /// # Errors
    /// `invalid_redirect_uri`: no redirect URIs, more than 8, one longer than 512 bytes, one that is not an
    /// `http`/`https` URL on `localhost`, `127.0.0.1` or `[::1]`, or too many bytes together.
    /// `invalid_client_metadata`: not a JSON object, or an authentication method, grant type or response type
    /// this server does not support.
    pub fn register(&self, headers: &HeaderMap, body: &[u8], now: u64) -> Result<Value, OAuthError> {
        let bad_meta = |d: &str| OAuthError::new(ErrorCode::InvalidClientMetadata, d);
        let bad_uri = |d: String| OAuthError::new(ErrorCode::InvalidRedirectUri, d);
        if !content_type_is(headers, "application/json") {
            return Err(bad_meta("the registration must be sent as Content-Type: application/json"));
        }
        if body.len() > MAX_BODY_BYTES {
            return Err(bad_meta("the registration is larger than 16 KiB"));
        }
        let Ok(Value::Object(mut meta)) = serde_json::from_slice::<Value>(body) else {
            return Err(bad_meta("the registration must be a JSON object"));
        };
        let uris: Vec<String> = match meta.get("redirect_uris") {
            Some(Value::Array(a)) if !a.is_empty() => a
                .iter()
                .map(|u| u.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| bad_uri("redirect_uris must be a list of strings".to_owned()))?,
            _ => return Err(bad_uri("redirect_uris is required: a list of loopback http(s) URLs".to_owned())),
        };
        if uris.len() > MAX_REDIRECT_URIS {
            return Err(bad_uri(format!("at most {MAX_REDIRECT_URIS} redirect URIs may be registered")));
        }
        for u in &uris {
            if u.len() > MAX_REDIRECT_URI_BYTES {
                return Err(bad_uri(format!("a redirect URI is longer than {MAX_REDIRECT_URI_BYTES} bytes")));
            }
            if loopback_url(u).is_none() {
                return Err(bad_uri(format!(
                    "redirect URI {:?} is refused: the dev sign-in redirects only to http(s) URLs on localhost, \
                     127.0.0.1 or [::1], without a fragment",
                    shown(u)
                )));
            }
        }
        let method = match meta.get("token_endpoint_auth_method") {
            None | Some(Value::Null) => AuthMethod::Basic, // RFC 7591 §2
            Some(Value::String(m)) => AuthMethod::parse(m).ok_or_else(|| {
                bad_meta("token_endpoint_auth_method must be none, client_secret_post or client_secret_basic")
            })?,
            Some(_) => return Err(bad_meta("token_endpoint_auth_method must be a string")),
        };
        let listed = |name: &str, allowed: &[&str], required: &str| -> Result<Value, OAuthError> {
            match meta.get(name) {
                None | Some(Value::Null) => Ok(json!(allowed)),
                Some(Value::Array(a))
                    if a.iter().all(|v| v.as_str().is_some_and(|s| allowed.contains(&s)))
                        && a.iter().any(|v| v == required) =>
                {
                    Ok(Value::Array(a.clone()))
                }
                Some(_) => {
                    Err(bad_meta(&format!("{name} may list only {} and must include {required}", allowed.join(", "))))
                }
            }
        };
        let grant_types = listed("grant_types", &["authorization_code", "refresh_token"], "authorization_code")?;
        let response_types = listed("response_types", &["code"], "code")?;
        let client_id = self.seal(CLIENT, &Client { m: method, r: uris.clone(), n: nonce() });
        if client_id.len() > MAX_CLIENT_ID_BYTES {
            return Err(bad_uri("the redirect URIs are too long together".to_owned()));
        }
        for gone in
            ["client_secret", "client_secret_expires_at", "registration_access_token", "registration_client_uri"]
        {
            meta.remove(gone);
        }
        if method != AuthMethod::None {
            meta.insert("client_secret".to_owned(), json!(self.client_secret(&client_id)));
            meta.insert("client_secret_expires_at".to_owned(), json!(0));
        }
        meta.insert("client_id".to_owned(), json!(client_id));
        meta.insert("client_id_issued_at".to_owned(), json!(now));
        meta.insert("redirect_uris".to_owned(), json!(uris));
        meta.insert("token_endpoint_auth_method".to_owned(), json!(method.as_str()));
        meta.insert("grant_types".to_owned(), grant_types);
        meta.insert("response_types".to_owned(), response_types);
        tracing::info!(
            oauth.method = method.as_str(),
            oauth.redirect_uris = uris.len(),
            "dev sign-in: client registered"
        );
        Ok(Value::Object(meta))
    }

    /// The authorization endpoint (`GET`, `query` is the request's query string), approved at once: checks the
    /// client, its redirect URI, `response_type=code`, PKCE S256, `resource` and `scope`, and answers with a
    /// redirect carrying a code valid for 60 s. The subject is `login_hint` when it is `[A-Za-z0-9._@-]{1,64}`,
    /// else `dev`.
    #[must_use]
    pub fn authorize(&self, host: &str, query: &str, now: u64) -> AuthorizeOutcome {
        let p = match params(query.as_bytes()) {
            Ok(p) => p,
            Err(e) => return AuthorizeOutcome::Refused(e),
        };
        // Until the client and its redirect URI check out, nothing goes back to a redirect URI.
        let Some(client_id) = p.get("client_id") else {
            return AuthorizeOutcome::Refused(invalid_request("client_id is required"));
        };
        let Some(client) = self.open::<Client>(CLIENT, client_id) else {
            return AuthorizeOutcome::Refused(OAuthError::new(
                ErrorCode::InvalidClient,
                "unknown client_id: register the client first (POST /oauth/register)",
            ));
        };
        let (redirect, explicit) = match p.get("redirect_uri") {
            Some(r) if client.r.contains(r) => (r.as_str(), true),
            Some(_) => {
                return AuthorizeOutcome::Refused(invalid_request("redirect_uri is not one the client registered"));
            }
            None => match client.r.as_slice() {
                [only] => (only.as_str(), false),
                _ => {
                    return AuthorizeOutcome::Refused(invalid_request(
                        "redirect_uri is required: the client registered more than one",
                    ));
                }
            },
        };
        let state = p.get("state").map(String::as_str);
        let iss = issuer_url(host);
        match self.grant_code(host, client_id, redirect, explicit, &p, now) {
            Ok(code) => AuthorizeOutcome::Redirect(with_query(
                redirect,
                &[("code", Some(&code)), ("state", state), ("iss", Some(&iss))],
            )),
            Err(e) => {
                tracing::debug!(oauth.error = e.code.as_str(), reason = %e.description, "dev sign-in: authorization refused");
                AuthorizeOutcome::Redirect(with_query(
                    redirect,
                    &[
                        ("error", Some(e.code.as_str())),
                        ("error_description", Some(&e.description)),
                        ("state", state),
                        ("iss", Some(&iss)),
                    ],
                ))
            }
        }
    }

    fn grant_code(
        &self,
        host: &str,
        client_id: &str,
        redirect: &str,
        explicit: bool,
        p: &BTreeMap<String, String>,
        now: u64,
    ) -> Result<String, OAuthError> {
        match p.get("response_type").map(String::as_str) {
            Some("code") => {}
            Some(_) => {
                return Err(OAuthError::new(ErrorCode::UnsupportedResponseType, "response_type must be code"));
            }
            None => return Err(invalid_request("response_type is required (code)")),
        }
        match p.get("code_challenge_method").map(String::as_str) {
            Some("S256") => {}
            Some(_) => return Err(invalid_request("code_challenge_method must be S256")),
            None => {
                return Err(invalid_request("PKCE is required: send code_challenge and code_challenge_method=S256"));
            }
        }
        let challenge = match p.get("code_challenge") {
            Some(c) if pkce_value(c) => c,
            Some(_) => return Err(invalid_request("code_challenge must be 43 to 128 characters of [A-Za-z0-9-._~]")),
            None => {
                return Err(invalid_request("PKCE is required: send code_challenge and code_challenge_method=S256"));
            }
        };
        let resource = match p.get("resource") {
            Some(r) => self.check_resource(host, r)?,
            None => format!("http://{host}/mcp"),
        };
        let scope = self.requested_scope(p.get("scope").map(String::as_str))?;
        let code = Code {
            c: digest(client_id),
            r: digest(redirect),
            x: explicit,
            p: challenge.clone(),
            s: scope,
            a: resource,
            u: subject(p.get("login_hint").map(String::as_str)).to_owned(),
            e: now + CODE_TTL.as_secs(),
            n: nonce(),
        };
        Ok(self.seal(CODE, &code))
    }

    /// RFC 8707: the resource must be this server's `/mcp`, spelled with any loopback name and the port of the
    /// `Host` the client used.
    fn check_resource(&self, host: &str, resource: &str) -> Result<String, OAuthError> {
        let refused = || {
            OAuthError::new(
                ErrorCode::InvalidTarget,
                format!("resource must be this server's MCP endpoint, http://{host}/mcp"),
            )
        };
        let uri = loopback_url(resource).ok_or_else(refused)?;
        let same_port = uri.port_u16().unwrap_or(80) == host_port(host).unwrap_or(80);
        let ok = uri.scheme_str() == Some("http") && same_port && uri.path() == "/mcp" && uri.query().is_none();
        if ok { Ok(resource.to_owned()) } else { Err(refused()) }
    }

    /// The scopes asked for (each one this server grants), sorted. When they name no resource scope (none at
    /// all, or [`OFFLINE_ACCESS`] alone), the endpoint's scopes come with them.
    fn requested_scope(&self, scope: Option<&str>) -> Result<String, OAuthError> {
        let grantable = self.grantable_scopes();
        let mut asked: BTreeSet<&str> = scope.map(|s| s.split_whitespace().collect()).unwrap_or_default();
        if let Some(unknown) = asked.iter().find(|s| !grantable.contains(s)) {
            return Err(OAuthError::new(
                ErrorCode::InvalidScope,
                format!("unknown scope {:?}: this server knows {}", shown(unknown), grantable.join(" ")),
            ));
        }
        if asked.iter().all(|s| *s == OFFLINE_ACCESS) {
            asked.extend(self.required_scopes.iter().map(String::as_str));
        }
        Ok(asked.into_iter().collect::<Vec<_>>().join(" "))
    }

    /// The token endpoint (`POST`, form-encoded): `grant_type=authorization_code` (`code`, `redirect_uri`,
    /// `code_verifier`) or `grant_type=refresh_token` (`refresh_token`, optional narrower `scope`), with the
    /// client authenticated as it registered (`client_id` alone, `client_secret` in the body, or HTTP Basic),
    /// and an optional `resource` (which must be the one of the grant). The answer carries a new access token,
    /// and a new refresh token when the access token's scope includes [`OFFLINE_ACCESS`] (a refresh that narrows
    /// the scope without it gets none, and the client keeps the refresh token it has).
    ///
    /// # Errors
    /// `invalid_client` (401): an unknown client id, a missing or wrong secret, a secret for a client registered
    /// without one. `invalid_grant`: a code or refresh token that is forged, expired, or another client's, or
    /// a wrong PKCE verifier or redirect URI. `invalid_scope`, `invalid_target`, `unsupported_grant_type`,
    /// `invalid_request` (a missing or repeated parameter, a body that is not form-encoded). `server_error`:
    /// the access token could not be signed.
    pub fn token(&self, headers: &HeaderMap, body: &[u8], now: u64) -> Result<Value, OAuthError> {
        if !content_type_is(headers, "application/x-www-form-urlencoded") {
            return Err(invalid_request("the token request must be application/x-www-form-urlencoded"));
        }
        if body.len() > MAX_BODY_BYTES {
            return Err(invalid_request("the token request is larger than 16 KiB"));
        }
        let p = params(body)?;
        let client_id = self.authenticate_client(headers, &p)?;
        let answer = match p.get("grant_type").map(String::as_str) {
            Some("authorization_code") => self.exchange_code(&client_id, &p, now),
            Some("refresh_token") => self.refresh(&client_id, &p, now),
            Some(_) => Err(OAuthError::new(
                ErrorCode::UnsupportedGrantType,
                "grant_type must be authorization_code or refresh_token",
            )),
            None => Err(invalid_request("grant_type is required")),
        };
        if let Err(e) = &answer {
            tracing::debug!(oauth.error = e.code.as_str(), reason = %e.description, "dev sign-in: token refused");
        }
        answer
    }

    /// The client id, once the client has authenticated as it registered.
    fn authenticate_client(&self, headers: &HeaderMap, p: &BTreeMap<String, String>) -> Result<String, OAuthError> {
        let failed = |d: &str| OAuthError::new(ErrorCode::InvalidClient, d);
        let mut auth = headers.get_all(header::AUTHORIZATION).iter();
        let (client_id, secret) = match (auth.next(), auth.next()) {
            (Some(_), Some(_)) => return Err(invalid_request("the Authorization header is given more than once")),
            (Some(v), None) => {
                let basic = v
                    .to_str()
                    .ok()
                    .and_then(|v| v.split_once(' '))
                    .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
                    .and_then(|(_, b64)| STANDARD.decode(b64.trim()).ok())
                    .and_then(|raw| String::from_utf8(raw).ok());
                let Some(basic) = basic else {
                    return Err(failed("the Authorization header must be HTTP Basic with the client id and secret"));
                };
                let Some((id, secret)) = basic.split_once(':') else {
                    return Err(failed("the Authorization header must be HTTP Basic with the client id and secret"));
                };
                if p.contains_key("client_secret") {
                    return Err(invalid_request(
                        "use one client authentication method, not both Basic and client_secret",
                    ));
                }
                if p.get("client_id").is_some_and(|c| c != id) {
                    return Err(invalid_request("client_id differs from the one in the Authorization header"));
                }
                (id.to_owned(), Some(secret.to_owned()))
            }
            (None, _) => match p.get("client_id") {
                Some(id) => (id.clone(), p.get("client_secret").cloned()),
                None => return Err(invalid_request("client_id is required")),
            },
        };
        let Some(client) = self.open::<Client>(CLIENT, &client_id) else {
            return Err(failed("unknown client_id: register the client first (POST /oauth/register)"));
        };
        match (client.m, secret) {
            (AuthMethod::None, None) => Ok(client_id),
            (AuthMethod::None, Some(_)) => {
                Err(failed("this client registered token_endpoint_auth_method none: it has no secret to send"))
            }
            (AuthMethod::Post | AuthMethod::Basic, None) => {
                Err(failed("this client must authenticate with its client_secret (in the body or with HTTP Basic)"))
            }
            (AuthMethod::Post | AuthMethod::Basic, Some(s)) if self.secret_matches(&client_id, &s) => Ok(client_id),
            (AuthMethod::Post | AuthMethod::Basic, Some(_)) => Err(failed("client authentication failed")),
        }
    }

    fn exchange_code(&self, client_id: &str, p: &BTreeMap<String, String>, now: u64) -> Result<Value, OAuthError> {
        let grant = |d: &str| OAuthError::new(ErrorCode::InvalidGrant, d);
        let code = p.get("code").ok_or_else(|| invalid_request("code is required"))?;
        let code: Code = self.open(CODE, code).ok_or_else(|| grant("the authorization code is not valid"))?;
        if code.e <= now {
            return Err(grant("the authorization code has expired: codes live 60 s"));
        }
        if code.c != digest(client_id) {
            return Err(grant("the authorization code was issued to another client"));
        }
        match p.get("redirect_uri") {
            Some(r) if digest(r) == code.r => {}
            Some(_) => return Err(grant("redirect_uri differs from the one of the authorization request")),
            None if code.x => {
                return Err(invalid_request("redirect_uri is required: the authorization request named one"));
            }
            None => {}
        }
        let verifier = p.get("code_verifier").ok_or_else(|| invalid_request("code_verifier is required (PKCE)"))?;
        if !pkce_value(verifier) {
            return Err(invalid_request("code_verifier must be 43 to 128 characters of [A-Za-z0-9-._~]"));
        }
        if B64.encode(Sha256::digest(verifier.as_bytes())) != code.p {
            return Err(grant("code_verifier does not match the code_challenge"));
        }
        if p.get("resource").is_some_and(|r| *r != code.a) {
            return Err(OAuthError::new(ErrorCode::InvalidTarget, "resource differs from the authorization request's"));
        }
        self.issue("authorization_code", client_id, &code.u, &code.s, &code.s, &code.a, now)
    }

    fn refresh(&self, client_id: &str, p: &BTreeMap<String, String>, now: u64) -> Result<Value, OAuthError> {
        let grant = |d: &str| OAuthError::new(ErrorCode::InvalidGrant, d);
        let token = p.get("refresh_token").ok_or_else(|| invalid_request("refresh_token is required"))?;
        let r: Refresh = self.open(REFRESH, token).ok_or_else(|| grant("the refresh token is not valid"))?;
        if r.e <= now {
            return Err(grant("the refresh token has expired"));
        }
        if r.c != digest(client_id) {
            return Err(grant("the refresh token was issued to another client"));
        }
        let granted: BTreeSet<&str> = r.s.split_whitespace().collect();
        let scope = match p.get("scope").map(|s| s.split_whitespace().collect::<BTreeSet<&str>>()) {
            Some(asked) if !asked.is_empty() => {
                if let Some(extra) = asked.iter().find(|s| !granted.contains(*s)) {
                    return Err(OAuthError::new(
                        ErrorCode::InvalidScope,
                        format!("scope {:?} was not granted to this refresh token", shown(extra)),
                    ));
                }
                asked.into_iter().collect::<Vec<_>>().join(" ")
            }
            _ => r.s.clone(),
        };
        if p.get("resource").is_some_and(|a| *a != r.a) {
            return Err(OAuthError::new(
                ErrorCode::InvalidTarget,
                "resource differs from the one this refresh token is for",
            ));
        }
        self.issue("refresh_token", client_id, &r.u, &scope, &r.s, &r.a, now)
    }

    /// A new access token (`scope`), and when `scope` includes [`OFFLINE_ACCESS`] a new refresh token
    /// (`refresh_scope`, the whole original grant: RFC 6749 §6 keeps a new refresh token's scope identical).
    #[expect(clippy::too_many_arguments, reason = "the claims of one grant, named at the two call sites")]
    fn issue(
        &self,
        grant: &str,
        client_id: &str,
        sub: &str,
        scope: &str,
        refresh_scope: &str,
        resource: &str,
        now: u64,
    ) -> Result<Value, OAuthError> {
        let claims = json!({
            "iss": DEV_ISSUER, "aud": [resource, DEV_AUDIENCE], "sub": sub, "scope": scope, "client_id": client_id,
            "iat": now, "exp": now + ACCESS_TTL.as_secs(),
        });
        let access = self.issuer.sign(claims).map_err(|e| {
            tracing::error!(error = %e, "dev sign-in: cannot sign an access token");
            OAuthError::new(ErrorCode::ServerError, "the access token could not be issued")
        })?;
        let mut answer = json!({
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": ACCESS_TTL.as_secs(),
            "scope": scope,
        });
        let offline = scope.split_whitespace().any(|s| s == OFFLINE_ACCESS);
        if offline {
            let refresh = Refresh {
                c: digest(client_id),
                s: refresh_scope.to_owned(),
                a: resource.to_owned(),
                u: sub.to_owned(),
                e: now + REFRESH_TTL.as_secs(),
                n: nonce(),
            };
            answer["refresh_token"] = json!(self.seal(REFRESH, &refresh));
        }
        tracing::info!(oauth.grant = grant, oauth.refresh_token = offline, "dev sign-in: tokens issued");
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{JwtAuthenticator, KeySource};
    use std::sync::Arc;

    const HOST: &str = "localhost:8123";
    const REDIRECT: &str = "http://127.0.0.1:9000/callback";
    const VERIFIER: &str = "dBjftJeZ4CVP-mJ92K27uhbUJU1p1r-wW1gFWFOEjXk";
    const CHALLENGE: &str = "6Y3vkOgSwz2skbRkaUT_UFe6JaIeTED0E2ZNnarAPDM";

    fn server() -> (DevAuthServer, DevIssuer) {
        let issuer = DevIssuer::from_seed([7; 32]);
        let pr = ProtectedResource {
            resource: "http://127.0.0.1:8123/mcp".to_owned(),
            authorization_servers: vec![],
            scopes_supported: vec!["fixtures:whoami".to_owned(), "mcp:access".to_owned()],
            required_scopes: vec!["mcp:access".to_owned()],
        };
        (DevAuthServer::new(&issuer, &pr), issuer)
    }

    fn headers(content_type: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, content_type.parse().unwrap());
        h
    }

    fn register(s: &DevAuthServer, meta: Value) -> Result<Value, OAuthError> {
        s.register(&headers("application/json"), meta.to_string().as_bytes(), unix_now())
    }

    fn public_client(s: &DevAuthServer) -> String {
        let r = register(s, json!({ "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none" })).unwrap();
        assert!(r.get("client_secret").is_none());
        r["client_id"].as_str().unwrap().to_owned()
    }

    fn query(pairs: &[(&str, &str)]) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        for (k, v) in pairs {
            q.append_pair(k, v);
        }
        q.finish()
    }

    fn redirect_params(outcome: AuthorizeOutcome) -> BTreeMap<String, String> {
        let AuthorizeOutcome::Redirect(loc) = outcome else { panic!("not a redirect: {outcome:?}") };
        let (base, q) = loc.split_once('?').unwrap();
        assert_eq!(base, REDIRECT);
        params(q.as_bytes()).unwrap()
    }

    fn code_for(s: &DevAuthServer, client_id: &str, extra: &[(&str, &str)], now: u64) -> String {
        let mut pairs = vec![
            ("response_type", "code"),
            ("client_id", client_id),
            ("redirect_uri", REDIRECT),
            ("code_challenge", CHALLENGE),
            ("code_challenge_method", "S256"),
            ("state", "xyz"),
        ];
        pairs.extend_from_slice(extra);
        let p = redirect_params(s.authorize(HOST, &query(&pairs), now));
        assert_eq!(p["state"], "xyz");
        assert_eq!(p["iss"], "http://localhost:8123");
        p.get("code").unwrap_or_else(|| panic!("no code: {p:?}")).clone()
    }

    fn token(s: &DevAuthServer, pairs: &[(&str, &str)]) -> Result<Value, OAuthError> {
        s.token(&headers("application/x-www-form-urlencoded"), query(pairs).as_bytes(), unix_now())
    }

    fn exchange(s: &DevAuthServer, client_id: &str, code: &str, verifier: &str) -> Result<Value, OAuthError> {
        token(
            s,
            &[
                ("grant_type", "authorization_code"),
                ("code", code),
                ("redirect_uri", REDIRECT),
                ("client_id", client_id),
                ("code_verifier", verifier),
            ],
        )
    }

    #[tokio::test]
    async fn the_code_flow_issues_tokens_the_dev_verifier_accepts() {
        let (s, issuer) = server();
        let client_id = public_client(&s);
        let code = code_for(&s, &client_id, &[("login_hint", "alice@example.com")], unix_now());
        let t = exchange(&s, &client_id, &code, VERIFIER).unwrap();
        assert_eq!(t["token_type"], "Bearer");
        assert_eq!(t["scope"], "mcp:access");
        let v = JwtAuthenticator::new(DevIssuer::settings(vec![]), KeySource::Static(Arc::new(issuer.key_set())));
        let p = v.verify(t["access_token"].as_str().unwrap()).await.unwrap();
        assert_eq!(p.subject, "alice@example.com");
        assert_eq!(p.client_id.as_deref(), Some(client_id.as_str()));
        assert!(p.scopes.allow(&["mcp:access"]) && !p.scopes.allow(&["fixtures:whoami"]));
        // No offline_access, no refresh token.
        assert!(t.get("refresh_token").is_none(), "{t}");
    }

    #[tokio::test]
    async fn offline_access_brings_a_refresh_token_that_keeps_the_grant() {
        let (s, issuer) = server();
        let client_id = public_client(&s);
        let code = code_for(&s, &client_id, &[("scope", "offline_access mcp:access fixtures:whoami")], unix_now());
        let t = exchange(&s, &client_id, &code, VERIFIER).unwrap();
        assert_eq!(t["scope"], "fixtures:whoami mcp:access offline_access");
        let v = JwtAuthenticator::new(DevIssuer::settings(vec![]), KeySource::Static(Arc::new(issuer.key_set())));
        let p = v.verify(t["access_token"].as_str().unwrap()).await.unwrap();
        assert!(p.scopes.allow(&["fixtures:whoami", "mcp:access", "offline_access"]));
        let rt = t["refresh_token"].as_str().unwrap();
        let refresh = |rt: &str, scope: Option<&str>| {
            let mut pairs = vec![("grant_type", "refresh_token"), ("refresh_token", rt), ("client_id", &client_id)];
            pairs.extend(scope.map(|scope| ("scope", scope)));
            token(&s, &pairs)
        };

        // The whole grant again, with a new refresh token.
        let r = refresh(rt, None).unwrap();
        assert_eq!(r["scope"], "fixtures:whoami mcp:access offline_access");
        assert!(r["refresh_token"].is_string() && r["refresh_token"] != t["refresh_token"], "{r}");
        // Narrower but offline: a new refresh token, which still carries the whole grant (RFC 6749 §6).
        let narrow = refresh(rt, Some("mcp:access offline_access")).unwrap();
        assert_eq!(narrow["scope"], "mcp:access offline_access");
        let again = refresh(narrow["refresh_token"].as_str().unwrap(), None).unwrap();
        assert_eq!(again["scope"], "fixtures:whoami mcp:access offline_access");
        // Narrower without offline_access: an access token only; the client keeps the refresh token it has.
        let online = refresh(rt, Some("mcp:access")).unwrap();
        assert_eq!(online["scope"], "mcp:access");
        assert!(online.get("refresh_token").is_none(), "{online}");
        assert!(refresh(rt, None).is_ok());

        // offline_access alone asks for the endpoint's scopes too; a refresh never widens the grant.
        let code = code_for(&s, &client_id, &[("scope", "offline_access")], unix_now());
        let t = exchange(&s, &client_id, &code, VERIFIER).unwrap();
        assert_eq!(t["scope"], "mcp:access offline_access");
        assert!(t["refresh_token"].is_string(), "{t}");
        let r = refresh(t["refresh_token"].as_str().unwrap(), Some("fixtures:whoami"));
        assert_eq!(r.unwrap_err().code, ErrorCode::InvalidScope);
    }

    #[test]
    fn pkce_is_required_and_checked() {
        let (s, _) = server();
        let client_id = public_client(&s);
        let code = code_for(&s, &client_id, &[], unix_now());
        let wrong = "x".repeat(43);
        assert_eq!(exchange(&s, &client_id, &code, &wrong).unwrap_err().code, ErrorCode::InvalidGrant);
        assert_eq!(exchange(&s, &client_id, &code, "short").unwrap_err().code, ErrorCode::InvalidRequest);
        for method in ["plain", ""] {
            let q = query(&[
                ("response_type", "code"),
                ("client_id", &client_id),
                ("code_challenge", CHALLENGE),
                ("code_challenge_method", method),
                ("state", "s1"),
            ]);
            let p = redirect_params(s.authorize(HOST, &q, unix_now()));
            assert_eq!(p["error"], "invalid_request", "{method}: {p:?}");
            assert_eq!(p["state"], "s1");
        }
    }

    #[test]
    fn codes_expire_and_cannot_be_forged_or_moved() {
        let (s, _) = server();
        let client_id = public_client(&s);
        let old = code_for(&s, &client_id, &[], unix_now() - 61);
        let e = exchange(&s, &client_id, &old, VERIFIER).unwrap_err();
        assert_eq!((e.code, e.description.contains("expired")), (ErrorCode::InvalidGrant, true));
        let code = code_for(&s, &client_id, &[], unix_now());
        let mut tampered = code.clone().into_bytes();
        let i = tampered.len() - 30;
        tampered[i] = if tampered[i] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).unwrap();
        assert_eq!(exchange(&s, &client_id, &tampered, VERIFIER).unwrap_err().code, ErrorCode::InvalidGrant);
        // A code is not a refresh token, and a client id is not a code.
        let as_refresh =
            token(&s, &[("grant_type", "refresh_token"), ("refresh_token", &code), ("client_id", &client_id)]);
        assert_eq!(as_refresh.unwrap_err().code, ErrorCode::InvalidGrant);
        assert_eq!(exchange(&s, &client_id, &client_id, VERIFIER).unwrap_err().code, ErrorCode::InvalidGrant);
        // Another client cannot redeem it.
        let other = public_client(&s);
        assert_eq!(exchange(&s, &other, &code, VERIFIER).unwrap_err().code, ErrorCode::InvalidGrant);
        // Another key does not know it.
        let stranger = DevAuthServer::new(&DevIssuer::from_seed([8; 32]), &s.protected_resource(HOST));
        assert_eq!(exchange(&stranger, &client_id, &code, VERIFIER).unwrap_err().code, ErrorCode::InvalidClient);
    }

    #[test]
    fn registration_accepts_loopback_redirects_only() {
        let (s, _) = server();
        for bad in [
            json!({}),
            json!({ "redirect_uris": [] }),
            json!({ "redirect_uris": ["https://evil.example/cb"] }),
            json!({ "redirect_uris": ["http://localhost.evil.example/cb"] }),
            json!({ "redirect_uris": ["http://user@localhost/cb"] }),
            json!({ "redirect_uris": ["http://localhost/cb#frag"] }),
            json!({ "redirect_uris": ["myapp://callback"] }),
            json!({ "redirect_uris": ["http://127.0.0.2/cb"] }),
            json!({ "redirect_uris": vec!["http://localhost/cb"; 9] }),
            json!({ "redirect_uris": [format!("http://localhost/{}", "a".repeat(600))] }),
            json!({ "redirect_uris": vec![format!("http://localhost/{}", "a".repeat(400)); 4] }),
        ] {
            assert_eq!(register(&s, bad.clone()).unwrap_err().code, ErrorCode::InvalidRedirectUri, "{bad}");
        }
        for bad in [
            json!({ "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "private_key_jwt" }),
            json!({ "redirect_uris": [REDIRECT], "grant_types": ["client_credentials"] }),
            json!({ "redirect_uris": [REDIRECT], "response_types": ["token"] }),
        ] {
            assert_eq!(register(&s, bad.clone()).unwrap_err().code, ErrorCode::InvalidClientMetadata, "{bad}");
        }
        let ok = register(
            &s,
            json!({ "redirect_uris": ["http://localhost:3000/cb", "https://[::1]/cb?x=1"], "client_name": "t",
                    "client_secret": "mine" }),
        )
        .unwrap();
        assert_eq!(ok["token_endpoint_auth_method"], "client_secret_basic");
        assert_eq!(ok["client_name"], "t");
        assert_ne!(ok["client_secret"], "mine");
        assert_eq!(ok["client_secret_expires_at"], 0);
        let wrong_type = s.register(&headers("text/plain"), b"{}", 0).unwrap_err();
        assert_eq!(wrong_type.code, ErrorCode::InvalidClientMetadata);
    }

    #[test]
    fn confidential_clients_authenticate_with_their_secret() {
        let (s, _) = server();
        let r =
            register(&s, json!({ "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "client_secret_post" }))
                .unwrap();
        let (id, secret) = (r["client_id"].as_str().unwrap(), r["client_secret"].as_str().unwrap());
        let code = code_for(&s, id, &[], unix_now());
        let form = |secret: &str| {
            query(&[
                ("grant_type", "authorization_code"),
                ("code", &code),
                ("redirect_uri", REDIRECT),
                ("client_id", id),
                ("client_secret", secret),
                ("code_verifier", VERIFIER),
            ])
        };
        let h = headers("application/x-www-form-urlencoded");
        let wrong = s.token(&h, form("wrong").as_bytes(), unix_now()).unwrap_err();
        assert_eq!(wrong.code, ErrorCode::InvalidClient);
        let missing = exchange(&s, id, &code, VERIFIER).unwrap_err();
        assert_eq!(missing.code, ErrorCode::InvalidClient);
        assert!(s.token(&h, form(secret).as_bytes(), unix_now()).is_ok());
        // The same client with HTTP Basic (the TypeScript SDK prefers it when it has a secret).
        let mut basic = h.clone();
        let creds = STANDARD.encode(format!("{id}:{secret}"));
        basic.insert(header::AUTHORIZATION, format!("Basic {creds}").parse().unwrap());
        let body = query(&[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("redirect_uri", REDIRECT),
            ("code_verifier", VERIFIER),
        ]);
        assert!(s.token(&basic, body.as_bytes(), unix_now()).is_ok());
        // A public client cannot send a secret.
        let public = public_client(&s);
        let e = token(&s, &[("grant_type", "refresh_token"), ("client_id", &public), ("client_secret", secret)]);
        assert_eq!(e.unwrap_err().code, ErrorCode::InvalidClient);
    }

    #[test]
    fn resource_and_scope_are_checked() {
        let (s, _) = server();
        let client_id = public_client(&s);
        let ask = |extra: &[(&str, &str)]| {
            let mut pairs = vec![
                ("response_type", "code"),
                ("client_id", client_id.as_str()),
                ("code_challenge", CHALLENGE),
                ("code_challenge_method", "S256"),
            ];
            pairs.extend_from_slice(extra);
            redirect_params(s.authorize(HOST, &query(&pairs), unix_now()))
        };
        for good in ["http://localhost:8123/mcp", "http://127.0.0.1:8123/mcp", "http://[::1]:8123/mcp"] {
            assert!(ask(&[("resource", good)]).contains_key("code"), "{good}");
        }
        for bad in [
            "http://localhost:8124/mcp",
            "http://localhost:8123/other",
            "https://localhost:8123/mcp",
            "http://evil.example:8123/mcp",
            "urn:mcpfleet:dev",
        ] {
            assert_eq!(ask(&[("resource", bad)])["error"], "invalid_target", "{bad}");
        }
        assert_eq!(ask(&[("scope", "mcp:access admin")])["error"], "invalid_scope");
        assert!(ask(&[("scope", "offline_access")]).contains_key("code"));
        let code = ask(&[("scope", "fixtures:whoami mcp:access")])["code"].clone();
        let t = exchange(&s, &client_id, &code, VERIFIER).unwrap();
        assert_eq!(t["scope"], "fixtures:whoami mcp:access");
        let token_type = query(&[
            ("response_type", "token"),
            ("client_id", client_id.as_str()),
            ("code_challenge", CHALLENGE),
            ("code_challenge_method", "S256"),
        ]);
        assert_eq!(redirect_params(s.authorize(HOST, &token_type, unix_now()))["error"], "unsupported_response_type");
    }

    #[test]
    fn untrusted_clients_and_redirects_get_a_page_not_a_redirect() {
        let (s, _) = server();
        let client_id = public_client(&s);
        let page = |q: &str| match s.authorize(HOST, q, unix_now()) {
            AuthorizeOutcome::Refused(e) => e,
            AuthorizeOutcome::Redirect(loc) => panic!("redirected to {loc}"),
        };
        assert_eq!(page("response_type=code").code, ErrorCode::InvalidRequest);
        assert_eq!(page("client_id=mcpdev-c1.e30.AAAAAAAAAAAAAAAAAAAAAA").code, ErrorCode::InvalidClient);
        let other = query(&[("client_id", &client_id), ("redirect_uri", "http://127.0.0.1:9001/callback")]);
        assert_eq!(page(&other).code, ErrorCode::InvalidRequest);
        let twice = query(&[("client_id", &client_id), ("client_id", &client_id)]);
        assert_eq!(page(&twice).code, ErrorCode::InvalidRequest);
    }

    #[test]
    fn host_ports_and_metadata_follow_the_host() {
        assert_eq!(host_port("localhost:8123"), Some(8123));
        assert_eq!(host_port("[::1]:8123"), Some(8123));
        assert_eq!(host_port("127.0.0.1"), Some(80));
        assert_eq!(host_port("[::1]"), Some(80));
        assert_eq!(host_port("localhost:x"), None);
        let (s, _) = server();
        let m = s.metadata("127.0.0.1:8123");
        assert_eq!(m["issuer"], "http://127.0.0.1:8123");
        assert_eq!(m["token_endpoint"], "http://127.0.0.1:8123/oauth/token");
        // offline_access is the authorization server's, not the resource's.
        assert_eq!(m["scopes_supported"], json!(["fixtures:whoami", "mcp:access", "offline_access"]));
        let pr = s.protected_resource("localhost:8123");
        assert_eq!(pr.scopes_supported, ["fixtures:whoami", "mcp:access"]);
        assert_eq!(pr.resource, "http://localhost:8123/mcp");
        assert_eq!(pr.metadata_url(), "http://localhost:8123/.well-known/oauth-protected-resource/mcp");
    }
}
