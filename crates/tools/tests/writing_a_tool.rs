//! The example of docs/WRITING-A-TOOL.md, compiled and run, so that the page stays true. The code between the
//! `README: begin`/`README: end` markers (named when the example lived in the README) is the page's, line for line.

// --- README: begin
use async_trait::async_trait;
use mcpfleet_tools::{Annotations, Quota, TaskSupport, Tool, ToolContext, ToolError, ToolInfo, ToolOutput};
use serde::Deserialize;
use serde_json::json;
use std::{collections::HashMap, time::Duration};
struct OrderStatus(HashMap<(String, String), String>); // (principal, order id) → status

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    order_id: String,
}

#[async_trait]
impl Tool for OrderStatus {
    type Args = Args;
    fn info(&self) -> ToolInfo {
        ToolInfo {
            name: "order_status",
            title: "Order status",
            description: "The status of one of the calling user's orders.",
            input_schema: json!({ "type": "object", "required": ["order_id"], "additionalProperties": false,
                "properties": { "order_id": { "type": "string", "maxLength": 20, "pattern": "^ord_[0-9]{1,16}$" } } }),
            output_schema: None,
            annotations: Annotations { read_only: true, idempotent: true, ..Annotations::default() },
            scopes: &["tools:read"],
            quota: Some(Quota::new(100, Duration::from_secs(3600))),
            timeout: Some(Duration::from_secs(5)),
            task: TaskSupport::default(),
        }
    }

    async fn call(&self, a: Args, cx: &dyn ToolContext) -> Result<ToolOutput, ToolError> {
        let who = cx.principal().user.as_str().to_owned(); // the verified token's principal, never an argument
        match self.0.get(&(who, a.order_id.clone())) {
            Some(status) => Ok(ToolOutput::text(format!("{}: {status}", a.order_id))),
            None => Err(ToolError::Failed(format!("no order {} among yours", a.order_id))),
        }
    }
}
// --- README: end

#[test]
fn the_readme_tool_registers_lints_clean_and_validates() {
    use mcpfleet_tools::{Catalog, Registry, lint, validate::Validator};
    let mut r = Registry::new();
    assert!(r.register(OrderStatus(HashMap::new())).is_ok());
    let tools = r.tools();
    assert!(lint::lint_tool(&tools[0]).is_empty(), "{:?}", lint::lint_tool(&tools[0]));
    let v = Validator::new(&tools).unwrap_or_else(|e| panic!("{e}"));
    assert!(v.check("order_status", &json!({ "order_id": "ord_42" })).is_ok());
    assert!(v.check("order_status", &json!({ "order_id": "ord_42", "user": "bob" })).is_err());
    let readme = include_str!("../../../docs/WRITING-A-TOOL.md");
    let me = include_str!("writing_a_tool.rs");
    let code =
        me.split("// --- README: begin\n").nth(1).and_then(|s| s.split("// --- README: end").next()).unwrap_or("");
    assert!(readme.contains(code.trim()), "docs/WRITING-A-TOOL.md's example is this file's");
    assert!(code.trim().lines().count() <= 40, "a complete tool in 40 lines");
}
