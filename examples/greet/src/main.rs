//! greet: one tool on a fleet of mcpfleet replicas. `greet serve --redis-url …` runs a replica with every flag of
//! the `mcpfleet` binary; `greet --help` lists them.

use mcpfleet::{JsonSchema, Tool, ToolContext, ToolError, ToolInfo, ToolOutput, async_trait, schemars};
use serde::Deserialize;

#[global_allocator]
static ALLOCATOR: mcpfleet::mimalloc::MiMalloc = mcpfleet::mimalloc::MiMalloc;

/// Says hello.
struct Greet;

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// Who to greet.
    #[schemars(length(max = 64))]
    name: String,
}

#[async_trait]
impl Tool for Greet {
    type Args = Args;

    fn info(&self) -> ToolInfo {
        ToolInfo::new("greet").title("Greet").description("Says hello to someone by name.").read_only().idempotent()
    }

    async fn call(&self, args: Args, cx: &dyn ToolContext) -> Result<ToolOutput, ToolError> {
        mcpfleet::tracing::info!(principal.sub = %cx.principal().subject, "greeting");
        Ok(ToolOutput::text(format!("Hello, {}", args.name)))
    }
}

fn main() -> std::process::ExitCode {
    mcpfleet::Server::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).tool(Greet).run()
}

#[cfg(test)]
mod tests {
    use super::Greet;
    use mcpfleet::serde_json::json;
    use mcpfleet::testing::Harness;

    #[tokio::test]
    async fn greets_through_the_whole_pipeline() {
        let server = mcpfleet::Server::new("greet", "0.1.0").tool(Greet);
        let h = Harness::new(server).await.expect("the server starts");
        let ok = h.call("greet", json!({ "name": "Ada" })).await.expect("a result");
        assert_eq!(ok.text(), "Hello, Ada");
        // Refused before the handler runs: the model gets an isError result naming the argument.
        let long = h.call("greet", json!({ "name": "x".repeat(65) })).await.expect("a result");
        assert!(long.is_error && long.text().contains("/arguments/name"), "{long:?}");
        let unknown = h.call("greet", json!({ "name": "Ada", "admin": true })).await.expect("a result");
        assert!(unknown.is_error && unknown.text().contains("unexpected: \"admin\""), "{unknown:?}");
    }
}
