//! The downstreams document (`--downstreams FILE`): YAML (or JSON), checked against `downstreams.schema.json`
//! (every object closed, every number bounded), then typed. Secrets are references ([`SecretRef`]) that the
//! server's config module resolves at start ([`Document::resolve`]); this crate never reads the environment.

use crate::OAuthError;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// The document's schema (JSON Schema 2020-12), as published in docs/DOWNSTREAM.md.
pub const SCHEMA: &str = include_str!("../downstreams.schema.json");

/// The largest document read.
const MAX_BYTES: usize = 256 * 1024;

/// Where a secret comes from.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecretRef {
    /// An environment variable of the server's process.
    Env(String),
    /// A file (a mounted Secret), read whole; one trailing newline is dropped.
    File(PathBuf),
}

impl std::fmt::Display for SecretRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Env(name) => write!(f, "environment variable {name}"),
            Self::File(path) => write!(f, "file {}", path.display()),
        }
    }
}

/// How the server authenticates to a token endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuthMethod {
    ClientSecretBasic,
    ClientSecretPost,
    PrivateKeyJwt,
}

/// The algorithm of a `private_key_jwt` assertion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum KeyAlg {
    RS256,
    PS256,
    ES256,
    ES384,
    EdDSA,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientDoc {
    pub id: String,
    pub auth: ClientAuthMethod,
    pub secret: Option<SecretRef>,
    pub private_key: Option<SecretRef>,
    pub key_alg: Option<KeyAlg>,
    pub key_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActorDoc {
    #[serde(default)]
    pub scope: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExchangeDoc {
    pub token_endpoint: String,
    pub client: ClientDoc,
    pub audience: String,
    pub resource: Option<String>,
    #[serde(default)]
    pub scope: Vec<String>,
    pub actor_token: Option<ActorDoc>,
    pub requested_token_type: Option<String>,
}

/// URL mode: the user's consent at a third party (authorization code with PKCE).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthorizationCodeDoc {
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub client: ClientDoc,
    #[serde(default)]
    pub scope: Vec<String>,
    #[serde(default = "defaults::grant_days")]
    pub grant_days: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DownstreamDoc {
    pub base_url: String,
    /// Token exchange; exactly one of this and `authorization_code` (the schema says so).
    pub exchange: Option<ExchangeDoc>,
    pub authorization_code: Option<AuthorizationCodeDoc>,
    #[serde(default = "defaults::timeout")]
    pub timeout_seconds: u64,
    #[serde(default = "defaults::negative")]
    pub negative_cache_seconds: u64,
    #[serde(default = "defaults::skew")]
    pub skew_seconds: u64,
    #[serde(default = "defaults::max_response")]
    pub max_response_bytes: usize,
}

mod defaults {
    pub(super) fn timeout() -> u64 {
        5
    }
    pub(super) fn negative() -> u64 {
        10
    }
    pub(super) fn skew() -> u64 {
        30
    }
    pub(super) fn max_response() -> usize {
        1024 * 1024
    }
    pub(super) fn grant_days() -> u64 {
        30
    }
}

/// How the start page signs the browser user in to the fleet's own issuer.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignInDoc {
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub client: ClientDoc,
    #[serde(default)]
    pub scope: Vec<String>,
}

/// The sign-in, its client's secret read.
#[derive(Clone, Debug)]
pub struct SignIn {
    pub doc: SignInDoc,
    pub credential: Credential,
}

/// A checked downstreams document, its secrets not read yet.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Document {
    pub downstreams: BTreeMap<String, DownstreamDoc>,
    /// The start page's sign-in to the fleet's issuer (URL mode with `--auth jwt`).
    pub signin: Option<SignInDoc>,
}

/// A secret, read. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    #[must_use]
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// A client's credential, read.
#[derive(Clone, Debug)]
pub enum Credential {
    Secret(Secret),
    Key { pem: Secret, alg: KeyAlg, kid: Option<String> },
}

/// One downstream, its secrets read.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub name: String,
    pub doc: DownstreamDoc,
    pub credential: Credential,
}

impl DownstreamDoc {
    /// The client the server authenticates as, and the place of its kind in the document; `None` for a downstream of
    /// neither kind (which the schema refuses).
    #[must_use]
    pub fn client(&self) -> Option<(&ClientDoc, &'static str)> {
        match (&self.exchange, &self.authorization_code) {
            (Some(x), _) => Some((&x.client, "exchange")),
            (None, Some(a)) => Some((&a.client, "authorization_code")),
            (None, None) => None,
        }
    }

    /// Whether tokens come from the user's own authorization (URL mode).
    #[must_use]
    pub fn is_url_mode(&self) -> bool {
        self.authorization_code.is_some()
    }

    #[must_use]
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_seconds)
    }

    #[must_use]
    pub fn negative_cache(&self) -> Duration {
        Duration::from_secs(self.negative_cache_seconds)
    }

    #[must_use]
    pub fn skew(&self) -> Duration {
        Duration::from_secs(self.skew_seconds)
    }
}

