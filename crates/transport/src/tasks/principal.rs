//! The principal as a task keeps it: written into the record when the task is created ([`principal_json`]), read
//! back by whichever replica runs it ([`principal_from`]).

use crate::Principal;
use serde_json::{Value, json};

/// The principal as a task keeps it, for whichever replica runs the task.
pub(crate) fn principal_json(p: &Principal) -> String {
    json!({
        "iss": p.issuer,
        "sub": p.subject,
        "client_id": p.client_id,
        "scopes": p.scopes.list(),
        "tenant": p.tenant,
    })
    .to_string()
}

/// The principal a task was created by.
pub(crate) fn principal_from(user: &mcpfleet_state::UserKey, s: &str) -> Option<Principal> {
    let v: Value = serde_json::from_str(s).ok()?;
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let scopes = match v.get("scopes") {
        Some(Value::Array(a)) => mcpfleet_core::Scopes::granted(a.iter().filter_map(Value::as_str)),
        _ => mcpfleet_core::Scopes::All,
    };
    Some(Principal {
        user: user.clone(),
        issuer: text("iss").unwrap_or_default(),
        subject: text("sub").unwrap_or_default(),
        client_id: text("client_id"),
        scopes,
        tenant: text("tenant"),
        // A task's run needs no plan: its plan's checks ran when the task was created.
        claims: std::sync::Arc::default(),
        plan: None,
        token_id: None,
        proof: None,
        bound_to: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcpfleet_core::Scopes;
    use mcpfleet_state::UserKey;

    #[test]
    fn a_task_keeps_its_principal() {
        let mut p =
            Principal::new("https://issuer".into(), "alice".into(), Some("app".into()), Scopes::granted(["a b"]));
        p.tenant = Some("acme".into());
        let back = principal_from(&p.user, &principal_json(&p)).unwrap_or_else(Principal::anonymous);
        assert_eq!((back.user, back.issuer, back.subject), (p.user.clone(), p.issuer.clone(), p.subject.clone()));
        assert_eq!((back.client_id, back.tenant, back.scopes), (p.client_id, p.tenant, p.scopes));
        let all = principal_from(&UserKey::anonymous(), &principal_json(&Principal::anonymous()));
        assert_eq!(all.map(|p| p.scopes), Some(Scopes::All));
        assert!(principal_from(&UserKey::anonymous(), "not json").is_none());
    }
}
