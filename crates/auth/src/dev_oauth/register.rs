//! Dynamic client registration (RFC 7591) of loopback redirect URIs only: the client id is the registration,
//! sealed.

use super::error::{ErrorCode, OAuthError};
use super::request::{content_type_is, loopback_url, shown};
use super::seal::{AuthMethod, CLIENT, Client, nonce};
use super::{DevAuthServer, MAX_BODY_BYTES};
use http::HeaderMap;
use serde_json::{Value, json};

/// Most redirect URIs one client may register.
const MAX_REDIRECT_URIS: usize = 8;
/// Longest redirect URI.
const MAX_REDIRECT_URI_BYTES: usize = 512;
/// Longest client id: the verifier accepts a `client_id` claim of at most 1024 bytes.
const MAX_CLIENT_ID_BYTES: usize = 1000;

impl DevAuthServer {
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
        let client_id = self.sealer.seal(CLIENT, &Client { m: method, r: uris.clone(), n: nonce() });
        if client_id.len() > MAX_CLIENT_ID_BYTES {
            return Err(bad_uri("the redirect URIs are too long together".to_owned()));
        }
        for gone in
            ["client_secret", "client_secret_expires_at", "registration_access_token", "registration_client_uri"]
        {
            meta.remove(gone);
        }
        if method != AuthMethod::None {
            meta.insert("client_secret".to_owned(), json!(self.sealer.client_secret(&client_id)));
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
}
