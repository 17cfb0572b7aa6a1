//! `--downstreams FILE` (docs/DOWNSTREAM.md): the downstream APIs tools may call for the verified user. The
//! document is read and checked here, once, and its secrets read from the environment variables and files it names
//! (this module is where the environment is read); any fault exits 64 with the JSON pointer of its place.

use super::cli::config_error;
use super::secret::Secret;
use crate::ServerError;
use mcpfleet_downstream::{Document, Resolved, SecretRef};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Downstreams")]
pub(super) struct DownstreamArgs {
    /// The downstream APIs tools may call for the caller (YAML; docs/DOWNSTREAM.md): for each, its base URL and how
    /// a token for it is had (RFC 8693 token exchange). Secrets are named by environment variable or file, never
    /// written in it. Refused with --auth none (there is no verified caller to act for).
    #[arg(long, env = "MCPFLEET_DOWNSTREAMS", value_name = "FILE")]
    downstreams: Option<PathBuf>,
    /// A key that seals the third parties' tokens of URL-mode downstreams in Redis (AES-256-GCM), as
    /// `KID:BASE64SECRET` (the secret exactly 32 bytes). Repeat it to rotate: the first seals, every one listed
    /// opens. Every replica needs the same keys; required when the document has a URL-mode downstream.
    #[arg(long = "downstream-key", env = "MCPFLEET_DOWNSTREAM_KEYS", value_delimiter = ',', hide_env_values = true)]
    downstream_keys: Vec<Secret>,
}

/// `--downstreams` and `--downstream-key`, read.
#[derive(Clone, Debug)]
pub struct DownstreamsConfig {
    /// The downstreams, their secrets read.
    pub resolved: Vec<Resolved>,
    /// The key ring that seals URL-mode grants, the first sealing; empty without one.
    pub keys: KeyRing,
    /// The start page's sign-in to the fleet's issuer (`signin` in the document), its secret read.
    pub signin: Option<mcpfleet_downstream::SignIn>,
}

/// `--downstream-key`s: `(id, key)`, the first sealing. `Debug` shows the ids only.
#[derive(Clone, Default)]
pub struct KeyRing(pub Vec<(String, Vec<u8>)>);

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("KeyRing").field(&self.0.iter().map(|(k, _)| k).collect::<Vec<_>>()).finish()
    }
}

/// One secret, from where the document says.
#[expect(
    clippy::disallowed_methods,
    reason = "the config module is the environment's one reader; the document names these variables"
)]
fn read_secret(r: &SecretRef) -> Result<String, String> {
    let value = match r {
        SecretRef::Env(name) => std::env::var(name).map_err(|_| "not set".to_owned())?,
        SecretRef::File(path) => std::fs::read_to_string(path).map_err(|e| e.kind().to_string())?,
    };
    let line = value.strip_suffix('\n').unwrap_or(&value);
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.is_empty() { Err("empty".to_owned()) } else { Ok(line.to_owned()) }
}

impl DownstreamArgs {
    pub(super) fn into_config(self, auth_none: bool, auth_dev: bool) -> Result<Option<DownstreamsConfig>, ServerError> {
        let Some(path) = self.downstreams else {
            if !self.downstream_keys.is_empty() {
                return Err(config_error("--downstream-key is for --downstreams with URL-mode downstreams"));
            }
            return Ok(None);
        };
        if auth_none {
            return Err(config_error(
                "--downstreams needs a verified caller to act for: it is refused with --auth none",
            ));
        }
        let text = std::fs::read_to_string(&path)
            .map_err(|e| config_error(format!("--downstreams {}: {e}", path.display())))?;
        let doc = Document::parse(&text).map_err(|e| config_error(format!("--downstreams {}: {e}", path.display())))?;
        let resolved =
            doc.resolve(&read_secret).map_err(|e| config_error(format!("--downstreams {}: {e}", path.display())))?;
        let keys = super::secret::key_ring(&self.downstream_keys, "--downstream-key")?;
        let url_mode: Vec<&str> = resolved.iter().filter(|r| r.doc.is_url_mode()).map(|r| r.name.as_str()).collect();
        if let Some(first) = url_mode.first()
            && keys.is_empty()
        {
            return Err(config_error(format!(
                "--downstreams: {first} is a URL-mode downstream: its grants are kept sealed, which needs --downstream-key"
            )));
        }
        if url_mode.is_empty() && !keys.is_empty() {
            return Err(config_error("--downstream-key is for URL-mode downstreams, and the document has none"));
        }
        let signin = doc
            .resolve_signin(&read_secret)
            .map_err(|e| config_error(format!("--downstreams {}: {e}", path.display())))?;
        if let Some(first) = url_mode.first()
            && signin.is_none()
            && !auth_dev
        {
            return Err(config_error(format!(
                "--downstreams: {first} is a URL-mode downstream: its start page signs users in to the fleet's issuer, \
                 which needs a signin section (or --auth dev)"
            )));
        }
        Ok(Some(DownstreamsConfig { resolved, keys: KeyRing(keys), signin }))
    }
}
