//! Who may call: the auth mode (none, JWT, the dev issuer) with its issuer, audience, keys and scopes; the protected
//! resource metadata; and the Host and Origin allow lists that protect against DNS rebinding.

use super::cli::{MaybeBare, Unit, config_error, duration, duration_or_bare_secs, renamed};
use crate::ServerError;
use clap::ValueEnum;
use mcpfleet_auth::{JwtSettings, ProtectedResource, TypPolicy, dev, split_url};
use mcpfleet_transport::HostPattern;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Identity")]
pub(super) struct AuthArgs {
    /// How callers are identified [default: none; dev with --dev]
    #[arg(long, env = "MCPFLEET_AUTH", value_enum)]
    auth: Option<AuthMode>,
    /// The only trusted token issuer (`iss`, compared exactly). Required with --auth jwt.
    #[arg(long, env = "MCPFLEET_JWT_ISSUER")]
    jwt_issuer: Option<String>,
    /// Our audience: a token's `aud` must be this, or an array containing it. Required with --auth jwt.
    #[arg(long, env = "MCPFLEET_JWT_AUDIENCE")]
    jwt_audience: Option<String>,
    /// The issuer's JWKS URL (https, or http on loopback). One of --jwks-url and --jwks-file is required with
    /// --auth jwt.
    #[arg(long, env = "MCPFLEET_JWKS_URL", conflicts_with = "jwks_file")]
    jwks_url: Option<String>,
    /// A JWKS document or a PEM public key, re-read like a URL is re-fetched.
    #[arg(long, env = "MCPFLEET_JWKS_FILE")]
    jwks_file: Option<PathBuf>,
    /// Deadline of one JWKS fetch, like 5s or 500ms; 100ms to 60s.
    #[arg(
        long,
        env = "MCPFLEET_JWKS_TIMEOUT",
        default_value = "5s",
        value_parser = duration("100ms", "60s"),
        conflicts_with = "jwks_timeout_ms"
    )]
    jwks_timeout: Duration,
    /// Deprecated: --jwks-timeout, in milliseconds.
    #[arg(
        long,
        env = "MCPFLEET_JWKS_TIMEOUT_MS",
        hide = true,
        value_parser = clap::value_parser!(u64).range(100..=60_000)
    )]
    jwks_timeout_ms: Option<u64>,
    /// A token naming an unknown `kid` refetches the keys at most once per this interval (it is also the shortest
    /// cache lifetime), like 30s; 1s to 1h.
    #[arg(
        long,
        env = "MCPFLEET_JWKS_REFRESH_INTERVAL",
        default_value = "30s",
        value_parser = duration("1s", "1h"),
        conflicts_with = "jwks_refresh_interval_secs"
    )]
    jwks_refresh_interval: Duration,
    /// Deprecated: --jwks-refresh-interval, in seconds.
    #[arg(
        long,
        env = "MCPFLEET_JWKS_REFRESH_INTERVAL_SECS",
        hide = true,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    jwks_refresh_interval_secs: Option<u64>,
    /// Clock skew allowed on exp, nbf and iat, like 10s; at most 30s. (A bare number of seconds is deprecated.)
    #[arg(long, env = "MCPFLEET_JWT_LEEWAY", default_value = "10s", value_parser = duration_or_bare_secs("0s", "30s"))]
    jwt_leeway: MaybeBare,
    /// Accepted `typ` of access tokens.
    #[arg(long, env = "MCPFLEET_JWT_TYP", value_enum, default_value = "at+jwt")]
    jwt_typ: JwtTyp,
    /// Scope every request needs; repeat for several. An empty value requires none.
    #[arg(long, env = "MCPFLEET_REQUIRED_SCOPE", value_delimiter = ' ', default_value = "mcp:access")]
    required_scope: Vec<String>,
    /// The public URL of /mcp (e.g. https://mcp.example.com/mcp): the resource in the metadata and challenges.
    /// Required with --auth jwt.
    #[arg(long, env = "MCPFLEET_RESOURCE_URL")]
    resource_url: Option<String>,
    /// An authorization server clients should use (issuer URL), repeatable [default: --jwt-issuer]
    #[arg(long, env = "MCPFLEET_AUTHORIZATION_SERVERS", value_delimiter = ',')]
    authorization_server: Vec<String>,
    /// Scopes a tool needs, on top of those it declares: TOOL=SCOPE[ SCOPE...], repeatable.
    #[arg(long, env = "MCPFLEET_TOOL_SCOPES", value_delimiter = ',')]
    tool_scope: Vec<String>,
    /// The token claim that names the caller's tenant (whose data the tools act on), with --auth jwt; a token
    /// without it gets 401. Unset: each principal is its own tenant.
    #[arg(long, env = "MCPFLEET_TENANT_CLAIM")]
    tenant_claim: Option<String>,
    /// The longest a token may live (exp - iat, or exp - now without iat), like 24h; 0 for no limit. A token that
    /// lives longer is refused (401), so that a revocation that lasts this long (`mcpfleet revoke`'s default)
    /// outlives every token it covers. With --auth jwt.
    #[arg(
        long,
        env = "MCPFLEET_MAX_TOKEN_LIFETIME",
        default_value = "24h",
        value_parser = super::cli::duration_or_zero("1m", "30d")
    )]
    max_token_lifetime: Duration,
    /// The dev issuer's key file, created if missing [default: <tmp>/mcpfleet-dev-key.pem]
    #[arg(long, env = "MCPFLEET_DEV_KEY_FILE")]
    dev_key_file: Option<PathBuf>,
    /// Allowed Origin values, comma-separated (scheme://host[:port], or scheme://host:* for any port). A request
    /// without Origin is allowed; any other Origin gets 403 [default: loopback origins on a loopback listener,
    /// otherwise the origin of --resource-url]
    #[arg(long, env = "MCPFLEET_ALLOWED_ORIGINS", value_delimiter = ',')]
    allowed_origins: Option<Vec<String>>,
    /// Allowed Host header values, comma-separated (host[:port], or host:*). Others get 403 [default: loopback
    /// hosts on a loopback listener, otherwise the host of --resource-url]
    #[arg(long, env = "MCPFLEET_ALLOWED_HOSTS", value_delimiter = ',')]
    allowed_hosts: Option<Vec<String>>,
}

