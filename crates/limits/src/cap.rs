//! The caps a principal can reach: what each counts, the flag that sets it, and its metric kind.

use crate::Kind;
use std::fmt;

/// The caps a principal can reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    Sessions,
    Streams,
    Inflight,
    /// Open (not yet ended) tasks of the tasks extension.
    Tasks,
}

impl fmt::Display for Cap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Sessions => "open sessions",
            Self::Streams => "open SSE streams",
            Self::Inflight => "tool calls in flight",
            Self::Tasks => "open tasks",
        })
    }
}

impl Cap {
    /// The flag that sets this cap.
    #[must_use]
    pub fn flag(self) -> &'static str {
        match self {
            Self::Sessions => "--max-sessions-per-user",
            Self::Streams => "--max-streams-per-user",
            Self::Inflight => "--max-inflight-per-user",
            Self::Tasks => "--max-tasks-per-user",
        }
    }

    pub(crate) fn kind(self) -> Kind {
        match self {
            Self::Sessions => Kind::Sessions,
            Self::Streams => Kind::Streams,
            Self::Inflight => Kind::Inflight,
            Self::Tasks => Kind::Tasks,
        }
    }
}
