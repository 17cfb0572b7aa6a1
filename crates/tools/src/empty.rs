use crate::{Catalog, JsonObject, ToolContext, ToolError};
use async_trait::async_trait;
use serde_json::{Value, json};

/// A server with nothing registered yet: the default until tools are configured.
#[derive(Debug, Default)]
pub struct EmptyCatalog;

#[async_trait]
impl Catalog for EmptyCatalog {
    fn capabilities(&self) -> Value {
        json!({ "tools": { "listChanged": false }, "logging": {} })
    }

    fn tools(&self) -> Vec<Value> {
        Vec::new()
    }

    async fn call_tool(&self, name: &str, _args: JsonObject, _cx: &dyn ToolContext) -> Result<Value, ToolError> {
        Err(ToolError::UnknownTool(name.to_owned()))
    }
}