/// A client's credential, read from where the document says.
fn credential(
    c: &ClientDoc,
    at: &str,
    read: &dyn Fn(&SecretRef) -> Result<String, String>,
) -> Result<Credential, OAuthError> {
    let get = |r: &SecretRef, field: &str| {
        read(r)
            .map(Secret::new)
            .map_err(|why| OAuthError::Secret { pointer: format!("{at}/{field}"), what: format!("{r}: {why}") })
    };
    Ok(match (c.auth, &c.secret, &c.private_key, c.key_alg) {
        // The key is checked when its client is built (`Downstreams::new`, at start too).
        (ClientAuthMethod::PrivateKeyJwt, _, Some(k), Some(alg)) => {
            Credential::Key { pem: get(k, "private_key")?, alg, kid: c.key_id.clone() }
        }
        (_, Some(s), _, _) => Credential::Secret(get(s, "secret")?),
        _ => {
            return Err(OAuthError::Schema {
                pointer: at.to_owned(),
                expected: "a secret, or a private key and its algorithm".to_owned(),
            });
        }
    })
}

fn validator() -> Option<&'static jsonschema::Validator> {
    static V: OnceLock<Option<jsonschema::Validator>> = OnceLock::new();
    V.get_or_init(|| serde_json::from_str(SCHEMA).ok().and_then(|s: Value| jsonschema::draft202012::new(&s).ok()))
        .as_ref()
}

impl Document {
    /// Parses and checks a downstreams document.
    ///
    /// # Errors
    /// [`OAuthError::Syntax`] or [`OAuthError::Schema`], with the JSON pointer of the first place refused.
    pub fn parse(text: &str) -> Result<Self, OAuthError> {
        if text.len() > MAX_BYTES {
            return Err(OAuthError::Syntax(format!("{} bytes, more than the {MAX_BYTES} it may have", text.len())));
        }
        let value: Value = serde_saphyr::from_str(text).map_err(|e| {
            let msg = e.to_string();
            let first = msg.lines().next().unwrap_or_default().trim();
            OAuthError::Syntax(first.strip_prefix("error: ").unwrap_or(first).to_owned())
        })?;
        Self::from_value(&value)
    }

    /// Checks a document already read as JSON.
    ///
    /// # Errors
    /// [`OAuthError::Schema`].
    pub fn from_value(value: &Value) -> Result<Self, OAuthError> {
        let v = validator().ok_or_else(|| OAuthError::Schema {
            pointer: String::new(),
            expected: "a schema this build can compile".to_owned(),
        })?;
        // An unknown key is named first: a misspelt key also makes a required one missing, and the misspelling is
        // the place to fix.
        let errors: Vec<_> = v.iter_errors(value).collect();
        let unknown = errors
            .iter()
            .position(|e| matches!(e.kind(), jsonschema::error::ValidationErrorKind::AdditionalProperties { .. }));
        if let Some(e) = unknown.or((!errors.is_empty()).then_some(0)).map(|i| &errors[i]) {
            let (pointer, expected) = mcpfleet_tools::validate::refusal(e);
            return Err(OAuthError::Schema { pointer, expected });
        }
        let doc = Self::deserialize(value)
            .map_err(|e| OAuthError::Schema { pointer: String::new(), expected: e.to_string() })?;
        for (name, d) in &doc.downstreams {
            let at = format!("/downstreams/{}", mcpfleet_tools::validate::pointer_token(name));
            let base = reqwest::Url::parse(&d.base_url).map_err(|e| OAuthError::Schema {
                pointer: format!("{at}/base_url"),
                expected: format!("a URL ({e})"),
            })?;
            if base.query().is_some() || !base.username().is_empty() || base.password().is_some() {
                return Err(OAuthError::Schema {
                    pointer: format!("{at}/base_url"),
                    expected: "a URL without a query or credentials".to_owned(),
                });
            }
            let mut urls = Vec::new();
            if let Some(x) = &d.exchange {
                urls.push(("exchange/token_endpoint", &x.token_endpoint));
            }
            if let Some(a) = &d.authorization_code {
                urls.push(("authorization_code/authorization_endpoint", &a.authorization_endpoint));
                urls.push(("authorization_code/token_endpoint", &a.token_endpoint));
            }
            for (place, url) in urls {
                reqwest::Url::parse(url).map_err(|e| OAuthError::Schema {
                    pointer: format!("{at}/{place}"),
                    expected: format!("a URL ({e})"),
                })?;
            }
        }
        Ok(doc)
    }

    /// The secret references the document names, with where they are named, for the config module to read.
    #[must_use]
    pub fn secret_refs(&self) -> Vec<(String, &SecretRef)> {
        let mut out = Vec::new();
        for (name, d) in &self.downstreams {
            let Some((c, kind)) = d.client() else { continue };
            let at = format!("/downstreams/{}/{kind}/client", mcpfleet_tools::validate::pointer_token(name));
            if let Some(s) = &c.secret {
                out.push((format!("{at}/secret"), s));
            }
            if let Some(k) = &c.private_key {
                out.push((format!("{at}/private_key"), k));
            }
        }
        out
    }

