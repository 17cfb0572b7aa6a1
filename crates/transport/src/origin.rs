//! DNS-rebinding protection: `Origin` and `Host` allowlists, checked before anything else.

use crate::error::TransportError;
use axum::http::{HeaderMap, header};

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

/// Checks `Origin` (absent is allowed) and `Host` (required).
pub(crate) fn check(headers: &HeaderMap, origins: &[HostPattern], hosts: &[HostPattern]) -> Result<(), TransportError> {
    let mut origin = headers.get_all(header::ORIGIN).iter();
    if let Some(o) = origin.next() {
        let ok = origin.next().is_none() && o.to_str().is_ok_and(|o| origins.iter().any(|p| p.matches(o)));
        if !ok {
            return Err(TransportError::ForbiddenOrigin);
        }
    }
    let mut host = headers.get_all(header::HOST).iter();
    let ok = match (host.next(), host.next()) {
        (Some(h), None) => h.to_str().is_ok_and(|h| hosts.iter().any(|p| p.matches(h))),
        _ => false,
    };
    if ok { Ok(()) } else { Err(TransportError::ForbiddenHost) }
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
}
