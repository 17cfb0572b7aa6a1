//! `--dpop` (docs/IDENTITY.md#dpop): whether the resource server takes DPoP-bound tokens (RFC 9449), how far a
//! proof's `iat` may be from the clock, and the fleet's nonce.

use super::cli::{config_error, duration};
use super::secret::Secret;
use crate::ServerError;
use clap::ValueEnum;
use mcpfleet_auth::dpop::{DpopMode, DpopSettings, NonceKey};
use std::time::Duration;

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "DPoP")]
pub(super) struct DpopArgs {
    /// DPoP-bound access tokens (RFC 9449): off (Bearer only), allow (Bearer, or DPoP with a proof on every
    /// request), require (DPoP only). A bound token sent as Bearer is always refused; a proof is accepted once
    /// across the fleet. With --auth jwt or dev.
    #[arg(long, env = "MCPFLEET_DPOP", value_enum, default_value = "off")]
    dpop: Dpop,
    /// How far a proof's iat may be from the server's clock, either way, like 60s; 5s to 5m. A proof is
    /// remembered (in Redis, under its user) this long after its iat, to refuse its replay.
    #[arg(long, env = "MCPFLEET_DPOP_MAX_AGE", default_value = "60s", value_parser = duration("5s", "5m"))]
    dpop_max_age: Duration,
    /// A key of the fleet's DPoP nonce, as KID:BASE64SECRET (at least 16 bytes): proofs must then carry a nonce
    /// this fleet issued (`use_dpop_nonce` otherwise). Repeat it to rotate: the first makes nonces, every one listed
    /// checks them. Every replica needs the same keys.
    #[arg(long = "dpop-nonce-key", env = "MCPFLEET_DPOP_NONCE_KEYS", value_delimiter = ',', hide_env_values = true)]
    dpop_nonce_keys: Vec<Secret>,
    /// How long a nonce is issued for; it is accepted for that period and the next. 10s to 1h.
    #[arg(long, env = "MCPFLEET_DPOP_NONCE_PERIOD", default_value = "5m", value_parser = duration("10s", "1h"))]
    dpop_nonce_period: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Dpop {
    Off,
    Allow,
    Require,
}

impl DpopArgs {
    /// The settings; `resource` (what proofs name in `htu`) is the configured resource URL, filled in by the caller.
    pub(super) fn into_config(self, auth_none: bool) -> Result<DpopSettings, ServerError> {
        let mode = match self.dpop {
            Dpop::Off => DpopMode::Off,
            Dpop::Allow => DpopMode::Allow,
            Dpop::Require => DpopMode::Require,
        };
        if mode != DpopMode::Off && auth_none {
            return Err(config_error("--dpop needs tokens to bind: it is refused with --auth none"));
        }
        let keys = super::secret::key_ring(&self.dpop_nonce_keys, "--dpop-nonce-key")?;
        if let Some((kid, _)) = keys.iter().find(|(_, k)| k.len() < 16) {
            return Err(config_error(format!("--dpop-nonce-key {kid:?}: the secret must be at least 16 bytes")));
        }
        if !keys.is_empty() && mode == DpopMode::Off {
            return Err(config_error("--dpop-nonce-key is for --dpop allow or require"));
        }
        let nonce = (!keys.is_empty())
            .then(|| NonceKey::new(keys.into_iter().map(|(_, k)| k).collect(), self.dpop_nonce_period));
        Ok(DpopSettings { mode, max_age: self.dpop_max_age, resource: None, nonce })
    }
}
