//! Every reference tool's cases (`crates/reference/cases/<tool>.json`: `{name, arguments, valid}`) through the
//! validator built from the tools' published schemas, and the lint over those schemas. (`tests/tools.rs` sends the
//! same cases over HTTP to a live fleet, with a spy.)

use mcpfleet_reference::{self as reference, MemoryRepo};
use mcpfleet_tools::validate::Validator;
use mcpfleet_tools::{Catalog, lint};
use std::sync::Arc;

#[test]
fn every_case_of_every_reference_tool_passes_the_validator_as_declared() {
    let catalog = reference::catalog_with_downstreams(Arc::new(MemoryRepo::new()), ["calendar", "forge"]).unwrap();
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
    assert_eq!(counts.len(), 8);
}

/// The same cases through a replica's whole pipeline, with the tool writers' harness (`mcpfleet::testing`): an
/// invalid case is refused before its handler runs (an `isError` result saying so), a valid one reaches it (its
/// answer may still be a refusal of the tool's own, such as an id that is not the caller's).
#[tokio::test]
async fn every_case_through_the_pipeline_reaches_the_handler_exactly_when_valid() {
    use mcpfleet::testing::Harness;
    let catalog = reference::catalog(Arc::new(MemoryRepo::new())).unwrap();
    let names: Vec<String> = catalog.tools().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect();
    let mut flags =
        vec!["--rate-burst".to_owned(), "1000000".to_owned(), "--rate-per-second".to_owned(), "1000000".to_owned()];
    for n in &names {
        flags.extend(["--quota".to_owned(), format!("{n}=off")]);
    }
    let h = Harness::with_flags(mcpfleet::Server::new("reference", "0").catalog(catalog), flags).await.unwrap();
    let refused = |text: &str| text.starts_with("Invalid arguments for the tool ");
    let mut ran = 0;
    for name in &names {
        for c in reference::cases(name).unwrap() {
            let r = h.call(name, c.arguments.clone()).await.unwrap_or_else(|e| panic!("{name} / {}: {e}", c.name));
            if c.valid {
                assert!(!refused(&r.text()), "{name} / {}: {:?}", c.name, r.raw);
                ran += 1;
            } else {
                assert!(r.is_error && refused(&r.text()), "{name} / {}: {:?}", c.name, r.raw);
            }
        }
    }
    assert!(ran >= 12, "{ran} valid cases ran");
}

/// The typed output passes the output schema derived from it (the registry checks it before anything is sent), and
/// a ticket is found by its typed project: two calls through the pipeline as alice, on her demo tenant's data.
#[tokio::test]
async fn the_typed_arguments_and_output_reach_the_repository_and_the_output_schema() {
    use mcpfleet::testing::{Harness, ISSUER};
    use serde_json::json;
    let catalog = reference::catalog(Arc::new(MemoryRepo::new())).unwrap();
    let h = Harness::new(mcpfleet::Server::new("reference", "0").catalog(catalog)).await.unwrap();
    let alice = mcpfleet_core::Principal::new(ISSUER.into(), "alice".into(), None, mcpfleet_core::Scopes::All);
    let (customer, _) = reference::demo_ids(alice.tenant());
    let out = h.as_user("alice").call("get_customer_summary", json!({ "customer_id": customer })).await.unwrap();
    assert!(!out.is_error, "{:?}", out.raw);
    assert_eq!(out.structured, Some(json!({ "customer_id": customer, "plan": "enterprise", "open_tickets": 2 })));
    let out = h.as_user("alice").call("get_ticket", json!({ "project": "support", "number": 2 })).await.unwrap();
    assert!(out.text().contains("TKT-2") && out.text().contains("Login loop"), "{}", out.text());
}
