//! What a request carries, read and checked: its parameters (a query string or a form body), its `Content-Type`,
//! a `Host`'s port, loopback redirect URIs, PKCE values and the subject a `login_hint` names; and a redirect URI
//! with the answer in its query.

use super::error::{OAuthError, invalid_request};
use http::{HeaderMap, header};
use std::collections::BTreeMap;

/// Longest `login_hint` taken as the subject.
const MAX_SUBJECT_BYTES: usize = 64;
/// The subject when the client gives no usable `login_hint`.
const DEFAULT_SUBJECT: &str = "dev";

/// Whether `host` (as in a URL, IPv6 in brackets) is a loopback name: `localhost`, `127.0.0.1` or `[::1]`.
fn loopback(host: &str) -> bool {
    ["localhost", "127.0.0.1", "[::1]"].iter().any(|l| host.eq_ignore_ascii_case(l))
}

/// The port of a `Host` value (80 when it names none).
pub(super) fn host_port(host: &str) -> Option<u16> {
    let after_name = match host.strip_prefix('[') {
        Some(v6) => v6.split_once(']')?.1,
        None => host.find(':').map_or("", |i| &host[i..]),
    };
    match after_name.strip_prefix(':') {
        Some(port) => port.parse().ok(),
        None if after_name.is_empty() => Some(80),
        None => None,
    }
}

/// An absolute `http`/`https` URL on a loopback host, without user info or fragment.
pub(super) fn loopback_url(raw: &str) -> Option<http::Uri> {
    if raw.contains('#') {
        return None;
    }
    let uri: http::Uri = raw.parse().ok()?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    let authority = uri.authority()?;
    (scheme_ok && !authority.as_str().contains('@') && loopback(authority.host())).then_some(uri)
}

/// RFC 7636 §4.1: 43 to 128 characters of `[A-Za-z0-9-._~]`.
pub(super) fn pkce_value(s: &str) -> bool {
    (43..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
}

/// `login_hint` as a subject: `[A-Za-z0-9._@-]{1,64}`.
pub(super) fn subject(hint: Option<&str>) -> &str {
    match hint {
        Some(h)
            if !h.is_empty()
                && h.len() <= MAX_SUBJECT_BYTES
                && h.bytes().all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b)) =>
        {
            h
        }
        _ => DEFAULT_SUBJECT,
    }
}

/// A name from the client, cut for an error description.
pub(super) fn shown(s: &str) -> String {
    s.chars().take(64).collect()
}

/// The parameters of a query string or a form body. A parameter without a value counts as absent, and one
/// given twice is refused (RFC 6749 §3.1, §3.2).
pub(super) fn params(raw: &[u8]) -> Result<BTreeMap<String, String>, OAuthError> {
    let mut map = BTreeMap::new();
    for (name, value) in form_urlencoded::parse(raw) {
        if value.is_empty() {
            continue;
        }
        if map.insert(name.to_string(), value.into_owned()).is_some() {
            return Err(invalid_request(format!("the parameter {} is given more than once", shown(&name))));
        }
    }
    Ok(map)
}

/// `uri` with `pairs` appended to its query (absent values are left out).
pub(super) fn with_query(uri: &str, pairs: &[(&str, Option<&str>)]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        if let Some(v) = value {
            query.append_pair(name, v);
        }
    }
    let sep = if uri.contains('?') { '&' } else { '?' };
    format!("{uri}{sep}{}", query.finish())
}

/// Whether the single `Content-Type` is `expected` (parameters such as `charset` ignored).
pub(super) fn content_type_is(headers: &HeaderMap, expected: &str) -> bool {
    let mut all = headers.get_all(header::CONTENT_TYPE).iter();
    match (all.next(), all.next()) {
        (Some(v), None) => v
            .to_str()
            .is_ok_and(|v| v.split(';').next().is_some_and(|essence| essence.trim().eq_ignore_ascii_case(expected))),
        _ => false,
    }
}
