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
//! bodies, and turns an [`OAuthError`] into a status (401 for `invalid_client`, 400 otherwise) and a body: JSON,
//! or for a refusal of the authorization endpoint that a browser asked to see as HTML, [`OAuthError::page`].
//!
//! The parts: `seal` (what the blobs carry, and their MAC), `request` (reading and checking a request), `error`
//! (the answers that refuse), `page` (a refusal of the authorization endpoint as HTML, for a person), and one
//! file per endpoint: `register`, `authorize`, `token`. This file holds the [`DevAuthServer`], its constants and
//! its metadata.

mod authorize;
mod error;
mod page;
mod register;
mod request;
mod seal;
mod token;

pub use error::{AuthorizeOutcome, ErrorCode, OAuthError};
pub use page::{PAGE_CONTENT_TYPE, PAGE_CSP, prefers_html};

use crate::ProtectedResource;
use crate::dev::DevIssuer;
use seal::Sealer;
use serde_json::{Value, json};
use std::time::Duration;

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

/// The authorization server of `--auth dev`. Every replica that shares the dev key file builds the same one.
#[derive(Clone)]
pub struct DevAuthServer {
    issuer: DevIssuer,
    sealer: Sealer,
    scopes_supported: Vec<String>,
    required_scopes: Vec<String>,
    resource_name: String,
}

impl std::fmt::Debug for DevAuthServer {
    // Never print the MAC key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevAuthServer").field("scopes_supported", &self.scopes_supported).finish_non_exhaustive()
    }
}

/// `http://<host>`: the issuer identifier of the dev sign-in as a client that used `host` sees it.
#[must_use]
pub fn issuer_url(host: &str) -> String {
    format!("http://{host}")
}

impl DevAuthServer {
    /// The sign-in of `issuer`'s key for the resource described by `resource` (its scopes; the URLs come from
    /// each request's `Host`).
    #[must_use]
    pub fn new(issuer: &DevIssuer, resource: &ProtectedResource) -> Self {
        Self {
            issuer: issuer.clone(),
            sealer: Sealer::new(issuer.oauth_key()),
            scopes_supported: resource.scopes_supported.clone(),
            required_scopes: resource.required_scopes.clone(),
            resource_name: resource.resource_name.clone(),
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
            resource_name: self.resource_name.clone(),
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
            "dpop_signing_alg_values_supported": crate::dpop::ALGS,
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
}

#[cfg(test)]
mod tests {
    use super::request::{host_port, params};
    use super::*;
    use crate::{JwtAuthenticator, KeySource};
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use http::{HeaderMap, header};
    use mcpfleet_core::time::epoch_secs;
    use std::collections::BTreeMap;
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
            resource_name: "mcpfleet".to_owned(),
        };
        (DevAuthServer::new(&issuer, &pr), issuer)
    }

    fn headers(content_type: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, content_type.parse().unwrap());
        h
    }

    fn register(s: &DevAuthServer, meta: Value) -> Result<Value, OAuthError> {
        s.register(&headers("application/json"), meta.to_string().as_bytes(), epoch_secs())
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
        s.token(&headers("application/x-www-form-urlencoded"), query(pairs).as_bytes(), epoch_secs())
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
        let code = code_for(&s, &client_id, &[("login_hint", "alice@example.com")], epoch_secs());
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
        let code = code_for(&s, &client_id, &[("scope", "offline_access mcp:access fixtures:whoami")], epoch_secs());
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
        let code = code_for(&s, &client_id, &[("scope", "offline_access")], epoch_secs());
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
        let code = code_for(&s, &client_id, &[], epoch_secs());
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
            let p = redirect_params(s.authorize(HOST, &q, epoch_secs()));
            assert_eq!(p["error"], "invalid_request", "{method}: {p:?}");
            assert_eq!(p["state"], "s1");
        }
    }

    #[test]
    fn codes_expire_and_cannot_be_forged_or_moved() {
        let (s, _) = server();
        let client_id = public_client(&s);
        let old = code_for(&s, &client_id, &[], epoch_secs() - 61);
        let e = exchange(&s, &client_id, &old, VERIFIER).unwrap_err();
        assert_eq!((e.code, e.description.contains("expired")), (ErrorCode::InvalidGrant, true));
        let code = code_for(&s, &client_id, &[], epoch_secs());
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
        let code = code_for(&s, id, &[], epoch_secs());
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
        let wrong = s.token(&h, form("wrong").as_bytes(), epoch_secs()).unwrap_err();
        assert_eq!(wrong.code, ErrorCode::InvalidClient);
        let missing = exchange(&s, id, &code, VERIFIER).unwrap_err();
        assert_eq!(missing.code, ErrorCode::InvalidClient);
        assert!(s.token(&h, form(secret).as_bytes(), epoch_secs()).is_ok());
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
        assert!(s.token(&basic, body.as_bytes(), epoch_secs()).is_ok());
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
            redirect_params(s.authorize(HOST, &query(&pairs), epoch_secs()))
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
        assert_eq!(redirect_params(s.authorize(HOST, &token_type, epoch_secs()))["error"], "unsupported_response_type");
    }

    #[test]
    fn untrusted_clients_and_redirects_get_a_page_not_a_redirect() {
        let (s, _) = server();
        let client_id = public_client(&s);
        let page = |q: &str| match s.authorize(HOST, q, epoch_secs()) {
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
