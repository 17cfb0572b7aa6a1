//! A value that must never reach a log or an error message.

use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;

/// A secret from the command line or the environment: a bearer token, a Redis URL (it may hold a password), a
/// `requestState` signing key. `Debug` prints `[redacted]` and there is no `Display`, so neither `{:?}` of a config
/// nor a `tracing` field can print it; [`Secret::expose`] reads it where it is used.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    #[must_use]
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself: for the one place that uses it, never for a log line.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Any string; what makes it valid is checked where it is used.
impl FromStr for Secret {
    type Err = Infallible;
    fn from_str(s: &str) -> Result<Self, Infallible> {
        Ok(Self::new(s))
    }
}

/// A key ring given as `KID:BASE64SECRET` values of `flag` (`--request-state-key`, `--downstream-key`): each
/// `(kid, secret bytes)`, in order; standard or URL-safe base64.
///
/// # Errors
/// A value without `:`, or a secret that is not base64: a configuration error naming the flag and the key id.
pub(super) fn key_ring(raw: &[Secret], flag: &str) -> Result<Vec<(String, Vec<u8>)>, crate::ServerError> {
    use base64::Engine as _;
    raw.iter()
        .map(|r| {
            let Some((kid, secret)) = r.expose().split_once(':') else {
                return Err(super::cli::config_error(format!("{flag} must be KID:BASE64SECRET")));
            };
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(secret)
                .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(secret))
                .map_err(|_| super::cli::config_error(format!("{flag} {kid:?}: the secret is not base64")))?;
            Ok((kid.to_owned(), bytes))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "[redacted]");
        assert_eq!(format!("{:?}", Some(vec![s.clone()])), "Some([[redacted]])");
        assert_eq!(s.expose(), "hunter2");
    }
}
