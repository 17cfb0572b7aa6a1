//! RFC 6750: the bearer token of a request, from its one `Authorization` header. A token in the URL is refused
//! (it would land in access logs, browser history and `Referer` headers) and is never logged.

use crate::AuthError;
use http::request::Parts;

/// Longest accepted bearer token, in bytes. Real access tokens are a few KiB at most.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// The bytes of a b64token but its trailing `=`: a table, since every request's token is checked byte by byte.
const B64TOKEN: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        #[expect(clippy::cast_possible_truncation, reason = "b < 256")]
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~' | b'+' | b'/');
        b += 1;
    }
    t
};

/// Whether the query string carries an `access_token` parameter (RFC 6750 §2.3), which this server refuses.
#[must_use]
pub fn token_in_query(parts: &Parts) -> bool {
    parts.uri.query().is_some_and(|q| {
        q.split('&').any(|pair| {
            let name = pair.split('=').next().unwrap_or("");
            name.eq_ignore_ascii_case("access_token") || name.eq_ignore_ascii_case("access%5Ftoken")
        })
    })
}

/// How a request presents its access token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// `Authorization: Bearer` (RFC 6750).
    Bearer,
    /// `Authorization: DPoP`, with a `DPoP` proof header (RFC 9449).
    Dpop,
}

/// The access token of the request and its scheme: Bearer, or DPoP when `dpop` is accepted.
///
/// # Errors
/// As [`token`]; the DPoP scheme when `dpop` is false is another scheme.
pub fn credentials(parts: &Parts, dpop: bool) -> Result<(Scheme, &str), AuthError> {
    let dpop_token = dpop
        .then(|| parts.headers.get(http::header::AUTHORIZATION)?.to_str().ok())
        .flatten()
        .and_then(|v| v.split_once(' ').filter(|(s, _)| s.eq_ignore_ascii_case("dpop")).map(|(_, t)| t));
    if let Some(t) = dpop_token
        && parts.headers.get_all(http::header::AUTHORIZATION).iter().count() == 1
    {
        if token_in_query(parts) {
            return Err(AuthError::InvalidRequest("access tokens are accepted only in the Authorization header"));
        }
        return Ok((Scheme::Dpop, checked(t.trim_matches(' '))?));
    }
    token(parts).map(|t| (Scheme::Bearer, t))
}

/// The bearer token of the request.
///
/// # Errors
/// [`AuthError::MissingCredentials`] without an `Authorization` header; [`AuthError::InvalidRequest`] for a token
/// in the query string, two `Authorization` headers, another scheme, or an empty or malformed bearer token;
/// [`AuthError::InvalidToken`] for an oversized one.
pub fn token(parts: &Parts) -> Result<&str, AuthError> {
    if token_in_query(parts) {
        return Err(AuthError::InvalidRequest("access tokens are accepted only in the Authorization header"));
    }
    let mut all = parts.headers.get_all(http::header::AUTHORIZATION).iter();
    let value = match (all.next(), all.next()) {
        (None, _) => return Err(AuthError::MissingCredentials),
        (Some(v), None) => v,
        (Some(_), Some(_)) => return Err(AuthError::InvalidRequest("more than one Authorization header")),
    };
    let value = value.to_str().map_err(|_| AuthError::InvalidRequest("the Authorization header is not ASCII"))?;
    let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::InvalidRequest("the Authorization scheme must be Bearer"));
    }
    checked(rest.trim_matches(' '))
}

/// `token` if it is a non-empty b64token of at most [`MAX_TOKEN_BYTES`].
fn checked(token: &str) -> Result<&str, AuthError> {
    if token.is_empty() {
        return Err(AuthError::InvalidRequest("the bearer token is empty"));
    }
    // b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
    let body = token.trim_end_matches('=');
    if body.is_empty() || !body.bytes().all(|b| B64TOKEN[usize::from(b)]) {
        return Err(AuthError::InvalidRequest("the bearer token is not a b64token"));
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(AuthError::InvalidToken("the token is too long"));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, auth: &[&str]) -> Parts {
        let mut b = http::Request::builder().uri(uri);
        for a in auth {
            b = b.header(http::header::AUTHORIZATION, *a);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn reads_one_bearer_token_and_refuses_everything_else() {
        assert_eq!(token(&parts("/mcp", &["Bearer abc.def.ghi"])).unwrap(), "abc.def.ghi");
        assert_eq!(token(&parts("/mcp", &["bearer abc"])).unwrap(), "abc");
        assert!(matches!(token(&parts("/mcp", &[])), Err(AuthError::MissingCredentials)));
        for bad in ["Basic dXNlcjpwYXNz", "Bearer", "Bearer ", "Bearer a b", "Bearer ==", "Token abc"] {
            assert!(matches!(token(&parts("/mcp", &[bad])), Err(AuthError::InvalidRequest(_))), "{bad}");
        }
        assert!(matches!(token(&parts("/mcp", &["Bearer a", "Bearer b"])), Err(AuthError::InvalidRequest(_))));
        assert!(matches!(token(&parts("/mcp?access_token=x", &["Bearer a"])), Err(AuthError::InvalidRequest(_))));
        assert!(matches!(token(&parts("/mcp?x=1&ACCESS_TOKEN=x", &[])), Err(AuthError::InvalidRequest(_))));
        assert!(token(&parts("/mcp?not_access_token=x", &["Bearer a"])).is_ok());
    }
}
