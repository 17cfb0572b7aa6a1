//! The fixture sets of the `mcpfleet` binary (cargo features `fixtures` and `reference`, on by default), chosen
//! with `--fixtures`: the conformance and open-schema fixtures, and the reference tools, on PostgreSQL when the
//! server has a database. They reach the server through the same door as anyone's catalog.

use crate::ServerError;
use crate::config::{AuthConfig, Config, Fixtures};
use mcpfleet_db::Database;
use mcpfleet_tools::Catalog;
use std::sync::Arc;

/// The catalog `fixtures` names; the reference tools work on `db` when there is one.
///
/// # Errors
/// The reference tools do not register (a bug of theirs).
#[cfg_attr(not(feature = "reference"), expect(unused_variables, reason = "only the reference tools use them"))]
pub(crate) fn catalog(
    fixtures: Fixtures,
    cfg: &Config,
    db: Option<&Database>,
) -> Result<Arc<dyn Catalog>, ServerError> {
    Ok(match fixtures {
        #[cfg(feature = "fixtures")]
        Fixtures::Conformance => Arc::new(mcpfleet_fixtures::ConformanceCatalog::default()),
        #[cfg(feature = "fixtures")]
        Fixtures::ConformanceDraft => Arc::new(mcpfleet_fixtures::ConformanceCatalog::with_draft()),
        #[cfg(feature = "fixtures")]
        Fixtures::Open => Arc::new(mcpfleet_fixtures::OpenCatalog),
        #[cfg(feature = "reference")]
        Fixtures::Reference => {
            let repo: Arc<dyn mcpfleet_reference::Repository> = match db {
                Some(db) => Arc::new(mcpfleet_reference::PgRepo::new(
                    db.pool().clone(),
                    mcpfleet_reference::PgOptions {
                        timeout: db.timeout(),
                        // Dev sign-in: a principal without data of its own works on one of the demo tenants.
                        assign_demo_tenant: matches!(cfg.auth, AuthConfig::Dev { .. } | AuthConfig::None),
                    },
                )),
                None => Arc::new(mcpfleet_reference::MemoryRepo::new()),
            };
            let downstreams = cfg.downstreams.iter().flat_map(|d| &d.resolved).map(|d| d.name.as_str());
            Arc::new(mcpfleet_reference::catalog_with_downstreams(repo, downstreams).map_err(ServerError::Config)?)
        }
    })
}