/// How callers are identified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AuthMode {
    /// No authentication: every caller is one anonymous principal with every scope. Loopback only.
    None,
    /// OAuth 2.1 resource server: JWT access tokens from --jwt-issuer, verified with --jwks-url or --jwks-file.
    Jwt,
    /// An embedded issuer (key in --dev-key-file) that prints a token at start; `mcpfleet token` mints more.
    /// Loopback only.
    Dev,
}

/// Which `typ` header JWT access tokens may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum JwtTyp {
    /// `at+jwt` only (RFC 9068).
    #[value(name = "at+jwt")]
    AtJwt,
    /// `at+jwt` or `JWT` (issuers that do not label access tokens).
    #[value(name = "at+jwt-or-jwt")]
    AtJwtOrJwt,
}

/// Where JWT verification keys come from.
#[derive(Clone, Debug)]
pub enum KeysFrom {
    /// A JWKS URL, fetched with this timeout.
    Url { url: String, timeout: Duration },
    /// A JWKS or PEM file.
    File(PathBuf),
}

/// The identity configuration.
#[derive(Clone, Debug)]
pub enum AuthConfig {
    None,
    Jwt { settings: JwtSettings, keys: KeysFrom, refresh_interval: Duration },
    Dev { key_file: PathBuf, required_scopes: Vec<String> },
}

/// The identity part of a [`super::Config`]: the authenticator's configuration, and what the transport enforces.
#[derive(Debug)]
pub(super) struct Identity {
    pub auth: AuthConfig,
    pub access: Access,
}

/// What the transport enforces about identity, for its [`mcpfleet_transport::TransportConfig`].
#[derive(Debug)]
pub(super) struct Access {
    /// The RFC 9728 metadata; `None` with `--auth none`.
    pub protected_resource: Option<ProtectedResource>,
    pub tool_scopes: BTreeMap<String, Vec<String>>,
    pub allowed_origins: Vec<HostPattern>,
    pub allowed_hosts: Vec<HostPattern>,
    /// `--auth none`: everyone is one principal, so the rate limit is keyed by peer address.
    pub rate_key_by_peer: bool,
}

