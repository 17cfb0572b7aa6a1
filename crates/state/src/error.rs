use std::time::Duration;

/// Why a store call failed. Cloned for each admission of a batch that failed.
#[derive(Clone, Debug, thiserror::Error)]
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

impl StateError {
    /// The store could not be reached, and waiting may help: a refused or timed-out connection, a host that is
    /// unreachable or whose name does not resolve yet, a node still loading its data, a cluster without a master for
    /// a slot. A wrong password, a TLS or certificate failure, a connection the server closed at once (plain TCP to
    /// a TLS port), a master name no sentinel knows, or a reply we cannot read are not: waiting never fixes them.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Timeout(_) => true,
            Self::Unavailable(e) => redis_transient(e),
            _ => false,
        }
    }
}

impl StateError {
    /// Redis refused the command to this ACL user (`NOPERM`).
    #[must_use]
    pub fn is_not_permitted(&self) -> bool {
        matches!(self, Self::Unavailable(e) if e.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoPerm)
            || e.code() == Some("NOPERM"))
    }
}

fn redis_transient(e: &::redis::RedisError) -> bool {
    use ::redis::{ErrorKind, ServerErrorKind};
    if e.is_timeout() || e.is_connection_refusal() {
        return true;
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown,
        )
        | ErrorKind::ClusterConnectionNotFound => true,
        ErrorKind::Io => io_transient(e),
        _ => false,
    }
}

/// An I/O error that waiting may fix, besides the refusals and timeouts redis-rs names itself: no route to the host,
/// no network, no local address, a name that does not resolve (yet). redis-rs keeps the `std::io::Error` private, so
/// its message (the operating system's) is what there is to read.
fn io_transient(e: &::redis::RedisError) -> bool {
    let text = e.to_string();
    ["os error 113", "os error 101", "os error 99", "lookup address", "No route to host", "Network is unreachable"]
        .iter()
        .any(|m| text.contains(m))
}

impl From<::redis::RedisError> for StateError {
    fn from(e: ::redis::RedisError) -> Self {
        Self::Unavailable(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    fn io(kind: ErrorKind, msg: &str) -> StateError {
        StateError::Unavailable(::redis::RedisError::from(Error::new(kind, msg.to_owned())))
    }

    #[test]
    fn waiting_helps_only_where_the_store_is_away() {
        assert!(StateError::Timeout(Duration::from_secs(1)).is_transient());
        assert!(io(ErrorKind::ConnectionRefused, "Connection refused (os error 111)").is_transient());
        assert!(io(ErrorKind::TimedOut, "timed out").is_transient());
        assert!(io(ErrorKind::HostUnreachable, "No route to host (os error 113)").is_transient());
        assert!(io(ErrorKind::Other, "failed to lookup address information: Name or service not known").is_transient());
        let loading =
            ::redis::RedisError::from((::redis::ErrorKind::Server(::redis::ServerErrorKind::BusyLoading), "LOADING"));
        assert!(StateError::Unavailable(loading).is_transient());
        let auth = ::redis::RedisError::from((::redis::ErrorKind::AuthenticationFailed, "WRONGPASS"));
        assert!(!StateError::Unavailable(auth).is_transient(), "a wrong password never heals");
        assert!(!io(ErrorKind::InvalidData, "invalid peer certificate: UnknownIssuer").is_transient(), "TLS");
        assert!(!io(ErrorKind::UnexpectedEof, "unexpected end of file").is_transient(), "plain TCP to a TLS port");
        assert!(!StateError::Protocol("the sentinels do not know the master name").is_transient());
    }
}
