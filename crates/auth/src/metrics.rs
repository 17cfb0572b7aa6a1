//! The auth crate's metrics: the health of the verification keys and the work of verifying tokens. Documented in
//! docs/METRICS.md.

use prometheus::{Gauge, IntCounterVec, IntGauge, Opts, Registry};

/// Auth metrics. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AuthMetrics {
    pub(crate) refreshes: IntCounterVec,
    pub(crate) keys: IntGauge,
    pub(crate) last_refresh: Gauge,
    pub(crate) verifications: IntCounterVec,
}

impl AuthMetrics {
    /// Creates the metrics and registers them with `registry`, each known label set at 0.
    ///
    /// # Errors
    /// A metric of the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self {
            refreshes: IntCounterVec::new(
                Opts::new(
                    "mcp_jwks_refresh_total",
                    "Loads of the token verification keys (JWKS URL or key file), by result: ok or error.",
                ),
                &["result"],
            )?,
            keys: IntGauge::new("mcp_jwks_keys", "Verification keys currently loaded (0 before the first load).")?,
            last_refresh: Gauge::new(
                "mcp_jwks_last_success_timestamp_seconds",
                "Unix time of the last successful key load; alert when it grows old while refreshes fail.",
            )?,
            verifications: IntCounterVec::new(
                Opts::new(
                    "mcp_token_verifications_total",
                    "Bearer tokens checked, by result: verified (signature checked), cached (a recent verdict reused), rejected.",
                ),
                &["result"],
            )?,
        };
        registry.register(Box::new(m.refreshes.clone()))?;
        registry.register(Box::new(m.keys.clone()))?;
        registry.register(Box::new(m.last_refresh.clone()))?;
        registry.register(Box::new(m.verifications.clone()))?;
        // Every known series from the start, at 0.
        for result in ["ok", "error"] {
            m.refreshes.with_label_values(&[result]);
        }
        for result in ["verified", "cached", "rejected"] {
            m.verifications.with_label_values(&[result]);
        }
        Ok(m)
    }
}