impl AuthArgs {
    /// The identity of a server listening on `listen`; `dev` is `--dev` (`--auth dev` unless `--auth` says
    /// otherwise). Deprecated aliases add a warning to `deprecated`.
    ///
    /// # Errors
    /// `--auth none` or `dev` on a non-loopback address, an invalid scope, what `--auth jwt` lacks, an unusable
    /// URL, or an invalid or empty allow list.
    pub(super) fn into_config(
        self,
        listen: SocketAddr,
        dev: bool,
        deprecated: &mut Vec<String>,
    ) -> Result<Identity, ServerError> {
        let jwks_timeout = renamed("jwks-timeout", self.jwks_timeout, self.jwks_timeout_ms, Unit::Ms, deprecated);
        let refresh_interval = renamed(
            "jwks-refresh-interval",
            self.jwks_refresh_interval,
            self.jwks_refresh_interval_secs,
            Unit::Secs,
            deprecated,
        );
        if self.jwt_leeway.bare {
            deprecated.push(format!(
                "--jwt-leeway (MCPFLEET_JWT_LEEWAY) without a unit is deprecated: write {}s",
                self.jwt_leeway.value.as_secs()
            ));
        }
        let mode = self.auth.unwrap_or(if dev { AuthMode::Dev } else { AuthMode::None });
        if mode != AuthMode::Jwt && !listen.ip().is_loopback() {
            let name = if mode == AuthMode::None { "none" } else { "dev" };
            return Err(config_error(format!("--auth {name} refuses to listen on non-loopback address {listen}")));
        }
        if self.tenant_claim.is_some() && mode != AuthMode::Jwt {
            return Err(config_error("--tenant-claim needs --auth jwt"));
        }
        let required_scopes: Vec<String> =
            self.required_scope.iter().flat_map(|s| s.split_whitespace()).map(str::to_owned).collect();
        let tool_scopes = tool_scopes(&self.tool_scope)?;
        if let Some(bad) = required_scopes.iter().chain(tool_scopes.values().flatten()).find(|s| !valid_scope(s)) {
            return Err(config_error(format!(
                "invalid scope {bad:?}: scopes are visible ASCII without quotes or backslashes"
            )));
        }
        let (auth, resource_url, authorization_servers) = match mode {
            AuthMode::None => (AuthConfig::None, None, Vec::new()),
            AuthMode::Dev => {
                let resource = self.resource_url.clone().unwrap_or_else(|| format!("http://{listen}/mcp"));
                let key_file = self.dev_key_file.clone().unwrap_or_else(default_dev_key_file);
                let auth = AuthConfig::Dev { key_file, required_scopes: required_scopes.clone() };
                (auth, Some(resource), vec![dev::DEV_ISSUER.to_owned()])
            }
            AuthMode::Jwt => self.jwt(&required_scopes, jwks_timeout, refresh_interval)?,
        };
        if let Some(r) = &resource_url {
            let ok = split_url(r).is_some() && (r.starts_with("https://") || loopback_url(r) || mode == AuthMode::Dev);
            if !ok {
                return Err(config_error(format!(
                    "--resource-url {r:?} must be an absolute https:// URL without query or fragment (http:// only on loopback)"
                )));
            }
        }
        let (allowed_origins, allowed_hosts) = self.allow_lists(listen, resource_url.as_deref())?;
        let protected_resource = resource_url.map(|resource| ProtectedResource {
            resource,
            authorization_servers,
            // The tools' scopes are added once the catalog is known (build_state).
            scopes_supported: required_scopes.clone(),
            required_scopes,
            // The server's name, once it is known (config::parse_as).
            resource_name: String::new(),
        });
        let access = Access {
            protected_resource,
            tool_scopes,
            allowed_origins,
            allowed_hosts,
            rate_key_by_peer: mode == AuthMode::None,
        };
        Ok(Identity { auth, access })
    }

