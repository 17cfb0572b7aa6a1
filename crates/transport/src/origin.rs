//! DNS-rebinding protection and CORS, in one place: the `Origin` and `Host` allowlists, checked before anything
//! else; the CORS answers to the allowed origins (a preflight answered here, never authenticated, counted or
//! logged as a call; every other answer marked readable by that origin); and the allowed `Host` a request used,
//! which `--auth dev` keeps in scope while the request is answered (its challenges and metadata are named after it).
//!
//! CORS follows the allowlist exactly: an origin that may act may read the answers, with bearer tokens only
//! (`Access-Control-Allow-Credentials` is never sent: no cookie is ever a credential here). A request whose
//! `Origin` is not allowed gets no CORS header and is refused with 403 by the endpoint, whatever its method.

use crate::AppState;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use mcpfleet_auth::ProtectedResource;

tokio::task_local! {
    /// The allowed `Host` of the request being answered, for the challenges of `--auth dev`.
    static HOST: String;
}

/// One allowlist entry: an exact value, or a value with `:*` for any port (or none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPattern {
    base: String,
    any_port: bool,
}

impl HostPattern {
    /// Parses `value` or `value:*`, case-insensitively.
    #[must_use]
    pub fn parse(raw: &str) -> Option<Self> {
        let raw = raw.trim().to_ascii_lowercase();
        if raw.is_empty() || raw.chars().any(|c| c.is_whitespace() || c == ',') {
            return None;
        }
        Some(match raw.strip_suffix(":*") {
            Some(base) if !base.is_empty() => Self { base: base.to_owned(), any_port: true },
            Some(_) => return None,
            None => Self { base: raw, any_port: false },
        })
    }

    #[must_use]
    pub fn matches(&self, value: &str) -> bool {
        let v = value.to_ascii_lowercase();
        if v == self.base {
            return true;
        }
        self.any_port
            && v.strip_prefix(&self.base)
                .and_then(|rest| rest.strip_prefix(':'))
                .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    }

    fn list(items: &[&str]) -> Vec<Self> {
        items.iter().filter_map(|s| Self::parse(s)).collect()
    }

    /// `http://localhost:*`, `http://127.0.0.1:*`, `http://[::1]:*`.
    #[must_use]
    pub fn loopback_origins() -> Vec<Self> {
        Self::list(&["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"])
    }

    /// `localhost:*`, `127.0.0.1:*`, `[::1]:*`.
    #[must_use]
    pub fn loopback_hosts() -> Vec<Self> {
        Self::list(&["localhost:*", "127.0.0.1:*", "[::1]:*"])
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.base, if self.any_port { ":*" } else { "" })
    }
}

/// Which DNS-rebinding check refused a request (`error.rs` turns it into the transport's refusal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Forbidden {
    /// An `Origin` not allowed, or more than one.
    Origin,
    /// A `Host` not allowed, missing, or more than one.
    Host,
}

/// Checks `Origin` (absent is allowed) and `Host` (required).
pub(crate) fn check(headers: &HeaderMap, origins: &[HostPattern], hosts: &[HostPattern]) -> Result<(), Forbidden> {
    if headers.contains_key(header::ORIGIN) && allowed_origin(headers, origins).is_none() {
        return Err(Forbidden::Origin);
    }
    let mut host = headers.get_all(header::HOST).iter();
    let ok = match (host.next(), host.next()) {
        (Some(h), None) => h.to_str().is_ok_and(|h| hosts.iter().any(|p| p.matches(h))),
        _ => false,
    };
    if ok { Ok(()) } else { Err(Forbidden::Host) }
}

/// The single `Host` of a request, lowercased, when the allowlist admits it.
pub(crate) fn allowed_host(headers: &HeaderMap, allowed: &[HostPattern]) -> Option<String> {
    let mut all = headers.get_all(header::HOST).iter();
    let (Some(host), None) = (all.next(), all.next()) else { return None };
    let host = host.to_str().ok()?.to_ascii_lowercase();
    let sane = !host.is_empty() && host.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b));
    (sane && allowed.iter().any(|p| p.matches(&host))).then_some(host)
}

