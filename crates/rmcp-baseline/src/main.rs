//! rmcp-baseline: what `tests/bench.sh` compares mcpfleet with. The official Rust SDK (rmcp) serving Streamable
//! HTTP the way its documentation shows: in-process sessions (`LocalSessionManager`, a worker per session, so a
//! client must stay on this one process), no authentication, no limits, no store; and one tool,
//! `test_simple_text`, answering what mcpfleet's conformance fixture of that name answers.
//!
//! `rmcp-baseline [ADDR]` listens on ADDR (default `127.0.0.1:0`) and prints `listening on <addr>`.
//!
//! It is a benchmark's yardstick, not a server of this project: it must not depend on any mcpfleet crate.

use rmcp::ErrorData;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use std::sync::Arc;

/// The answer of mcpfleet's `test_simple_text` fixture.
const TEXT: &str = "This is a simple text response for testing.";

#[derive(Clone, Debug)]
struct Baseline {
    tool: Arc<Tool>,
}

impl ServerHandler for Baseline {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![(*self.tool).clone()]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name != self.tool.name {
            return Err(ErrorData::invalid_params(format!("unknown tool: {}", request.name), None));
        }
        Ok(CallToolResponse::Complete(CallToolResult::success(vec![ContentBlock::text(TEXT)])))
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:0".to_owned());
    let schema = serde_json::json!({ "type": "object", "properties": {}, "additionalProperties": false });
    let serde_json::Value::Object(schema) = schema else { unreachable!("an object literal") };
    let tool = Arc::new(Tool::new("test_simple_text", "Returns a simple text response", schema));
    let service = StreamableHttpService::new(
        move || Ok(Baseline { tool: tool.clone() }),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on {}", listener.local_addr()?);
    // As mcpfleet does: without TCP_NODELAY a reply written in two pieces waits for a delayed ACK.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let app = axum::Router::new().nest_service("/mcp", service);
    axum::serve(listener, app).await
}