    /// `--auth jwt`: the settings, the resource URL and the authorization servers.
    fn jwt(
        &self,
        required_scopes: &[String],
        jwks_timeout: Duration,
        refresh_interval: Duration,
    ) -> Result<(AuthConfig, Option<String>, Vec<String>), ServerError> {
        let missing = |flag: &str| config_error(format!("--auth jwt needs {flag}"));
        let issuer = self.jwt_issuer.clone().filter(|s| !s.is_empty()).ok_or_else(|| missing("--jwt-issuer"))?;
        let audience = self.jwt_audience.clone().filter(|s| !s.is_empty()).ok_or_else(|| missing("--jwt-audience"))?;
        let resource = self.resource_url.clone().ok_or_else(|| missing("--resource-url"))?;
        let keys = match (&self.jwks_url, &self.jwks_file) {
            (Some(url), None) => {
                if !(url.starts_with("https://") || (url.starts_with("http://") && loopback_url(url)))
                    || split_url(url).is_none()
                {
                    return Err(config_error("--jwks-url must be an https:// URL (http:// only on loopback)"));
                }
                KeysFrom::Url { url: url.clone(), timeout: jwks_timeout }
            }
            (None, Some(file)) => KeysFrom::File(file.clone()),
            _ => return Err(missing("--jwks-url or --jwks-file")),
        };
        let settings = JwtSettings {
            issuer: issuer.clone(),
            audience,
            leeway: self.jwt_leeway.value,
            typ: match self.jwt_typ {
                JwtTyp::AtJwt => TypPolicy::AtJwt,
                JwtTyp::AtJwtOrJwt => TypPolicy::AtJwtOrJwt,
            },
            required_scopes: required_scopes.to_vec(),
            tenant_claim: self.tenant_claim.clone(),
            max_lifetime: (!self.max_token_lifetime.is_zero()).then_some(self.max_token_lifetime),
        };
        let servers =
            if self.authorization_server.is_empty() { vec![issuer] } else { self.authorization_server.clone() };
        Ok((AuthConfig::Jwt { settings, keys, refresh_interval }, Some(resource), servers))
    }

    /// The Origin and Host allow lists. DNS-rebinding protection: a loopback listener answers loopback names only;
    /// a public one, by default, only the name in its resource URL.
    fn allow_lists(
        &self,
        listen: SocketAddr,
        resource_url: Option<&str>,
    ) -> Result<(Vec<HostPattern>, Vec<HostPattern>), ServerError> {
        let public = resource_url.filter(|_| !listen.ip().is_loopback()).and_then(scheme_and_host);
        let (default_origins, default_hosts) = match public {
            Some((scheme, host)) => (vec![format!("{scheme}://{host}:*")], vec![format!("{host}:*")]),
            None => (
                vec!["http://localhost:*".into(), "http://127.0.0.1:*".into(), "http://[::1]:*".into()],
                vec!["localhost:*".into(), "127.0.0.1:*".into(), "[::1]:*".into()],
            ),
        };
        let origins = patterns("--allowed-origins", self.allowed_origins.as_deref().unwrap_or(&default_origins))?;
        let hosts = patterns("--allowed-hosts", self.allowed_hosts.as_deref().unwrap_or(&default_hosts))?;
        if hosts.is_empty() {
            return Err(config_error("--allowed-hosts is empty: no request could ever be served"));
        }
        Ok((origins, hosts))
    }
}

fn patterns(what: &str, raw: &[String]) -> Result<Vec<HostPattern>, ServerError> {
    raw.iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            HostPattern::parse(s)
                .ok_or_else(|| config_error(format!("invalid {what} entry {s:?}: expected value or value:*")))
        })
        .collect()
}

/// Where the dev issuer keeps its key unless `--dev-key-file` says otherwise.
pub(super) fn default_dev_key_file() -> PathBuf {
    std::env::temp_dir().join("mcpfleet-dev-key.pem")
}

/// The scheme and the host (without port; an IPv6 host keeps its brackets) of an `http(s)://` URL.
fn scheme_and_host(url: &str) -> Option<(&str, &str)> {
    let (origin, _) = split_url(url)?;
    let (scheme, authority) = origin.split_once("://")?;
    let host =
        if authority.starts_with('[') { &authority[..=authority.find(']')?] } else { authority.split(':').next()? };
    Some((scheme, host))
}

/// A URL whose host is loopback (`localhost`, `127.0.0.0/8`, `[::1]`).
fn loopback_url(url: &str) -> bool {
    scheme_and_host(url).is_some_and(|(_, host)| {
        host == "localhost" || host == "[::1]" || host.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
    })
}

