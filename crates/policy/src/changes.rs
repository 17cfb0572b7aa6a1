//! What changed between two versions of a policy, in words: the lines `mcpfleet policy diff` prints, and the
//! one-line summary stored with each version applied.

use crate::Policy;
use serde_json::Value;
use std::collections::BTreeSet;

impl Policy {
    /// What applying `self` over `old` changes, one line each (empty: nothing). `None`: no version is in force
    /// (the flags).
    #[must_use]
    pub fn changes(&self, old: Option<&Policy>) -> Vec<String> {
        let Some(old) = old else {
            let plans: Vec<&str> = self.plans.keys().map(String::as_str).collect();
            return vec![format!(
                "first version: plans {}; {} assignment rule(s); default {}",
                plans.join(", "),
                self.assign.len(),
                self.default
            )];
        };
        let (a, b) = (&old.document, &self.document);
        let mut out = Vec::new();
        let names = |d: &Value| -> BTreeSet<String> {
            d.get("plans").and_then(Value::as_object).map(|m| m.keys().cloned().collect()).unwrap_or_default()
        };
        let (before, after) = (names(a), names(b));
        for p in after.difference(&before) {
            out.push(format!("plan {p} added"));
        }
        for p in before.intersection(&after) {
            let (x, y) = (&a["plans"][p], &b["plans"][p]);
            if x != y {
                let keys = changed_keys(x, y);
                out.push(format!("plan {p} changed: {}", keys.join(", ")));
            }
        }
        for p in before.difference(&after) {
            out.push(format!("plan {p} removed"));
        }
        let rules = |d: &Value| d.get("assign").and_then(Value::as_array).map_or(0, Vec::len);
        if a.get("assign") != b.get("assign") {
            out.push(format!("assignment rules changed ({} → {})", rules(a), rules(b)));
        }
        if old.default != self.default {
            out.push(format!("default {} → {}", old.default, self.default));
        }
        if a.get("tenants") != b.get("tenants") {
            out.push(format!("tenants changed: {}", changed_keys(&a["tenants"], &b["tenants"]).join(", ")));
        }
        out
    }

    /// [`Policy::changes`] on one line (`no change` when there is none), at most 200 characters.
    #[must_use]
    pub fn summary(&self, old: Option<&Policy>) -> String {
        let c = self.changes(old);
        let line = if c.is_empty() { "no change".to_owned() } else { c.join("; ") };
        if line.chars().count() <= 200 { line } else { format!("{}…", line.chars().take(199).collect::<String>()) }
    }
}

/// The top-level keys of two objects whose values differ.
fn changed_keys(x: &Value, y: &Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let (x, y) = (x.as_object().unwrap_or(&empty), y.as_object().unwrap_or(&empty));
    let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
    keys.into_iter().filter(|k| x.get(*k) != y.get(*k)).cloned().collect()
}

#[cfg(test)]
mod tests {
    use crate::Policy;

    #[test]
    fn changes_name_plans_rules_default_and_tenants() {
        let v1 = Policy::parse("plans: { free: { inflight: 2 }, old: {} }\ndefault: free\n").expect("v1");
        assert_eq!(v1.summary(None), "first version: plans free, old; 0 assignment rule(s); default free");
        let v2 = Policy::parse(
            "plans: { free: { inflight: 3, quotas: { t: { limit: 1, window: 1s } } }, pro: {} }\ndefault: pro\nassign: [ { when: 'true', plan: free } ]\ntenants: { quotas: { t: { limit: 5, window: 1h } } }\n",
        )
        .expect("v2");
        assert_eq!(
            v2.changes(Some(&v1)),
            vec![
                "plan pro added",
                "plan free changed: inflight, quotas",
                "plan old removed",
                "assignment rules changed (0 → 1)",
                "default free → pro",
                "tenants changed: quotas",
            ]
        );
        assert_eq!(v2.summary(Some(&v2)), "no change");
    }
}
