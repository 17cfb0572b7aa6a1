//! One configured downstream, ready to use: its base URL, its token endpoint and the server's client there, its
//! limits, and what kind it is: token exchange (the request's fixed form, the actor token's scope, the token type
//! it must issue) or URL mode (the third party's authorization endpoint, the scope asked for, how long a grant is
//! kept).

use crate::OAuthError;
use crate::client::Client;
use crate::config::Resolved;
use crate::exchange::{ACCESS_TOKEN_TYPE, GRANT_TOKEN_EXCHANGE};
use std::time::Duration;

pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) base: reqwest::Url,
    pub(crate) token_endpoint: String,
    pub(crate) client: Client,
    pub(crate) kind: Kind,
    pub(crate) timeout: Duration,
    pub(crate) negative: Duration,
    pub(crate) skew: Duration,
    pub(crate) max_response: usize,
}

pub(crate) enum Kind {
    Exchange(ExchangeTarget),
    Url(UrlTarget),
}

/// A URL-mode downstream's own settings.
pub(crate) struct UrlTarget {
    pub(crate) authorization_endpoint: String,
    pub(crate) scope: String,
    /// How long a grant is kept (its refresh token's use renews it).
    pub(crate) keep: Duration,
}

pub(crate) struct ExchangeTarget {
    /// The request's fixed fields: grant type, audience, resource, scope, requested token type.
    pub(crate) form: Vec<(&'static str, String)>,
    pub(crate) actor_scope: Option<String>,
    pub(crate) issued_type: &'static str,
}

impl Target {
    pub(crate) fn new(r: Resolved) -> Result<Self, OAuthError> {
        let at = format!("/downstreams/{}", r.name);
        let d = &r.doc;
        let (client_doc, place) = d.client().ok_or_else(|| OAuthError::Schema {
            pointer: at.clone(),
            expected: "exchange or authorization_code".to_owned(),
        })?;
        let client = Client::new(client_doc, &r.credential)
            .map_err(|expected| OAuthError::Schema { pointer: format!("{at}/{place}/client"), expected })?;
        let mut base = reqwest::Url::parse(&d.base_url)
            .map_err(|e| OAuthError::Schema { pointer: format!("{at}/base_url"), expected: e.to_string() })?;
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        let (token_endpoint, kind) = match (&d.exchange, &d.authorization_code) {
            (Some(x), _) => {
                let mut form = vec![("grant_type", GRANT_TOKEN_EXCHANGE.to_owned()), ("audience", x.audience.clone())];
                if let Some(resource) = &x.resource {
                    form.push(("resource", resource.clone()));
                }
                if !x.scope.is_empty() {
                    form.push(("scope", x.scope.join(" ")));
                }
                if let Some(t) = &x.requested_token_type {
                    form.push(("requested_token_type", t.clone()));
                }
                let issued_type = match x.requested_token_type.as_deref() {
                    Some("urn:ietf:params:oauth:token-type:jwt") => "urn:ietf:params:oauth:token-type:jwt",
                    _ => ACCESS_TOKEN_TYPE,
                };
                let actor_scope = x.actor_token.as_ref().map(|a| a.scope.join(" "));
                (x.token_endpoint.clone(), Kind::Exchange(ExchangeTarget { form, actor_scope, issued_type }))
            }
            (None, Some(a)) => (
                a.token_endpoint.clone(),
                Kind::Url(UrlTarget {
                    authorization_endpoint: a.authorization_endpoint.clone(),
                    scope: a.scope.join(" "),
                    keep: Duration::from_secs(a.grant_days * 24 * 3600),
                }),
            ),
            (None, None) => {
                return Err(OAuthError::Schema { pointer: at, expected: "exchange or authorization_code".to_owned() });
            }
        };
        Ok(Self {
            name: r.name.clone(),
            base,
            token_endpoint,
            client,
            kind,
            timeout: d.timeout(),
            negative: d.negative_cache(),
            skew: d.skew(),
            max_response: d.max_response_bytes,
        })
    }
}
