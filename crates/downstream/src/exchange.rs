//! Token requests to a token endpoint: RFC 8693 token exchange (the caller's token as `subject_token`, optionally
//! the server's own client-credentials token as `actor_token`) and the client-credentials grant that gets that
//! actor token. Every answer is checked before it is used: a 200 must carry a Bearer `access_token`, a positive
//! `expires_in` and (for an exchange) the `issued_token_type` asked for; an OAuth error that is about the user
//! (`invalid_grant`, `invalid_target`, `invalid_scope`, `access_denied`) is a refusal, anything else (our own
//! client refused, 5xx, 429, a timeout) is the authorization server being unavailable. No token, secret or
//! assertion is ever logged or put in an error.

use crate::OAuthError;
use crate::client::Client;
use mcpfleet_tools::downstream::DownstreamToken;
use serde::Deserialize;
use std::time::Duration;

pub(crate) const GRANT_TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
pub(crate) const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";

/// The largest token response read.
const MAX_RESPONSE: usize = 64 * 1024;
/// The largest token accepted.
const MAX_TOKEN: usize = 16 * 1024;
/// The lifetime of a token whose response gives no `expires_in` (RFC 6749 makes it optional).
pub(crate) const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);

/// A token the endpoint issued.
#[derive(Debug)]
pub(crate) struct Issued {
    pub(crate) token: DownstreamToken,
    pub(crate) lifetime: Duration,
    /// A refresh token, when the grant has one (authorization code and refresh grants).
    pub(crate) refresh: Option<String>,
}

/// One token request: the grant's form, the client authentication, the checks on the answer.
pub(crate) struct TokenRequest<'a> {
    pub(crate) http: &'a reqwest::Client,
    pub(crate) endpoint: &'a str,
    pub(crate) client: &'a Client,
    pub(crate) timeout: Duration,
    /// The `issued_token_type` the answer must carry (token exchange only).
    pub(crate) issued_type: Option<&'a str>,
}

#[derive(Deserialize)]
struct Success {
    access_token: Option<String>,
    token_type: Option<String>,
    expires_in: Option<serde_json::Value>,
    issued_token_type: Option<String>,
    refresh_token: Option<String>,
}

#[derive(Deserialize)]
struct Failure {
    error: Option<String>,
}

/// The OAuth error codes that are about the user or the request's target, not about our client or the server.
const ABOUT_THE_USER: [&str; 4] = ["invalid_grant", "invalid_target", "invalid_scope", "access_denied"];

impl TokenRequest<'_> {
    pub(crate) async fn send(&self, mut form: Vec<(&'static str, String)>) -> Result<Issued, OAuthError> {
        let request =
            self.http.post(self.endpoint).timeout(self.timeout).header(reqwest::header::ACCEPT, "application/json");
        let request = self.client.authenticate(request, &mut form, self.endpoint)?;
        let body: String = form_urlencoded::Serializer::new(String::new()).extend_pairs(form.iter()).finish();
        let response = request
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .map_err(|e| OAuthError::Unreachable(without_url(&e)))?;
        let status = response.status().as_u16();
        let bytes = read_capped(response, MAX_RESPONSE).await?;
        match status {
            200 => self.check(&bytes),
            400 | 401 | 403 => {
                let code = serde_json::from_slice::<Failure>(&bytes).ok().and_then(|f| f.error).unwrap_or_default();
                let code: String = code.chars().filter(|c| c.is_ascii_graphic()).take(64).collect();
                if ABOUT_THE_USER.contains(&code.as_str()) {
                    Err(OAuthError::Refused(code))
                } else if code.is_empty() {
                    Err(OAuthError::Status(status))
                } else {
                    Err(OAuthError::Response(format!("{status} {code}")))
                }
            }
            other => Err(OAuthError::Status(other)),
        }
    }

    fn check(&self, bytes: &[u8]) -> Result<Issued, OAuthError> {
        let bad = |why: &str| OAuthError::Response(why.to_owned());
        let s: Success = serde_json::from_slice(bytes).map_err(|_| bad("not a JSON object"))?;
        let token = s.access_token.filter(|t| !t.is_empty()).ok_or_else(|| bad("no access_token"))?;
        if token.len() > MAX_TOKEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad("the access_token is not a token this server can send"));
        }
        if !s.token_type.is_some_and(|t| t.eq_ignore_ascii_case("bearer")) {
            return Err(bad("token_type is not Bearer"));
        }
        if let Some(wanted) = self.issued_type
            && s.issued_token_type.as_deref() != Some(wanted)
        {
            return Err(bad("issued_token_type is not the type asked for"));
        }
        let lifetime = match s.expires_in {
            None => DEFAULT_LIFETIME,
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Duration::from_secs(n.min(7 * 24 * 3600)),
                _ => return Err(bad("expires_in is not a positive integer")),
            },
        };
        let refresh = s.refresh_token.filter(|r| !r.is_empty() && r.len() <= MAX_TOKEN);
        Ok(Issued { token: DownstreamToken::new(token), lifetime, refresh })
    }
}

/// A body, read up to `max` bytes.
pub(crate) async fn read_capped(mut response: reqwest::Response, max: usize) -> Result<Vec<u8>, OAuthError> {
    let mut out = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| OAuthError::Unreachable(without_url(&e)))? {
        if out.len() + chunk.len() > max {
            return Err(OAuthError::Response(format!("the answer is larger than {max} bytes")));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// What went wrong, without the URL (which may carry a host the model must not see; the log has the name).
pub(crate) fn without_url(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_body() || e.is_decode() {
        "the body broke off"
    } else {
        "the request failed"
    };
    kind.to_owned()
}
