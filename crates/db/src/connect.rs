//! The pool: a `postgres://` URL (libpq's `sslmode` and `sslrootcert` included) turned into a deadpool of
//! tokio-postgres connections over rustls, with the process's one crypto provider (ring).
//!
//! `sslmode` follows libpq: `disable` (plain), `prefer` (TLS when the server offers it, certificate not checked),
//! `require` (TLS, certificate not checked), `verify-ca` (TLS, the chain checked against the roots), `verify-full`
//! (chain and host name). The roots are `sslrootcert` (a PEM file) or, without it, the system's.

use crate::DbError;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Result<Self, DbError> {
        Ok(match s {
            "disable" => Self::Disable,
            "prefer" | "allow" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(DbError::Url(format!(
                    "sslmode={other}: use disable, prefer, require, verify-ca or verify-full"
                )));
            }
        })
    }
}

/// How to reach the database.
#[derive(Clone)]
pub struct DbSettings {
    /// `postgres://user:password@host:port/db?sslmode=…&sslrootcert=…`. It may hold a password.
    pub url: String,
    /// Connections per replica.
    pub pool_size: usize,
    /// Deadline of connecting, of waiting for a pooled connection, and of each operation of the callers.
    pub timeout: Duration,
}

impl std::fmt::Debug for DbSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbSettings")
            .field("url", &"[redacted]")
            .field("pool_size", &self.pool_size)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A pool of connections to one database, and where it points (for logs: never the password).
#[derive(Clone)]
pub struct Database {
    pool: Pool,
    target: String,
    timeout: Duration,
    ssl: SslMode,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database").field("target", &self.target).field("ssl", &self.ssl).finish_non_exhaustive()
    }
}

impl Database {
    /// Builds the pool. Nothing connects yet: the first use does (see [`Database::ping`]).
    ///
    /// # Errors
    /// [`DbError::Url`] for a URL tokio-postgres or this module cannot take, [`DbError::Tls`] for unusable roots.
    pub fn new(settings: &DbSettings) -> Result<Self, DbError> {
        let (url, ssl, root) = split_ssl(&settings.url)?;
        let mut pg = tokio_postgres::Config::from_str(&url).map_err(|e| DbError::Url(scrub(&e.to_string())))?;
        pg.ssl_mode(match ssl {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => tokio_postgres::config::SslMode::Require,
        });
        pg.connect_timeout(settings.timeout);
        if pg.get_application_name().is_none() {
            pg.application_name("mcpfleet");
        }
        let target = target_of(&pg);
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(client_config(ssl, root.as_deref())?);
        let manager = Manager::from_config(pg, tls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager)
            .max_size(settings.pool_size.max(1))
            .wait_timeout(Some(settings.timeout))
            .create_timeout(Some(settings.timeout))
            .recycle_timeout(Some(settings.timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| DbError::Url(e.to_string()))?;
        Ok(Self { pool, target, timeout: settings.timeout, ssl })
    }

    /// The pool, for the repositories that bring their own queries.
    #[must_use]
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// `host:port/database (user …, sslmode …)`: what the logs say about the database.
    #[must_use]
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The deadline of each operation.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A pooled connection, within the deadline.
    ///
    /// # Errors
    /// [`DbError::Unavailable`]: no connection within the deadline, or the database refuses it.
    pub async fn get(&self) -> Result<deadpool_postgres::Object, DbError> {
        self.pool.get().await.map_err(|e| DbError::of_pool(&e))
    }

    /// One round trip (`SELECT 1`) within the deadline.
    ///
    /// # Errors
    /// [`DbError::Unavailable`] when it fails or is late.
    pub async fn ping(&self) -> Result<(), DbError> {
        let run = async {
            let c = self.get().await?;
            c.simple_query("SELECT 1").await.map_err(|e| DbError::of(&e)).map(drop)
        };
        tokio::time::timeout(self.timeout, run)
            .await
            .map_err(|_| DbError::Unavailable(format!("no answer within {:?}", self.timeout)))?
    }
}

/// Takes libpq's `sslmode` and `sslrootcert` out of the URL's query (tokio-postgres knows neither `verify-*` nor
/// `sslrootcert`), keeping every other parameter.
fn split_ssl(url: &str) -> Result<(String, SslMode, Option<String>), DbError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(DbError::Url("it must start with postgres:// or postgresql://".to_owned()));
    }
    let Some((base, query)) = url.split_once('?') else { return Ok((url.to_owned(), SslMode::Prefer, None)) };
    let (mut ssl, mut root) = (SslMode::Prefer, None);
    let mut rest = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "sslmode" => ssl = SslMode::parse(&v)?,
            "sslrootcert" => root = Some(v.into_owned()),
            _ => {
                rest.append_pair(&k, &v);
            }
        }
    }
    let rest = rest.finish();
    let url = if rest.is_empty() { base.to_owned() } else { format!("{base}?{rest}") };
    Ok((url, ssl, root))
}

