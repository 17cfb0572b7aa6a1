//! The authorization endpoint, approved at once: the client and its redirect URI checked, then a code (PKCE
//! S256, the RFC 8707 resource, the scope) sealed and sent back to the redirect URI with the RFC 9207 `iss`.

use super::error::{AuthorizeOutcome, ErrorCode, OAuthError, invalid_request};
use super::request::{host_port, loopback_url, params, pkce_value, shown, subject, with_query};
use super::seal::{CLIENT, CODE, Client, Code, digest, nonce};
use super::{CODE_TTL, DevAuthServer, OFFLINE_ACCESS, issuer_url};
use std::collections::{BTreeMap, BTreeSet};

impl DevAuthServer {
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
        let Some(client) = self.sealer.open::<Client>(CLIENT, client_id) else {
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
        Ok(self.sealer.seal(CODE, &code))
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
}
