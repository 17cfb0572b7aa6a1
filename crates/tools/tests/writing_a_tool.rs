//! docs/WRITING-A-TOOL.md, kept true: the page shows `examples/greet` (its `Cargo.toml` and `src/main.rs`)
//! verbatim, and its "Declaring more" example is the code between the `page: begin`/`page: end` markers below,
//! compiled and run here. `mcpfleet` re-exports these names from this crate; the alias lets the page's code read as
//! a tool writer's.

#![expect(clippy::expect_used, reason = "a test: a page without the block fails loudly")]

use mcpfleet_tools as mcpfleet;

// --- page: begin
use mcpfleet::{JsonSchema, Quota, Tool, ToolContext, ToolError, ToolInfo, ToolOutput, async_trait, schemars};
use serde::Deserialize;
use std::{collections::HashMap, time::Duration};

/// One of the calling user's orders. (principal, order id) → status.
struct OrderStatus(HashMap<(String, String), String>);

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The order's id, as the user's receipt shows it.
    #[schemars(length(max = 20), regex(pattern = "^ord_[0-9]{1,16}$"))]
    order_id: String,
}

#[async_trait]
impl Tool for OrderStatus {
    type Args = Args;

    fn info(&self) -> ToolInfo {
        ToolInfo::new("order_status")
            .title("Order status")
            .description("The status of one of the calling user's orders.")
            .read_only()
            .idempotent()
            .scopes(["orders:read"])
            .quota(Quota::new(100, Duration::from_secs(3600)))
            .timeout(Duration::from_secs(5))
    }

    async fn call(&self, a: Args, cx: &dyn ToolContext) -> Result<ToolOutput, ToolError> {
        let who = cx.principal().user.as_str().to_owned(); // the verified token's principal, never an argument
        match self.0.get(&(who, a.order_id.clone())) {
            Some(status) => Ok(ToolOutput::text(format!("{}: {status}", a.order_id))),
            None => Err(ToolError::Failed(format!("no order {} among yours", a.order_id))),
        }
    }
}
// --- page: end

const PAGE: &str = include_str!("../../../docs/WRITING-A-TOOL.md");

/// The fenced block of the page that follows `intro` (its first line is the fence).
fn block_after<'a>(intro: &str) -> &'a str {
    let start = PAGE.find(intro).unwrap_or_else(|| panic!("the page says {intro:?}")) + intro.len();
    let rest = &PAGE[start..];
    let open = rest.find("```").expect("a fence");
    let body = &rest[open..];
    let body = &body[body.find('\n').expect("fence line") + 1..];
    &body[..body.find("\n```\n").expect("a closing fence") + 1]
}

#[test]
fn the_page_shows_examples_greet_verbatim() {
    let manifest = include_str!("../../../examples/greet/Cargo.toml");
    let main = include_str!("../../../examples/greet/src/main.rs");
    assert_eq!(block_after("`Cargo.toml` (outside this repository"), manifest, "the page's Cargo.toml");
    assert_eq!(block_after("`src/main.rs`:"), main, "the page's src/main.rs");
}

#[test]
fn the_declaring_more_example_is_this_file_and_lints_clean() {
    use mcpfleet_tools::{Catalog, Registry, lint, validate::Validator};
    use serde_json::json;
    let me = include_str!("writing_a_tool.rs");
    let code = me.split("// --- page: begin\n").nth(1).and_then(|s| s.split("// --- page: end").next()).unwrap_or("");
    assert_eq!(block_after("and a refusal\nthe model can act on:"), code, "the page's example is this file's");
    let mut r = Registry::new();
    assert!(r.register(OrderStatus(HashMap::new())).is_ok());
    let tools = r.tools();
    assert!(lint::lint_tool(&tools[0]).is_empty(), "{:?}", lint::lint_tool(&tools[0]));
    assert_eq!(tools[0]["inputSchema"]["properties"]["order_id"]["pattern"], "^ord_[0-9]{1,16}$");
    assert_eq!(r.tool_scopes("order_status"), ["orders:read"]);
    let v = Validator::new(&tools).unwrap_or_else(|e| panic!("{e}"));
    assert!(v.check("order_status", &json!({ "order_id": "ord_42" })).is_ok());
    assert!(v.check("order_status", &json!({ "order_id": "ord_42", "user": "bob" })).is_err());
    assert!(v.check("order_status", &json!({ "order_id": "42" })).is_err());
}