fn tool_scopes(raw: &[String]) -> Result<BTreeMap<String, Vec<String>>, ServerError> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in raw.iter().filter(|e| !e.trim().is_empty()) {
        let (tool, scopes) = entry
            .split_once('=')
            .filter(|(t, s)| !t.trim().is_empty() && !s.trim().is_empty())
            .ok_or_else(|| config_error(format!("invalid --tool-scope {entry:?}: expected TOOL=SCOPE[ SCOPE...]")))?;
        map.entry(tool.trim().to_owned()).or_default().extend(scopes.split_whitespace().map(str::to_owned));
    }
    Ok(map)
}

/// A scope token (RFC 6749 §3.3): visible ASCII except `"` and `\`.
pub(super) fn valid_scope(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b))
}

#[cfg(test)]
mod tests {
    use super::super::tests::serve;
    use super::super::{Config, LogFormat};
    use super::*;

    const JWT: [&str; 10] = [
        "--auth",
        "jwt",
        "--jwt-issuer",
        "https://idp.example",
        "--jwt-audience",
        "https://mcp.example.com/mcp",
        "--jwks-url",
        "https://idp.example/jwks",
        "--resource-url",
        "https://mcp.example.com/mcp",
    ];

    fn jwt(extra: &[&str]) -> Result<Box<Config>, ServerError> {
        let mut args = JWT.to_vec();
        args.extend(extra);
        serve(&args)
    }

    #[test]
    fn a_public_listener_allows_only_the_resource_host_by_default() {
        let c = jwt(&["--listen", "0.0.0.0:8080"]).unwrap();
        let hosts = &c.transport.allowed_hosts;
        assert!(
            hosts.iter().any(|h| h.matches("mcp.example.com"))
                && hosts.iter().any(|h| h.matches("mcp.example.com:443"))
        );
        assert!(!hosts.iter().any(|h| h.matches("localhost:8080") || h.matches("evil.example")));
        let origins = &c.transport.allowed_origins;
        assert!(origins.iter().any(|o| o.matches("https://mcp.example.com")));
        assert!(!origins.iter().any(|o| o.matches("http://localhost:3000") || o.matches("https://evil.example")));
        let pr = c.transport.protected_resource.as_ref().unwrap();
        assert_eq!(pr.authorization_servers, vec!["https://idp.example".to_owned()]);
        assert_eq!(pr.metadata_url(), "https://mcp.example.com/.well-known/oauth-protected-resource/mcp");
    }

    #[test]
    fn a_loopback_listener_allows_loopback_names_only() {
        let c = jwt(&["--listen", "127.0.0.1:8080"]).unwrap();
        assert!(c.transport.allowed_hosts.iter().any(|h| h.matches("localhost:8080")));
        assert!(!c.transport.allowed_hosts.iter().any(|h| h.matches("mcp.example.com")));
    }

    #[test]
    fn explicit_allowlists_and_tool_scopes_are_kept() {
        let c = jwt(&["--allowed-hosts", "a.example:*", "--tool-scope", "t1=s1 s2", "--tool-scope", "t2=s3"]).unwrap();
        assert!(c.transport.allowed_hosts.iter().any(|h| h.matches("a.example:1")));
        assert_eq!(c.transport.tool_scopes["t1"], vec!["s1".to_owned(), "s2".to_owned()]);
        assert!(serve(&["--tool-scope", "no-equals"]).is_err());
        assert!(serve(&["--required-scope", "bad\"scope"]).is_err());
        let err = |args: &[&str]| serve(args).unwrap_err().to_string();
        assert_eq!(
            err(&["--allowed-origins", ":*"]),
            "invalid --allowed-origins entry \":*\": expected value or value:*"
        );
        assert_eq!(err(&["--allowed-hosts", ""]), "--allowed-hosts is empty: no request could ever be served");
    }

