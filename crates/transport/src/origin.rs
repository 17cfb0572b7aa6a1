//! DNS-rebinding protection: `Origin` and `Host` allowlists, checked before anything else, and the allowed `Host`
//! a request used, which `--auth dev` keeps in scope while the request is answered (its challenges and metadata
//! are named after it).

use crate::AppState;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::Response;
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
    let mut origin = headers.get_all(header::ORIGIN).iter();
    if let Some(o) = origin.next() {
        let ok = origin.next().is_none() && o.to_str().is_ok_and(|o| origins.iter().any(|p| p.matches(o)));
        if !ok {
            return Err(Forbidden::Origin);
        }
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
