//! `mcpfleet policy …`: the commands around a policy document (docs/POLICY.md). `check` reads a document offline
//! and says whether it would be accepted, as a CI step before it is applied.

use crate::config::{EXIT_CONFIG, PolicyRequest};
use mcpfleet_policy::{MAX_BYTES, Policy};
use std::io::Read as _;

/// Runs a `policy` command; its exit code.
pub(crate) fn command(name: &str, req: &PolicyRequest) -> i32 {
    match req {
        PolicyRequest::Check(path) => {
            let shown = path.display();
            let text = match read(path) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("{name}: policy {shown}: cannot read it: {e}");
                    return EXIT_CONFIG;
                }
            };
            match Policy::parse(&text) {
                Ok(p) => {
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
                Err(e) => {
                    eprintln!("{name}: policy {shown}: {e}");
                    EXIT_CONFIG
                }
            }
        }
    }
}

/// The file's text, at most [`MAX_BYTES`] and one more (which the parser refuses with the size).
fn read(path: &std::path::Path) -> std::io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path)?.take(MAX_BYTES as u64 + 1).read_to_string(&mut text)?;
    Ok(text)
}
