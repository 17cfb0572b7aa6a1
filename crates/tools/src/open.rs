//! Tools whose input schemas break every rule of the lint, one tool per kind of offence. A server refuses to start
//! with them (`--fixtures open` exits 64 listing the offences); `mcpfleet lint` is tested against a server that
//! serves them anyway. They exist for those tests only.

use crate::{Catalog, JsonObject, ToolContext, ToolError};
use async_trait::async_trait;
use serde_json::{Value, json};

/// The open catalog.
#[derive(Debug, Default)]
pub struct OpenCatalog;

#[async_trait]
impl Catalog for OpenCatalog {
    fn capabilities(&self) -> Value {
        json!({ "tools": { "listChanged": false } })
    }

    fn tools(&self) -> Vec<Value> {
        let tool = |name: &str, schema: Value| json!({ "name": name, "description": "open on purpose", "inputSchema": schema });
        vec![
            tool("open_options", json!({ "type": "object", "properties": { "options": { "type": "object" } } })),
            tool(
                "unbounded_values",
                json!({ "type": "object", "properties": {
                    "note": { "type": "string" },
                    "amount": { "type": "number", "minimum": 0 },
                    "ids": { "type": "array", "items": { "type": "string", "maxLength": 8 } },
                    "user_id": { "type": "string", "maxLength": 36 },
                }, "additionalProperties": false }),
            ),
            tool(
                "ambiguous_lookup",
                json!({ "type": "object", "oneOf": [
                    { "properties": { "id": { "type": "string", "maxLength": 8, "pattern": "^[0-9]+$" } }, "required": ["id"] },
                    { "properties": { "name": { "type": "string", "maxLength": 8 } }, "required": ["name"] },
                ], "unevaluatedProperties": false }),
            ),
            tool(
                "composed_wrong",
                json!({ "type": "object", "allOf": [{ "properties": { "a": { "type": "boolean" } } }],
                        "additionalProperties": false }),
            ),
            tool(
                "old_dialect",
                json!({ "$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {},
                        "additionalProperties": false }),
            ),
        ]
    }

    async fn call_tool(&self, name: &str, _args: JsonObject, _cx: &dyn ToolContext) -> Result<Value, ToolError> {
        Err(ToolError::UnknownTool(name.chars().take(128).collect()))
    }
}