/// The request headers a browser client of `/mcp` sends (besides the CORS-safelisted ones): the MCP headers of
/// both generations, the access token and its DPoP proof, W3C trace context and the request id. `Mcp-Param-*` headers (2026-07-28,
/// named after a tool's parameters) are allowed when asked for, by name.
const MCP_REQUEST_HEADERS: &str = "authorization, content-type, accept, mcp-session-id, mcp-protocol-version, \
     last-event-id, mcp-method, mcp-name, dpop, traceparent, tracestate, x-request-id";
/// The answer headers a browser client may read: the session, the version, the challenges and the DPoP nonce, the
/// rate limits and the request id.
const EXPOSED_HEADERS: &str = "mcp-session-id, mcp-protocol-version, www-authenticate, dpop-nonce, retry-after, \
     ratelimit, ratelimit-policy, x-request-id";
/// How long a browser may keep a preflight's answer: two hours, Chromium's own cap. The allowlist still decides
/// every answer (a removed origin loses `Access-Control-Allow-Origin` at once); only the preflight is skipped.
const PREFLIGHT_MAX_AGE: &str = "7200";
/// At most this many `Mcp-Param-*` names are echoed from one preflight, each at most this long.
const MAX_PARAM_HEADERS: usize = 32;
const MAX_HEADER_NAME: usize = 96;

/// Which endpoint a CORS layer guards, for the methods and headers its preflight allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CorsFor {
    /// `/mcp`: GET, POST, DELETE and the MCP headers.
    Mcp,
    /// The dev sign-in's `register` and `token`: POST, with `Content-Type` and `Authorization` (client secrets).
    OAuth,
}

impl CorsFor {
    fn methods(self) -> &'static str {
        match self {
            Self::Mcp => "GET, POST, DELETE",
            Self::OAuth => "POST",
        }
    }

    fn headers(self) -> &'static str {
        match self {
            Self::Mcp => MCP_REQUEST_HEADERS,
            Self::OAuth => "authorization, content-type, accept, mcp-protocol-version, dpop",
        }
    }
}

/// The request's `Origin`, when there is exactly one and the allowlist admits it.
fn allowed_origin<'a>(headers: &'a HeaderMap, origins: &[HostPattern]) -> Option<&'a HeaderValue> {
    let mut all = headers.get_all(header::ORIGIN).iter();
    let (Some(o), None) = (all.next(), all.next()) else { return None };
    o.to_str().is_ok_and(|s| origins.iter().any(|p| p.matches(s))).then_some(o)
}

/// The `Mcp-Param-*` names a preflight asks for, lowercased, bounded (`Mcp` only).
fn param_headers(headers: &HeaderMap) -> Vec<String> {
    let token = |n: &str| {
        !n.is_empty()
            && n.len() <= MAX_HEADER_NAME
            && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    headers
        .get_all(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| n.starts_with("mcp-param-") && token(n))
        .take(MAX_PARAM_HEADERS)
        .collect()
}

/// The answer to a CORS preflight from an allowed origin: 204, never authenticated, counted or logged as a call.
fn preflight(origin: HeaderValue, headers: &HeaderMap, what: CorsFor) -> Response {
    let mut allow = what.headers().to_owned();
    if what == CorsFor::Mcp {
        for name in param_headers(headers) {
            allow.push_str(", ");
            allow.push_str(&name);
        }
    }
    let mut resp = StatusCode::NO_CONTENT.into_response();
    let h = resp.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.insert(header::VARY, HeaderValue::from_static(VARY));
    h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static(what.methods()));
    if let Ok(v) = HeaderValue::from_str(&allow) {
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, v);
    }
    h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static(PREFLIGHT_MAX_AGE));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// What the answers vary on: the `Origin` (CORS) and, for a preflight, what it asked for.
const VARY: &str = "Origin, Access-Control-Request-Method, Access-Control-Request-Headers";