    /// Reads the sign-in client's secret with `read`.
    ///
    /// # Errors
    /// [`OAuthError::Secret`] naming the place and the reference, never the value.
    pub fn resolve_signin(
        &self,
        read: &dyn Fn(&SecretRef) -> Result<String, String>,
    ) -> Result<Option<SignIn>, OAuthError> {
        let Some(s) = &self.signin else { return Ok(None) };
        let credential = credential(&s.client, "/signin/client", read)?;
        Ok(Some(SignIn { doc: s.clone(), credential }))
    }

    /// Reads every secret with `read` (the server's config module: the environment or a file).
    ///
    /// # Errors
    /// [`OAuthError::Secret`] naming the place and the reference, never the value.
    pub fn resolve(&self, read: &dyn Fn(&SecretRef) -> Result<String, String>) -> Result<Vec<Resolved>, OAuthError> {
        let mut out = Vec::new();
        for (name, d) in &self.downstreams {
            let at = format!("/downstreams/{}", mcpfleet_tools::validate::pointer_token(name));
            let (c, kind) = d.client().ok_or_else(|| OAuthError::Schema {
                pointer: at.clone(),
                expected: "exchange or authorization_code".to_owned(),
            })?;
            let at = format!("{at}/{kind}/client");
            let credential = credential(c, &at, read)?;
            out.push(Resolved { name: name.clone(), doc: d.clone(), credential });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r"
downstreams:
  calendar:
    base_url: http://127.0.0.1:9/api/
    exchange:
      token_endpoint: http://127.0.0.1:8/token
      client: { id: fleet, auth: client_secret_basic, secret: { env: CAL_SECRET } }
      audience: https://calendar.test
      scope: [calendar.read]
";

    #[test]
    fn a_good_document_parses_with_its_defaults() {
        let d = Document::parse(GOOD).unwrap();
        let c = &d.downstreams["calendar"];
        assert_eq!(c.timeout_seconds, 5);
        assert_eq!(c.negative_cache_seconds, 10);
        assert_eq!(c.client().unwrap().0.secret, Some(SecretRef::Env("CAL_SECRET".into())));
        let r = d.resolve(&|_| Ok("s3cret".into())).unwrap();
        assert!(matches!(&r[0].credential, Credential::Secret(s) if s.expose() == "s3cret"));
        assert_eq!(format!("{:?}", r[0].credential), "Secret(Secret(..))", "Debug never shows a secret");
    }

    #[test]
    fn a_url_mode_downstream_parses_and_one_kind_only_is_allowed() {
        let url_mode = r"
downstreams:
  tickets:
    base_url: http://127.0.0.1:9/
    authorization_code:
      authorization_endpoint: http://127.0.0.1:8/auth
      token_endpoint: http://127.0.0.1:8/token
      client: { id: fleet, auth: client_secret_post, secret: { file: /run/secrets/t } }
      scope: [tickets.read, offline_access]
";
        let d = Document::parse(url_mode).unwrap();
        let t = &d.downstreams["tickets"];
        assert!(t.is_url_mode());
        assert_eq!(t.authorization_code.as_ref().unwrap().grant_days, 30);
        assert_eq!(d.secret_refs()[0].0, "/downstreams/tickets/authorization_code/client/secret");
        let both = format!(
            "{GOOD}    authorization_code: {{ authorization_endpoint: http://h/a, token_endpoint: http://h/t, client: \
             {{ id: c, auth: client_secret_post, secret: {{ env: S }} }} }}\n"
        );
        assert!(Document::parse(&both).unwrap_err().to_string().starts_with("/downstreams/calendar"), "not both kinds");
        let neither = "downstreams:\n  x:\n    base_url: http://127.0.0.1:9/\n";
        assert!(Document::parse(neither).is_err(), "one kind is needed");
    }

    #[test]
    fn bad_documents_are_refused_at_their_place() {
        let refused = |text: &str| Document::parse(text).unwrap_err().to_string();
        assert!(refused(&GOOD.replace("scope:", "scopes:")).starts_with("/downstreams/calendar/exchange/scopes"));
        assert!(
            refused(&GOOD.replace("{ env: CAL_SECRET }", "hunter2"))
                .contains("/downstreams/calendar/exchange/client/secret"),
            "a secret inline is refused"
        );
        assert!(refused(&GOOD.replace("calendar:", "Calendar:")).contains("/downstreams"));
        assert!(refused(&GOOD.replace("http://127.0.0.1:9/api/", "file:///etc")).contains("base_url"));
        assert!(refused(&GOOD.replace("http://127.0.0.1:9/api/", "http://u:p@h/")).contains("credentials"));
        assert!(
            refused(&GOOD.replace("auth: client_secret_basic", "auth: private_key_jwt")).contains("/client"),
            "private_key_jwt needs a key, not a secret"
        );
        assert!(refused("downstreams: {}\n").contains("/downstreams"));
        assert!(refused("a: 1\na: 2\n").starts_with("not a downstreams document"));
        let missing = Document::parse(GOOD).unwrap().resolve(&|_| Err("not set".into())).unwrap_err().to_string();
        assert!(missing.contains("environment variable CAL_SECRET: not set"), "{missing}");
    }
}
