//! The token endpoint: the client authenticated as it registered, then an authorization code (with its PKCE
//! verifier) or a refresh token exchanged for an access token signed by the dev key, and a refresh token when the
//! grant includes `offline_access`.

use super::error::{ErrorCode, OAuthError, invalid_request};
use super::request::{content_type_is, params, pkce_value, shown};
use super::seal::{AuthMethod, CLIENT, CODE, Client, Code, REFRESH, Refresh, digest, nonce};
use super::{ACCESS_TTL, DevAuthServer, MAX_BODY_BYTES, OFFLINE_ACCESS, REFRESH_TTL};
use crate::dev::{DEV_AUDIENCE, DEV_ISSUER};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD as B64};
use http::{HeaderMap, header};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, BTreeSet};

impl DevAuthServer {
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
        let bind = dpop_key(headers, now)?;
        let answer = match p.get("grant_type").map(String::as_str) {
            Some("authorization_code") => self.exchange_code(&client_id, &p, now, bind.as_deref()),
            Some("refresh_token") => self.refresh(&client_id, &p, now, bind.as_deref()),
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
        let Some(client) = self.sealer.open::<Client>(CLIENT, &client_id) else {
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
            (AuthMethod::Post | AuthMethod::Basic, Some(s)) if self.sealer.secret_matches(&client_id, &s) => {
                Ok(client_id)
            }
            (AuthMethod::Post | AuthMethod::Basic, Some(_)) => Err(failed("client authentication failed")),
        }
    }

    fn exchange_code(
        &self,
        client_id: &str,
        p: &BTreeMap<String, String>,
        now: u64,
        bind: Option<&str>,
    ) -> Result<Value, OAuthError> {
        let grant = |d: &str| OAuthError::new(ErrorCode::InvalidGrant, d);
        let code = p.get("code").ok_or_else(|| invalid_request("code is required"))?;
        let code: Code = self.sealer.open(CODE, code).ok_or_else(|| grant("the authorization code is not valid"))?;
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
        self.issue("authorization_code", client_id, &code.u, &code.s, &code.s, &code.a, now, bind)
    }

    fn refresh(
        &self,
        client_id: &str,
        p: &BTreeMap<String, String>,
        now: u64,
        bind: Option<&str>,
    ) -> Result<Value, OAuthError> {
        let grant = |d: &str| OAuthError::new(ErrorCode::InvalidGrant, d);
        let token = p.get("refresh_token").ok_or_else(|| invalid_request("refresh_token is required"))?;
        let r: Refresh = self.sealer.open(REFRESH, token).ok_or_else(|| grant("the refresh token is not valid"))?;
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
        self.issue("refresh_token", client_id, &r.u, &scope, &r.s, &r.a, now, bind)
    }

    /// A new access token (`scope`), bound to the DPoP key `bind` when the request came with a proof (RFC 9449
    /// §5: `cnf.jkt`, `token_type` `DPoP`), and when `scope` includes [`OFFLINE_ACCESS`] a new refresh token
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
        bind: Option<&str>,
    ) -> Result<Value, OAuthError> {
        let mut claims = json!({
            "iss": DEV_ISSUER, "aud": [resource, DEV_AUDIENCE], "sub": sub, "scope": scope, "client_id": client_id,
            "iat": now, "exp": now + ACCESS_TTL.as_secs(),
        });
        if let Some(jkt) = bind {
            claims["cnf"] = json!({ "jkt": jkt });
        }
        let access = self.issuer.sign(claims).map_err(|e| {
            tracing::error!(error = %e, "dev sign-in: cannot sign an access token");
            OAuthError::new(ErrorCode::ServerError, "the access token could not be issued")
        })?;
        let mut answer = json!({
            "access_token": access,
            "token_type": if bind.is_some() { "DPoP" } else { "Bearer" },
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
            answer["refresh_token"] = json!(self.sealer.seal(REFRESH, &refresh));
        }
        tracing::info!(oauth.grant = grant, oauth.refresh_token = offline, "dev sign-in: tokens issued");
        Ok(answer)
    }
}

/// The key to bind the access token to: the thumbprint of the `DPoP` proof's key, when the token request came with
/// one (RFC 9449 §5), checked for this endpoint (`POST`, the token URL under the `Host` the client used).
fn dpop_key(headers: &HeaderMap, now: u64) -> Result<Option<String>, OAuthError> {
    let mut proofs = headers.get_all("dpop").iter();
    let proof = match (proofs.next(), proofs.next()) {
        (None, _) => return Ok(None),
        (Some(p), None) => p.to_str().map_err(|_| dpop_error("the DPoP proof is not ASCII"))?,
        (Some(_), Some(_)) => return Err(dpop_error("more than one DPoP proof header")),
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    let htu = format!("{}{}", super::issuer_url(host), super::TOKEN_PATH);
    let settings = crate::dpop::DpopSettings { max_age: DPOP_MAX_AGE, ..crate::dpop::DpopSettings::default() };
    match crate::dpop::verify_proof(proof, "POST", &htu, None, &settings, now) {
        Ok(v) => Ok(Some(v.jkt)),
        Err(crate::AuthError::InvalidProof(d)) => Err(dpop_error(d)),
        Err(_) => Err(dpop_error("the DPoP proof does not verify")),
    }
}

/// How far a token request's proof may be from the clock.
const DPOP_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// RFC 9449 §5: `invalid_dpop_proof` (400).
fn dpop_error(d: &str) -> OAuthError {
    OAuthError::new(ErrorCode::InvalidDpopProof, d)
}
