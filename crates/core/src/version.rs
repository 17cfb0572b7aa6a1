//! The MCP protocol versions this server speaks, as a type: two generations, compared by date, never as strings.

use std::fmt;
use std::str::FromStr;

/// A protocol revision. The order is the revisions' order in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProtocolVersion {
    /// 2025-03-26: sessions; no `MCP-Protocol-Version` header yet (an absent header means this revision).
    V2025_03_26,
    /// 2025-06-18.
    V2025_06_18,
    /// 2025-11-25: the newest of the session generation (priming events carry empty `data:`).
    V2025_11_25,
    /// 2026-07-28: the stateless generation (per-request `_meta`, no session).
    V2026_07_28,
}

impl ProtocolVersion {
    /// The session generation, oldest first.
    pub const SESSION: [Self; 3] = [Self::V2025_03_26, Self::V2025_06_18, Self::V2025_11_25];
    /// The stateless generation.
    pub const STATELESS: [Self; 1] = [Self::V2026_07_28];
    /// Every version, newest first (the order of a `supported` list).
    pub const NEWEST_FIRST: [Self; 4] = [Self::V2026_07_28, Self::V2025_11_25, Self::V2025_06_18, Self::V2025_03_26];
    /// What an absent `MCP-Protocol-Version` header means.
    pub const DEFAULT: Self = Self::V2025_03_26;

    /// The version as the wire spells it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::V2025_03_26 => "2025-03-26",
            Self::V2025_06_18 => "2025-06-18",
            Self::V2025_11_25 => "2025-11-25",
            Self::V2026_07_28 => "2026-07-28",
        }
    }

    /// A version this server speaks, by its wire name.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Self::SESSION.into_iter().chain(Self::STATELESS).find(|v| v.as_str() == s)
    }

    /// Whether this is the stateless generation.
    #[must_use]
    pub fn is_stateless(self) -> bool {
        self >= Self::V2026_07_28
    }

    /// Whether an SSE priming event may carry an empty `data:` line (2025-11-25 and later; older clients fail on
    /// empty data).
    #[must_use]
    pub fn primes_with_data(self) -> bool {
        self >= Self::V2025_11_25
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown protocol version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownVersion;

impl FromStr for ProtocolVersion {
    type Err = UnknownVersion;
    fn from_str(s: &str) -> Result<Self, UnknownVersion> {
        Self::parse(s).ok_or(UnknownVersion)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_order_and_split_into_generations() {
        for v in ProtocolVersion::SESSION.into_iter().chain(ProtocolVersion::STATELESS) {
            assert_eq!(ProtocolVersion::parse(v.as_str()), Some(v));
            assert_eq!(v.to_string().parse::<ProtocolVersion>(), Ok(v));
        }
        assert!(ProtocolVersion::SESSION.windows(2).all(|w| w[0] < w[1]));
        assert!(ProtocolVersion::SESSION.iter().all(|v| !v.is_stateless()));
        assert!(ProtocolVersion::V2026_07_28.is_stateless());
        assert!(!ProtocolVersion::V2025_06_18.primes_with_data() && ProtocolVersion::V2025_11_25.primes_with_data());
        for bad in ["", "2025-11-26", "2025-11-25 ", "draft", "2024-11-05"] {
            assert_eq!(ProtocolVersion::parse(bad), None, "{bad:?}");
        }
    }
}