    #[test]
    fn jwt_mode_checks_its_urls() {
        let with = |flag: &str, value: &str| {
            let mut args: Vec<&str> = JWT.to_vec();
            let i = args.iter().position(|a| *a == flag).unwrap();
            args[i + 1] = value;
            serve(&args).map(|_| ())
        };
        assert!(with("--jwks-url", "http://idp.example/jwks").is_err(), "plain http to a remote issuer");
        assert!(with("--jwks-url", "http://127.0.0.1:9000/jwks").is_ok());
        assert!(with("--resource-url", "http://mcp.example.com/mcp").is_err());
        assert!(with("--resource-url", "https://mcp.example.com/mcp?x=1").is_err());
        assert!(serve(&["--auth", "jwt", "--jwt-leeway", "31"]).is_err());
        // --dev alone means --auth dev, and text logs unless --log-format says otherwise.
        assert!(matches!(serve(&["--dev"]).unwrap().auth, AuthConfig::Dev { .. }));
        assert_eq!(serve(&["--dev"]).unwrap().log_format, LogFormat::Text);
        assert_eq!(serve(&["--dev", "--log-format", "json"]).unwrap().log_format, LogFormat::Json);
        assert_eq!(serve(&[]).unwrap().log_format, LogFormat::Auto);
        assert!(LogFormat::Auto.is_text(true) && !LogFormat::Auto.is_text(false));
        assert!(serve(&["--log-format", "yaml"]).is_err());
    }

    #[test]
    fn jwt_mode_names_what_it_lacks_and_refuses_public_listeners_without_it() {
        let err = |args: &[&str]| serve(args).unwrap_err().to_string();
        assert_eq!(err(&["--auth", "jwt"]), "--auth jwt needs --jwt-issuer");
        assert_eq!(
            err(&["--listen", "0.0.0.0:8080"]),
            "--auth none refuses to listen on non-loopback address 0.0.0.0:8080"
        );
        assert_eq!(
            err(&["--listen", "0.0.0.0:8080", "--dev"]),
            "--auth dev refuses to listen on non-loopback address 0.0.0.0:8080"
        );
    }

    /// The durations of the JWT settings, in the one syntax, by their deprecated names, and both at once.
    #[test]
    fn jwt_durations_and_their_deprecated_aliases() {
        let settings = |extra: &[&str]| {
            let c = jwt(extra).unwrap();
            let AuthConfig::Jwt { settings, keys: KeysFrom::Url { timeout, .. }, refresh_interval } = c.auth else {
                panic!("not jwt with a URL: {:?}", c.auth);
            };
            (timeout, refresh_interval, settings.leeway, c.warnings)
        };
        let (timeout, refresh, leeway, warnings) = settings(&[]);
        assert_eq!(
            (timeout, refresh, leeway),
            (Duration::from_secs(5), Duration::from_secs(30), Duration::from_secs(10))
        );
        assert!(warnings.is_empty(), "{warnings:?}");
        let new = settings(&["--jwks-timeout", "250ms", "--jwks-refresh-interval", "2m", "--jwt-leeway", "0"]);
        assert_eq!((new.0, new.1, new.2), (Duration::from_millis(250), Duration::from_secs(120), Duration::ZERO));
        assert!(new.3.is_empty(), "{:?}", new.3);
        let old = settings(&["--jwks-timeout-ms", "250", "--jwks-refresh-interval-secs", "120", "--jwt-leeway", "3"]);
        assert_eq!(
            (old.0, old.1, old.2),
            (Duration::from_millis(250), Duration::from_secs(120), Duration::from_secs(3))
        );
        assert_eq!(old.3.len(), 3, "one warning each: {:?}", old.3);
        assert!(old.3[0].starts_with("--jwks-timeout-ms (MCPFLEET_JWKS_TIMEOUT_MS) is deprecated"), "{:?}", old.3);
        assert!(old.3[1].starts_with("--jwks-refresh-interval-secs (MCPFLEET_JWKS_REFRESH_INTERVAL_SECS)"));
        assert_eq!(old.3[2], "--jwt-leeway (MCPFLEET_JWT_LEEWAY) without a unit is deprecated: write 3s");
        for both in [
            ["--jwks-timeout", "1s", "--jwks-timeout-ms", "1000"],
            ["--jwks-refresh-interval", "1s", "--jwks-refresh-interval-secs", "1"],
        ] {
            let e = jwt(&both).unwrap_err().to_string();
            assert!(e.contains("cannot be used with"), "{e}");
        }
        assert!(jwt(&["--jwks-timeout-ms", "99"]).is_err(), "the alias keeps its range");
        assert!(jwt(&["--jwks-timeout", "5000"]).is_err(), "a new name needs a unit");
    }
}
