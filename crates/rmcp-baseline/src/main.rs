//! rmcp-baseline: what `tests/bench.sh` and `tests/cost.sh` compare mcpfleet with. The official Rust SDK (rmcp)
//! serving Streamable HTTP the way its documentation shows: in-process sessions (`LocalSessionManager`, a worker per
//! session, so a client must stay on this one process), no authentication, no limits, no store. Its tools answer
//! what mcpfleet's conformance fixtures of the same names answer:
//!
//! - `test_simple_text`: one short text;
//! - `bench_progress`: 5 progress notifications (to a call that carries a `progressToken`), without a pause, then
//!   a short text;
//! - `bench_blob`: 65 536 bytes of text;
//! - `slow_job` (`{"seconds": n}`, at most 600): sleeps n seconds, then says so; a task (rmcp's `TaskManager`, in
//!   this process) when the request declares the tasks extension, else inline.
//!
//! `rmcp-baseline [--stateless] [ADDR]` listens on ADDR (default `127.0.0.1:0`) and prints `listening on <addr>`.
//! A 2026-07-28 request (its version in `_meta`) is always served without a session, as rmcp serves that
//! generation; `--stateless` also turns the legacy session mode off and answers a request whose first message is
//! its response with plain JSON (`json_response`), as mcpfleet answers a 2026-07-28 call.
//!
//! It is a benchmark's yardstick, not a server of this project: it must not depend on any mcpfleet crate.

use rmcp::ErrorData;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock, CreateTaskResult,
    GetTaskParams, GetTaskResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::task_manager::{TaskExit, TaskManager, TaskOptions};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// The answer of mcpfleet's `test_simple_text` fixture.
const TEXT: &str = "This is a simple text response for testing.";
/// How many progress notifications `bench_progress` sends, and what it answers after them.
const PROGRESS_COUNT: u32 = 5;
const PROGRESS_TEXT: &str = "sent 5 progress notifications";
/// The length of `bench_blob`'s text.
const BLOB_BYTES: usize = 65_536;
/// The most seconds `slow_job` sleeps.
const MAX_SLEEP_SECONDS: u64 = 600;

#[derive(Clone)]
struct Baseline {
    tools: Arc<Vec<Tool>>,
    /// Shared by every handler: a 2026-07-28 request gets a handler of its own, and polls its task through another.
    tasks: TaskManager,
}

fn text(t: impl Into<String>) -> CallToolResponse {
    CallToolResponse::Complete(CallToolResult::success(vec![ContentBlock::text(t)]))
}

impl ServerHandler for Baseline {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items((*self.tools).clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        let no_args = || {
            if arguments.is_empty() {
                Ok(())
            } else {
                Err(ErrorData::invalid_params(format!("{} takes no arguments", request.name), None))
            }
        };
        match &*request.name {
            "test_simple_text" => {
                no_args()?;
                Ok(text(TEXT))
            }
            "bench_progress" => {
                no_args()?;
                if let Some(token) = context.meta.get_progress_token() {
                    for i in 1..=PROGRESS_COUNT {
                        let p = ProgressNotificationParam::new(token.clone(), f64::from(i))
                            .with_total(f64::from(PROGRESS_COUNT));
                        context
                            .peer
                            .notify_progress(p)
                            .await
                            .map_err(|e| ErrorData::internal_error(format!("progress not sent: {e}"), None))?;
                    }
                }
                Ok(text(PROGRESS_TEXT))
            }
            "bench_blob" => {
                no_args()?;
                Ok(text("x".repeat(BLOB_BYTES)))
            }
            "slow_job" => {
                let seconds = arguments
                    .get("seconds")
                    .and_then(Value::as_u64)
                    .filter(|s| *s <= MAX_SLEEP_SECONDS && arguments.len() == 1)
                    .ok_or_else(|| ErrorData::invalid_params("slow_job takes {\"seconds\": 0..=600}", None))?;
                let run = async move {
                    tokio::time::sleep(Duration::from_secs(seconds)).await;
                    CallToolResult::success(vec![ContentBlock::text(format!("slow_job: done after {seconds} s"))])
                };
                if !context.client_capabilities().is_some_and(|caps| caps.supports_tasks()) {
                    return Ok(CallToolResponse::Complete(run.await));
                }
                let task = self.tasks.spawn(TaskOptions::new(), move |cx| {
                    Box::pin(async move {
                        tokio::select! {
                            () = cx.cancelled() => Err(TaskExit::Cancelled),
                            result = run => Ok(result),
                        }
                    })
                });
                Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
            }
            other => Err(ErrorData::invalid_params(format!("unknown tool: {other}"), None)),
        }
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        Ok(GetTaskResult::new(self.tasks.get_task(&request.task_id)?))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.cancel_task(&request.task_id)
    }
}

/// A tool with a closed input schema of these properties.
fn tool(name: &'static str, description: &'static str, properties: Value, required: &[&str]) -> Tool {
    let schema =
        json!({ "type": "object", "properties": properties, "required": required, "additionalProperties": false });
    let Value::Object(schema) = schema else { unreachable!("an object literal") };
    Tool::new(name, description, schema)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut stateless = false;
    let mut addr = "127.0.0.1:0".to_owned();
    for a in std::env::args().skip(1) {
        if a == "--stateless" {
            stateless = true;
        } else {
            addr = a;
        }
    }
    let tools = Arc::new(vec![
        tool("test_simple_text", "Returns a simple text response", json!({}), &[]),
        tool(
            "bench_progress",
            "Reports progress 5 times without a pause (with a progressToken), then answers (benchmarks)",
            json!({}),
            &[],
        ),
        tool("bench_blob", "Returns 65 536 bytes of text (benchmarks)", json!({}), &[]),
        tool(
            "slow_job",
            "Sleeps `seconds` (a task when the request declares the tasks extension)",
            json!({ "seconds": { "type": "integer", "minimum": 0, "maximum": MAX_SLEEP_SECONDS } }),
            &["seconds"],
        ),
    ]);
    let handler = Baseline { tools, tasks: TaskManager::new() };
    let config =
        StreamableHttpServerConfig::default().with_legacy_session_mode(!stateless).with_json_response(stateless);
    let service =
        StreamableHttpService::new(move || Ok(handler.clone()), Arc::new(LocalSessionManager::default()), config);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on {}", listener.local_addr()?);
    // As mcpfleet does: without TCP_NODELAY a reply written in two pieces waits for a delayed ACK.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let app = axum::Router::new().nest_service("/mcp", service);
    axum::serve(listener, app).await
}