/// The answer to a CORS preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) from an allowed
/// origin to an allowed `Host`, if `req` is one. A preflight that is not allowed gets `None` and goes on to the
/// endpoint, which refuses it with 403 like any other request.
pub(crate) fn preflight_answer(app: &AppState, req: &Request, what: CorsFor) -> Option<Response> {
    if req.method() != Method::OPTIONS || !req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD) {
        return None;
    }
    let origins = &app.config.allowed_origins;
    check(req.headers(), origins, &app.config.allowed_hosts).ok()?;
    let origin = allowed_origin(req.headers(), origins)?.clone();
    Some(preflight(origin, req.headers(), what))
}

/// The request's `Origin`, when the allowlist admits it: its answer is marked readable by that origin.
pub(crate) fn reader(app: &AppState, headers: &HeaderMap) -> Option<HeaderValue> {
    allowed_origin(headers, &app.config.allowed_origins).cloned()
}

/// Marks an answer: `Vary: Origin` always, and for an allowed origin (`reader`) the headers that let it read the
/// answer and the headers a client needs.
pub(crate) fn expose(resp: &mut Response, reader: Option<HeaderValue>) {
    let h = resp.headers_mut();
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    if let Some(origin) = reader {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static(EXPOSED_HEADERS));
    }
}

/// CORS as a layer, for the dev sign-in's `register` and `token` (`/mcp` does the same at the start and the end of
/// `observe`, so that a preflight is never counted or logged, without a layer of its own on the hot path).
pub(crate) async fn cors(State((app, what)): State<(AppState, CorsFor)>, req: Request, next: Next) -> Response {
    if let Some(answer) = preflight_answer(&app, &req, what) {
        return answer;
    }
    let origin = reader(&app, req.headers());
    let mut resp = next.run(req).await;
    expose(&mut resp, origin);
    resp
}

/// Middleware of `--auth dev`: keeps the request's allowed `Host` in scope while the request is answered, so that
/// every challenge (`error::auth_rejection`, from the extractors and the scope checks alike) points at the
/// metadata under the name the client used. A request whose `Host` is not allowed is refused before any
/// challenge by the `Caller` extractor.
pub(crate) async fn with_host(State(app): State<AppState>, req: Request, next: Next) -> Response {
    match allowed_host(req.headers(), &app.config.allowed_hosts) {
        Some(host) => HOST.scope(host, next.run(req)).await,
        None => next.run(req).await,
    }
}

/// With `--auth dev`, while a request is answered: the protected resource as its client named it.
pub(crate) fn request_resource(app: &AppState) -> Option<ProtectedResource> {
    let dev = app.config.dev_oauth.as_ref()?;
    HOST.try_with(|host| dev.protected_resource(host)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_ports_only_where_asked() {
        let any = HostPattern::parse("http://localhost:*").unwrap();
        assert!(any.matches("http://localhost"));
        assert!(any.matches("http://LOCALHOST:3000"));
        assert!(!any.matches("http://localhost.evil.com"));
        assert!(!any.matches("http://localhost:3000.evil.com"));
        let exact = HostPattern::parse("mcp.example.com:443").unwrap();
        assert!(exact.matches("mcp.example.com:443"));
        assert!(!exact.matches("mcp.example.com"));
        assert!(HostPattern::parse(":*").is_none());
        assert!(HostPattern::parse("a,b").is_none());
    }

    #[test]
    fn only_a_single_allowed_host_is_taken() {
        use axum::http::HeaderValue;
        let allowed = HostPattern::loopback_hosts();
        let mut h = HeaderMap::new();
        assert_eq!(allowed_host(&h, &allowed), None);
        h.insert(header::HOST, HeaderValue::from_static("LocalHost:8080"));
        assert_eq!(allowed_host(&h, &allowed).as_deref(), Some("localhost:8080"));
        h.insert(header::HOST, HeaderValue::from_static("[::1]:8080"));
        assert_eq!(allowed_host(&h, &allowed).as_deref(), Some("[::1]:8080"));
        h.insert(header::HOST, HeaderValue::from_static("evil.example:8080"));
        assert_eq!(allowed_host(&h, &allowed), None);
        h.insert(header::HOST, HeaderValue::from_static("localhost:8080"));
        h.append(header::HOST, HeaderValue::from_static("localhost:8080"));
        assert_eq!(allowed_host(&h, &allowed), None);
    }
}
