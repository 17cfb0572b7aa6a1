//! A 2025 `GET` stream's watch on the tools its principal's plan lists ([`ListWatch`]): when a new policy version
//! changes that set, the stream carries `notifications/tools/list_changed`, so that the client lists again. (A
//! 2026-07-28 client's cached list may lag by its cache TTL: docs/POLICY.md.)

use super::Policies;
use crate::Principal;
use std::collections::BTreeSet;
use std::sync::Arc;

/// What a stream needs to tell its client that its tool list changed.
#[derive(Debug)]
pub(crate) struct ListWatch {
    versions: tokio::sync::watch::Receiver<u64>,
    policies: Arc<Policies>,
    principal: Principal,
    /// What the principal's plan lists now.
    listed: BTreeSet<String>,
}

impl ListWatch {
    pub(crate) fn new(policies: &Arc<Policies>, principal: &Principal) -> Self {
        let mut w = Self {
            versions: policies.subscribe(),
            policies: policies.clone(),
            principal: principal.clone(),
            listed: BTreeSet::new(),
        };
        w.listed = w.now_listed();
        w
    }

    fn now_listed(&self) -> BTreeSet<String> {
        let plan = self.policies.plan_of(&self.principal);
        self.policies.annotations.keys().filter(|t| plan.allows(t)).cloned().collect()
    }

    /// Waits until a new version changes what the principal's plan lists; the notification to send then. Never
    /// returns once the policy is gone (the replica shuts down).
    pub(crate) async fn changed(&mut self) -> String {
        loop {
            if self.versions.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            let now = self.now_listed();
            if now != self.listed {
                self.listed = now;
                return crate::jsonrpc::notification("notifications/tools/list_changed", serde_json::json!({}))
                    .to_string();
            }
        }
    }
}
