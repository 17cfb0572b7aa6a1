//! mcpfleet-policy owns policy as data (docs/POLICY.md): a document of plans (each a set of limits and the tools it
//! may call, with conditions written in CEL), the ordered rules that give a verified principal its plan, and the
//! quotas a tenant's users share. It parses a document and checks it whole: the YAML (duplicate keys refused), the
//! published JSON Schema (`docs/policy.schema.json`: an unknown key anywhere refuses the document, with its JSON
//! pointer), every CEL expression compiled, every plan it names defined. A document that fails any check is never
//! half-applied.
//!
//! This crate must not depend on HTTP, axum, the transport, the state store or the database: where a document is
//! kept and how it reaches the replicas are the server's and the state crate's.

mod changes;
mod claims;
mod document;
mod error;
mod eval;

pub use claims::ClaimsRead;
pub use document::{Assign, Condition, Expr, MAX_BYTES, Mode, Plan, Policy, SCHEMA, Tenants};
pub use error::PolicyError;
pub use eval::{Assigned, CallVerdict, Subject, ToolView};

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The document issue 34 says must be accepted as written.
    const ACCEPTED: &str = r#"
plans:
  free:
    rate: { per_second: 20, burst: 40 }
    quotas:
      test_simple_text: { limit: 3, window: 60s }
  pro:
    quotas:
      test_simple_text: { limit: 100, window: 60s }
assign:
  - when: 'principal.claims.plan == "pro"'
    plan: pro
