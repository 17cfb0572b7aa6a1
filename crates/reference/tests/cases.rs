//! Every reference tool's cases (`crates/reference/cases/<tool>.json`: `{name, arguments, valid}`) through the
//! validator built from the tools' published schemas, and the lint over those schemas. (`tests/tools.rs` sends the
//! same cases over HTTP to a live fleet, with a spy.)

use mcpfleet_reference::{self as reference, MemoryRepo};
use mcpfleet_tools::validate::Validator;
use mcpfleet_tools::{Catalog, lint};
use std::sync::Arc;

#[test]
fn every_case_of_every_reference_tool_passes_the_validator_as_declared() {
    let catalog = reference::catalog(Arc::new(MemoryRepo::new())).unwrap();
    let tools = catalog.tools();
    let validator = Validator::new(&tools).unwrap();
    let mut counts = Vec::new();
    for tool in &tools {
        let name = tool["name"].as_str().unwrap();
        assert!(lint::lint_tool(tool).is_empty(), "{name}: {:?}", lint::lint_tool(tool));
        let cases = reference::cases(name).unwrap_or_else(|| panic!("no cases for {name}"));
        let (mut valid, mut invalid) = (0, 0);
        for c in cases {
            let got = validator.check(name, &c.arguments);
            assert_eq!(got.is_ok(), c.valid, "{name} / {}: {got:?}", c.name);
            if c.valid {
                valid += 1;
            } else {
                invalid += 1;
            }
        }
        assert!(invalid >= 6, "{name} has only {invalid} invalid cases");
        counts.push(format!("{name}: {valid} valid, {invalid} invalid"));
    }
    println!("cases: {}", counts.join("; "));
    assert_eq!(counts.len(), 6);
}
