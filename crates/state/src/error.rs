use std::time::Duration;

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("session not found")]
    SessionNotFound,
    #[error("session id already exists")]
    Conflict,
    #[error("stream already has its final event")]
    StreamFinished,
    #[error("a later event of this stream is already committed")]
    Superseded,
    #[error("event cursor is no longer retained")]
    CursorGone,
    #[error("state store did not answer within {0:?}")]
    Timeout(Duration),
    #[error("state store unavailable")]
    Unavailable(#[source] ::redis::RedisError),
    #[error("state store returned an unexpected reply: {0}")]
    Protocol(&'static str),
}

impl StateError {
    /// The store did not answer in time (our deadline, or the client's own response timeout).
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        match self {
            Self::Timeout(_) => true,
            Self::Unavailable(e) => e.is_timeout(),
            _ => false,
        }
    }
}

impl From<::redis::RedisError> for StateError {
    fn from(e: ::redis::RedisError) -> Self {
        Self::Unavailable(e)
    }
}
