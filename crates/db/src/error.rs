//! The one error type of the database crate.

/// What went wrong with the database. The messages never hold a password; hosts appear only where an operator
/// reads them (start-up lines, logs), never in a tool's answer.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The database URL or one of its settings is unusable.
    #[error("invalid database url: {0}")]
    Url(String),
    /// TLS could not be set up (a CA file that cannot be read, no root certificates).
    #[error("database tls: {0}")]
    Tls(String),
    /// The database cannot be reached, or did not answer in time: waiting may help.
    #[error("cannot reach the database: {0}")]
    Unavailable(String),
    /// The database turns the connection away in a way waiting never fixes: a wrong password or user, a database
    /// that does not exist, a TLS or certificate failure.
    #[error("the database refuses the connection: {0}")]
    Refused(String),
    /// The database answered with an error.
    #[error("database error: {0}")]
    Query(String),
    /// A migration that was applied differs from the one this binary carries.
    #[error("migration {version:04} ({name}) was changed after it was applied: its checksum differs")]
    Checksum { version: i64, name: &'static str },
}

impl DbError {
    /// Classifies a driver error: I/O and closed connections are [`DbError::Unavailable`], the rest is a query
    /// error with the server's message (never the statement's parameters).
    pub(crate) fn of(e: &tokio_postgres::Error) -> Self {
        let text = match e.as_db_error() {
            Some(db) => format!("{} ({})", db.message(), db.code().code()),
            None => e.to_string(),
        };
        if unavailable(e) { Self::Unavailable(text) } else { Self::Query(text) }
    }

    /// Classifies a pool error: failing to connect is always [`DbError::Unavailable`].
    pub(crate) fn of_pool(e: &deadpool_postgres::PoolError) -> Self {
        match e {
            // Connecting failed: refused, timed out, or turned away by the server (pg_hba, a bad password).
            deadpool_postgres::PoolError::Backend(b) => match b.as_db_error() {
                // Class 28 (invalid authorization: a password, pg_hba, encryption required) and 3D000 (no such
                // database) never heal by waiting.
                Some(db) if db.code().code().starts_with("28") || db.code().code() == "3D000" => {
                    Self::Refused(format!("{} ({})", db.message(), db.code().code()))
                }
                Some(db) => Self::Unavailable(format!("{} ({})", db.message(), db.code().code())),
                None if is_tls(b) => Self::Refused(b.to_string()),
                None => Self::Unavailable(b.to_string()),
            },
            other => Self::Unavailable(other.to_string()),
        }
    }
}

/// A TLS failure (a handshake, a certificate, a server without TLS where it is required): the driver names it
/// only in its message.
fn is_tls(e: &tokio_postgres::Error) -> bool {
    let text = format!("{e} {:?}", std::error::Error::source(e));
    ["TLS", "tls", "certificate", "Certificate", "InvalidCertificate", "UnknownIssuer"].iter().any(|m| text.contains(m))
}

/// Whether a driver error means that the database cannot serve now (try again later) rather than a bug or a broken
/// schema: no SQLSTATE (I/O, connecting), a closed connection, or the server saying so: class 08 (connection
/// exception), 53 (out of resources), 57P01–57P03 (shutting down, starting), 57014 (a statement timeout or cancel),
/// 25006 (a read-only server during a failover). The one classification of the workspace: the repositories use it
/// too.
#[must_use]
pub fn unavailable(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    let Some(code) = e.code() else { return true };
    let c = code.code();
    e.is_closed()
        || c.starts_with("08")
        || c.starts_with("53")
        || c.starts_with("57P")
        || *code == SqlState::QUERY_CANCELED
        || *code == SqlState::READ_ONLY_SQL_TRANSACTION
}
