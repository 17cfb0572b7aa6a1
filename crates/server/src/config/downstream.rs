//! `--downstreams FILE` (docs/DOWNSTREAM.md): the downstream APIs tools may call for the verified user. The
//! document is read and checked here, once, and its secrets read from the environment variables and files it names
//! (this module is where the environment is read); any fault exits 64 with the JSON pointer of its place.

use super::cli::config_error;
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
    pub(super) fn into_config(self, auth_none: bool) -> Result<Option<Vec<Resolved>>, ServerError> {
        let Some(path) = self.downstreams else { return Ok(None) };
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
        Ok(Some(resolved))
    }
}