/// Removes anything that looks like a password from a driver message about the URL.
fn scrub(msg: &str) -> String {
    if msg.contains("password") { "the URL cannot be parsed".to_owned() } else { msg.to_owned() }
}

fn target_of(pg: &tokio_postgres::Config) -> String {
    let host = pg
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .collect::<Vec<_>>()
        .join(",");
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let db = pg.get_dbname().unwrap_or("");
    format!("{host}:{port}/{db} (user {})", pg.get_user().unwrap_or("?"))
}

fn client_config(ssl: SslMode, root: Option<&str>) -> Result<rustls::ClientConfig, DbError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| DbError::Tls(e.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> = match ssl {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => Arc::new(Relaxed { provider, chain: None }),
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let chain =
                rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots(root)?), provider.clone())
                    .build()
                    .map_err(|e| DbError::Tls(e.to_string()))?;
            if ssl == SslMode::VerifyCa { Arc::new(Relaxed { provider, chain: Some(chain) }) } else { chain }
        }
    };
    Ok(builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth())
}

fn roots(file: Option<&str>) -> Result<rustls::RootCertStore, DbError> {
    use rustls::pki_types::pem::PemObject as _;
    let mut store = rustls::RootCertStore::empty();
    match file.filter(|f| *f != "system") {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| DbError::Tls(format!("sslrootcert {path}: {e}")))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| DbError::Tls(format!("sslrootcert {path}: {e}")))?;
            store.add_parsable_certificates(certs);
        }
        None => {
            store.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    if store.is_empty() {
        return Err(DbError::Tls("no root certificates: give sslrootcert=<file>".to_owned()));
    }
    Ok(store)
}

/// The verifier of every mode but `verify-full` (which is rustls' own): `require` and `prefer` check no certificate,
/// as in libpq (`chain: None`); `verify-ca` checks the chain against the roots but not the host name. The
/// handshake's signatures are always checked, with the process's provider.
#[derive(Debug)]
struct Relaxed {
    provider: Arc<rustls::crypto::CryptoProvider>,
    chain: Option<Arc<rustls::client::WebPkiServerVerifier>>,
}

impl ServerCertVerifier for Relaxed {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else { return Ok(ServerCertVerified::assertion()) };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_ssl_settings_leave_the_url() {
        let (url, ssl, root) =
            split_ssl("postgres://u:p@h:5/db?sslmode=verify-full&application_name=x&sslrootcert=%2Fca.pem").unwrap();
        assert_eq!(
            (url.as_str(), ssl, root.as_deref()),
            ("postgres://u:p@h:5/db?application_name=x", SslMode::VerifyFull, Some("/ca.pem"))
        );
        let (url, ssl, _) = split_ssl("postgresql://h/db").unwrap();
        assert_eq!((url.as_str(), ssl), ("postgresql://h/db", SslMode::Prefer));
        assert!(split_ssl("postgres://h/db?sslmode=bogus").unwrap_err().to_string().contains("sslmode=bogus"));
        assert!(split_ssl("mysql://h/db").is_err());
    }

    #[test]
    fn the_target_never_holds_the_password() {
        let s = DbSettings {
            url: "postgres://me:hunter2@db.example:6543/app".into(),
            pool_size: 2,
            timeout: Duration::from_secs(1),
        };
        let db = Database::new(&s).unwrap();
        assert_eq!(db.target(), "db.example:6543/app (user me)");
        assert!(!format!("{db:?}{s:?}").contains("hunter2"));
    }
}
