//! Policy as data (issue 34), end to end: `mcpfleet policy check` on documents written to files, as a CI step runs
//! it; and the examples in docs/POLICY.md, which must be accepted as written.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use std::process::Command;

/// `mcpfleet policy check` of a file holding `text`: the exit code, stdout and stderr.
fn check(text: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(mcpfleet_fleetkit::server_bin()).args(["policy", "check"]).arg(&file).output().unwrap();
    let shown = file.display().to_string();
    let strip = |s: &[u8]| String::from_utf8_lossy(s).replace(&shown, "FILE");
    (out.status.code(), strip(&out.stdout), strip(&out.stderr))
}

/// The ```yaml blocks of docs/POLICY.md.
fn documented() -> Vec<String> {
    let page = include_str!("../docs/POLICY.md");
    page.split("```yaml\n").skip(1).map(|b| b.split("```").next().unwrap().to_owned()).collect()
}

#[test]
fn policy_check_accepts_the_documented_examples() {
    let examples = documented();
    assert!(examples.len() >= 2, "docs/POLICY.md shows its examples as yaml blocks");
    for doc in examples {
        let (code, out, err) = check(&doc);
        assert_eq!(code, Some(0), "{doc}\n{err}");
        assert!(out.starts_with("policy FILE: accepted: "), "{out}");
    }
    // The issue's own document, as written.
    let (code, out, _) = check(
        "plans:\n  free:\n    rate: { per_second: 20, burst: 40 }\n    quotas:\n      test_simple_text: { limit: 3, window: 60s }\n  pro:\n    quotas:\n      test_simple_text: { limit: 100, window: 60s }\nassign:\n  - when: 'principal.claims.plan == \"pro\"'\n    plan: pro\ndefault: free\n",
    );
    assert_eq!(code, Some(0));
    assert_eq!(out.trim(), "policy FILE: accepted: 2 plans (free, pro), 1 assignment rules, default free");
}

#[test]
fn policy_check_refuses_with_exit_64_and_the_pointer() {
    for (doc, line) in [
        (
            "plans: { free: { ratee: { per_second: 1 } } }\ndefault: free\n",
            "mcpfleet: policy FILE: /plans/free/ratee: expected no such key here",
        ),
        (
            "plans: { free: {} }\ndefault: free\nassign:\n  - when: 'principal.claims.plan =='\n    plan: free\n",
            "mcpfleet: policy FILE: /assign/0/when: does not compile: 1:25: Syntax error: ",
        ),
        ("plans: { free: {} }\ndefault: pro\n", "mcpfleet: policy FILE: /default: no plan \"pro\" (plans: free)"),
        (
            "plans: { free: {} }\ndefault: free\ndefault: free\n",
            "mcpfleet: policy FILE: not a policy document: line 3 column 1: duplicate mapping key: default",
        ),
    ] {
        let (code, out, err) = check(doc);
        assert_eq!(code, Some(64), "{doc}: {err}");
        assert!(out.is_empty(), "{out}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(err.starts_with(line), "{doc}\n{err}");
    }
    let out = Command::new(mcpfleet_fleetkit::server_bin())
        .args(["policy", "check", "/no/such/policy.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with("mcpfleet: policy /no/such/policy.yaml: cannot read it: ")
    );
}

/// `mcpfleet policy explain --file FILE ARGS…` of the example of docs/POLICY.md with tenants: exit code and stdout.
fn explain(args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    let example = documented().into_iter().find(|d| d.contains("tenants:")).unwrap();
    std::fs::write(&file, example).unwrap();
    let out = Command::new(mcpfleet_fleetkit::server_bin())
        .args(["policy", "explain", "--file"])
        .arg(&file)
        .args(args)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn policy_explain_names_the_plan_its_rule_its_limits_and_a_calls_verdict() {
    let (code, out) = explain(&["--sub", "carol", "--claim", "plan=enterprise", "--tool", "search_docs"]);
    assert_eq!(code, Some(0), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], r#"plan: enterprise (/assign/0: principal.claims.plan == "enterprise")"#);
    assert!(lines[1].starts_with("limits: rate --rate-per-second, burst --rate-burst; in flight 64;"), "{out}");
    assert!(lines[2].starts_with("tenant quotas: search_docs 1000 per 1h"), "{out}");
    assert_eq!(lines[3], "call search_docs: allowed");
    // No rule holds: the default plan, its tools, its conditions after validation, and a dry run that only counts.
    let (_, out) =
        explain(&["--sub", "bob", "--claim", "region=us", "--tool", "search_docs", "--args", r#"{"limit":20}"#]);
    assert!(out.starts_with("plan: free (the default: no rule holds)\n"), "{out}");
    assert!(out.contains("quotas search_docs 20 per 1h"), "{out}");
    assert!(
        out.contains("tenant quotas: search_docs 1000 per 1h (overridden for acme);")
            && out.contains("(with 3 replicas and a limit of 1000: slices of 41, at most 123 held unspent)"),
        "{out}"
    );
    assert!(out.ends_with(
        "call search_docs: refused by /plans/free/tools/conditions/0: the free plan returns at most 10 results: ask for fewer\n"
    ));
    let (_, out) =
        explain(&["--sub", "bob", "--claim", "region=us", "--tool", "search_docs", "--args", r#"{"limit":5}"#]);
    assert!(
        out.ends_with("call search_docs: allowed; dry run: /plans/free/tools/conditions/1 would refuse it\n"),
        "{out}"
    );
    let (_, out) = explain(&["--sub", "bob", "--tool", "delete_everything"]);
    assert!(out.ends_with("call delete_everything: refused: not in plan free's tools.allow\n"), "{out}");
    // A bad question is refused like a bad flag.
    assert_eq!(explain(&["--sub", "bob", "--claim", "plan"]).0, Some(64));
    assert_eq!(explain(&["--sub", "bob", "--tool", "t", "--args", "[1]"]).0, Some(64));
}