default: free
"#;

    fn refused(text: &str) -> PolicyError {
        Policy::parse(text).expect_err("refused")
    }

    #[test]
    fn the_issues_document_is_accepted_as_written() {
        let p = Policy::parse(ACCEPTED).expect("accepted");
        assert_eq!(p.default, "free");
        let free = &p.plans["free"];
        assert_eq!((free.rate_per_second, free.rate_burst), (Some(20.0), Some(40)));
        assert_eq!(free.quotas["test_simple_text"].limit, 3);
        assert_eq!(free.quotas["test_simple_text"].window, Duration::from_secs(60));
        assert_eq!(p.plans["pro"].quotas["test_simple_text"].limit, 100);
        assert_eq!(p.plans["pro"].rate_per_second, None, "left out: the flag's value");
        assert_eq!(p.assign.len(), 1);
        assert_eq!((p.assign[0].plan.as_str(), p.assign[0].mode), ("pro", Mode::Enforce));
        assert_eq!(p.assign[0].when.source, r#"principal.claims.plan == "pro""#);
    }

    #[test]
    fn the_published_schema_compiles() {
        let schema: serde_json::Value = serde_json::from_str(SCHEMA).expect("json");
        assert!(jsonschema::draft202012::new(&schema).is_ok());
    }

    #[test]
    fn an_unknown_key_anywhere_refuses_the_document_with_its_pointer() {
        for (text, pointer) in [
            ("plans: { free: {} }\ndefault: free\nextra: 1\n", "/extra"),
            ("plans: { free: { ratee: {} } }\ndefault: free\n", "/plans/free/ratee"),
            ("plans: { free: { rate: { per_second: 1, brust: 2 } } }\ndefault: free\n", "/plans/free/rate/brust"),
            (
                "plans: { free: { quotas: { t: { limit: 1, window: 1s, x: 1 } } } }\ndefault: free\n",
                "/plans/free/quotas/t/x",
            ),
            (
                "plans: { free: {} }\ndefault: free\nassign: [ { when: 'true', plan: free, then: 1 } ]\n",
                "/assign/0/then",
            ),
            (
                "plans: { free: {} }\ndefault: free\ntenants: { overrides: { acme: { quotas: {}, q: 1 } } }\n",
                "/tenants/overrides/acme/q",
            ),
        ] {
            let e = refused(text);
            assert_eq!(e.pointer(), pointer, "{text}: {e}");
            assert_eq!(e.to_string(), format!("{pointer}: expected no such key here"));
        }
    }

    #[test]
    fn bad_values_are_refused_with_their_pointer() {
        for (text, pointer, says) in [
            ("plans: { free: {} }\n", "", "default"),
            ("plans: { Free: {} }\ndefault: free\n", "/plans", "matching"),
            (
                "plans: { free: { quotas: { t: { limit: 0, window: 1s } } } }\ndefault: free\n",
                "/plans/free/quotas/t/limit",
                "at least 1",
            ),
            (
                "plans: { free: { quotas: { t: { limit: 1, window: 1y } } } }\ndefault: free\n",
                "/plans/free/quotas/t/window",
                "matching",
            ),
            (
                "plans: { free: { quotas: { t: { limit: 1, window: 31d } } } }\ndefault: free\n",
                "/plans/free/quotas/t/window",
                "1ms to 30d",
            ),
            (
                "plans: { free: { rate: { per_second: 0 } } }\ndefault: free\n",
                "/plans/free/rate/per_second",
                "more than 0",
            ),
            ("plans: { free: {} }\ndefault: pro\n", "/default", "no plan \"pro\""),
            (
                "plans: { free: {} }\ndefault: free\nassign: [ { when: 'true', plan: gold } ]\n",
                "/assign/0/plan",
                "no plan \"gold\"",
            ),
            (
                "plans: { free: { tools: { conditions: [ { when: 'true', message: m, mode: maybe } ] } } }\ndefault: free\n",
                "/plans/free/tools/conditions/0/mode",
                "one of",
            ),
        ] {
            let e = refused(text);
            assert_eq!(e.pointer(), pointer, "{text}: {e}");
            assert!(e.to_string().contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn expressions_compile_and_use_only_their_rules_variables() {
        let e = refused(
            "plans: { free: {} }\ndefault: free\nassign: [ { when: 'principal.claims.plan ==', plan: free } ]\n",
        );
        assert_eq!(e.pointer(), "/assign/0/when");
        assert!(e.to_string().contains("does not compile"), "{e}");
        // An assignment sees the principal only: the call's arguments are not known yet.
        let e = refused("plans: { free: {} }\ndefault: free\nassign: [ { when: 'args.limit < 3', plan: free } ]\n");
        assert!(e.to_string().contains(r#"uses "args", which this rule does not have (it has: principal)"#), "{e}");
        let e = refused(
            "plans: { free: { tools: { conditions: [ { when: 'argz.limit <= 10', message: m } ] } } }\ndefault: free\n",
        );
        assert_eq!(e.pointer(), "/plans/free/tools/conditions/0/when");
        let ok = "plans: { free: { tools: { allow: [search], conditions: [ { tool: search, when: 'args.limit <= 10 && principal.subject != \"x\" && tool.name == \"search\"', message: 'at most 10 on the free plan', mode: dry-run } ] } } }\ndefault: free\n";
        let p = Policy::parse(ok).expect("accepted");
        let c = &p.plans["free"].conditions[0];
        assert_eq!(
            (c.tool.as_deref(), c.mode, c.message.as_str()),
            (Some("search"), Mode::DryRun, "at most 10 on the free plan")
        );
        // A condition on a tool the plan does not allow could never apply.
        let e = refused(
            "plans: { free: { tools: { allow: [a], conditions: [ { tool: b, when: 'true', message: m } ] } } }\ndefault: free\n",
        );
        assert_eq!(e.pointer(), "/plans/free/tools/conditions/0/tool");
    }

    #[test]
    fn yaml_that_is_not_one_document_is_refused() {
        let e = refused("plans: { free: {} }\ndefault: free\ndefault: pro\n");
        assert!(matches!(e, PolicyError::Syntax(_)), "a duplicate key: {e}");
        assert!(e.to_string().to_lowercase().contains("duplicate"), "{e}");
        assert!(matches!(refused("plans: [\n"), PolicyError::Syntax(_)));
        assert!(matches!(refused(&"#".repeat(MAX_BYTES + 1)), PolicyError::Syntax(_)));
        // JSON is YAML.
        assert!(Policy::parse(r#"{"plans": {"free": {}}, "default": "free"}"#).is_ok());
    }

    #[test]
    fn tenants_share_quotas_with_overrides() {
        let p = Policy::parse(
            "plans: { free: {} }\ndefault: free\ntenants:\n  quotas: { t: { limit: 50, window: 1h } }\n  overrides:\n    acme: { quotas: { t: { limit: 500, window: 1h } } }\n",
        )
        .expect("accepted");
        assert_eq!(p.tenants.quotas["t"].limit, 50);
        assert_eq!(p.tenants.overrides["acme"]["t"].limit, 500);
    }
}
