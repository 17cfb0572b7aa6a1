//! `mcpfleet policy …`: the commands around a policy document (docs/POLICY.md). `check` reads a document offline
//! and says whether it would be accepted, as a CI step before it is applied; `explain` says which plan a principal
//! gets from it, with what limits, and whether a call would go through.

use crate::config::{EXIT_CONFIG, Explain, PolicyRequest};
use mcpfleet_policy::{CallVerdict, MAX_BYTES, Plan, Policy, Subject, ToolView};
use std::fmt::Write as _;
use std::io::Read as _;

/// Runs a `policy` command; its exit code.
pub(crate) fn command(name: &str, req: &PolicyRequest) -> i32 {
    match req {
        PolicyRequest::Explain(e) => match load(name, &e.file) {
            Some(p) => {
                print!("{}", explain(&p, e));
                0
            }
            None => EXIT_CONFIG,
        },
        PolicyRequest::Check(path) => {
            let shown = path.display();
            match load(name, path) {
                Some(p) => {
                    let plans: Vec<&str> = p.plans.keys().map(String::as_str).collect();
                    println!(
                        "policy {shown}: accepted: {} plans ({}), {} assignment rules, default {}",
                        plans.len(),
                        plans.join(", "),
                        p.assign.len(),
                        p.default
                    );
                    0
                }
                None => EXIT_CONFIG,
            }
        }
    }
}

/// The checked document in `path`, or `None` once the refusal is printed (one line on stderr).
fn load(name: &str, path: &std::path::Path) -> Option<Policy> {
    let shown = path.display();
    let text = read(path).map_err(|e| eprintln!("{name}: policy {shown}: cannot read it: {e}")).ok()?;
    Policy::parse(&text).map_err(|e| eprintln!("{name}: policy {shown}: {e}")).ok()
}

/// What `policy explain` prints: the plan and the rule that picked it, the plan's limits, and a call's verdict.
fn explain(p: &Policy, e: &Explain) -> String {
    let who = Subject { issuer: &e.iss, subject: &e.sub, claims: &e.claims };
    let assigned = p.assign(&who);
    let mut out = String::new();
    let _ = match assigned.rule {
        Some(i) => writeln!(out, "plan: {} (/assign/{i}: {})", assigned.plan, p.assign[i].when.source),
        None => writeln!(out, "plan: {} (the default: no rule holds)", assigned.plan),
    };
    for (i, plan) in &assigned.would {
        let _ = writeln!(out, "  dry run: /assign/{i} would pick {plan}");
    }
    if let Some(plan) = p.plans.get(assigned.plan) {
        let _ = writeln!(out, "limits: {}", limits(plan));
    }
    if let Some(tool) = &e.tool {
        let view = ToolView { name: tool, annotations: &serde_json::Value::Null };
        let _ = match p.check_call(assigned.plan, &who, &view, &e.args) {
            CallVerdict::Allowed { would_refuse } => {
                let mut line = format!("call {tool}: allowed");
                for i in would_refuse {
                    let _ = write!(line, "; dry run: /plans/{}/tools/conditions/{i} would refuse it", assigned.plan);
                }
                writeln!(out, "{line}")
            }
            CallVerdict::NotAllowed => {
                writeln!(out, "call {tool}: refused: not in plan {}'s tools.allow", assigned.plan)
            }
            CallVerdict::Refused { condition, message } => writeln!(
                out,
                "call {tool}: refused by /plans/{}/tools/conditions/{condition}: {message}",
                assigned.plan
            ),
        };
    }
    out
}

/// A plan's limits in one line; what it leaves out is the flag's value, named.
fn limits(plan: &Plan) -> String {
    let count = |v: Option<u64>, flag: &str| match v {
        None => flag.to_owned(),
        Some(0) => "no cap".to_owned(),
        Some(n) => n.to_string(),
    };
    let per_second = plan.rate_per_second.map_or_else(|| "--rate-per-second".to_owned(), |r| format!("{r}/s"));
    let burst = plan.rate_burst.map_or_else(|| "--rate-burst".to_owned(), |b| b.to_string());
    let quotas: Vec<String> = plan.quotas.iter().map(|(t, q)| format!("{t} {q}")).collect();
    format!(
        "rate {per_second}, burst {burst}; in flight {}; sessions {}; streams {}; tasks {}; quotas {}",
        count(plan.inflight, "--max-inflight-per-user"),
        count(plan.sessions, "--max-sessions-per-user"),
        count(plan.streams, "--max-streams-per-user"),
        count(plan.tasks, "--max-tasks-per-user"),
        if quotas.is_empty() { "--quota".to_owned() } else { quotas.join(", ") }
    )
}

/// The file's text, at most [`MAX_BYTES`] and one more (which the parser refuses with the size).
fn read(path: &std::path::Path) -> std::io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path)?.take(MAX_BYTES as u64 + 1).read_to_string(&mut text)?;
    Ok(text)
}
