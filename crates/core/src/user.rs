//! Who a request is from, as the rest of the system keys it.

use std::fmt;

/// The bytes of an opaque key or id: `[A-Za-z0-9_-]`, so that it can sit inside a Redis key name and its hash tag.
#[must_use]
pub fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// The opaque, stable key of a user: a hash of the verified principal. It becomes part of Redis key names and
/// their hash tag, so it is limited to `[A-Za-z0-9_-]{1,64}` and can never contain `{`, `}` or `:`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct UserKey(String);

impl UserKey {
    /// Accepts an already-hashed user key.
    #[must_use]
    pub fn new(raw: &str) -> Option<Self> {
        (!raw.is_empty() && raw.len() <= 64 && raw.bytes().all(is_token_char)).then(|| Self(raw.to_owned()))
    }
    /// The one principal of `--auth none`.
    #[must_use]
    pub fn anonymous() -> Self {
        Self("anonymous".to_owned())
    }

    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for UserKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UserKey({})", self.0)
    }
}
