//! `mcpfleet lint URL`: connects to any MCP server as a client over Streamable HTTP, lists its tools, and runs the
//! schema lint the server itself runs at start-up (`mcpfleet_tools::lint`) on each one.

use crate::config::LintRequest;
use mcpfleet_tools::lint::{Finding, Severity, lint_tool};
use serde_json::{Value, json};
use std::time::Duration;

/// Exit codes: 0 no error (warnings allowed), 1 at least one error, 69 the server could not be listed.
pub const EXIT_FINDINGS: i32 = 1;
pub const EXIT_UNREACHABLE: i32 = 69;

struct Client {
    http: reqwest::Client,
    url: String,
    token: Option<String>,
    session: Option<String>,
}

impl Client {
    async fn post(&self, body: &Value) -> Result<(reqwest::header::HeaderMap, String), String> {
        let mut rb = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25");
        if let Some(t) = &self.token {
            rb = rb.bearer_auth(t);
        }
        if let Some(s) = &self.session {
            rb = rb.header("mcp-session-id", s);
        }
        let resp = rb.body(body.to_string()).send().await.map_err(|e| format!("cannot reach {}: {e}", self.url))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.map_err(|e| format!("reading the answer: {e}"))?;
        if !status.is_success() {
            return Err(format!("{} answered HTTP {status}: {}", self.url, text.chars().take(200).collect::<String>()));
        }
        Ok((headers, text))
    }

    /// A request's result, from a JSON answer or from the SSE stream that carries it.
    async fn request(
        &self,
        id: u64,
        method: &str,
        params: Value,
    ) -> Result<(reqwest::header::HeaderMap, Value), String> {
        let (headers, text) =
            self.post(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })).await?;
        let is_answer = |v: &Value| v.get("id") == Some(&json!(id));
        let answer = if text.trim_start().starts_with('{') {
            serde_json::from_str::<Value>(&text).ok().filter(is_answer)
        } else {
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
                .find(is_answer)
        };
        let answer = answer.ok_or_else(|| format!("no answer to {method} in what the server sent"))?;
        if let Some(e) = answer.get("error") {
            return Err(format!("{method} failed: {e}"));
        }
        Ok((headers, answer.get("result").cloned().unwrap_or(Value::Null)))
    }
}

/// Lists the server's tools (all pages).
///
/// # Errors
/// The server cannot be reached, or does not speak MCP over Streamable HTTP.
pub async fn list_tools(url: &str, token: Option<&str>) -> Result<Vec<Value>, String> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("http client: {e}"))?;
    let mut c = Client { http, url: url.to_owned(), token: token.map(str::to_owned), session: None };
    let init = json!({ "protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": { "name": "mcpfleet-lint", "version": env!("CARGO_PKG_VERSION") } });
    let (headers, _) = c.request(0, "initialize", init).await?;
    c.session = headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    c.post(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })).await?;
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 1..=100_u64 {
        let params = cursor.as_ref().map_or_else(|| json!({}), |c| json!({ "cursor": c }));
        let (_, result) = c.request(page, "tools/list", params).await?;
        tools.extend(result.get("tools").and_then(Value::as_array).cloned().unwrap_or_default());
        cursor = result.get("nextCursor").and_then(Value::as_str).map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    if c.session.is_some() {
        let mut rb = c.http.delete(&c.url).header("mcp-protocol-version", "2025-11-25");
        if let Some(t) = &c.token {
            rb = rb.bearer_auth(t);
        }
        if let Some(s) = &c.session {
            rb = rb.header("mcp-session-id", s);
        }
        let _ = rb.send().await;
    }
    Ok(tools)
}

/// Runs the `lint` subcommand of the server named `name` (the prefix of its error line) and returns its exit code;
/// prints the report on stdout.
pub async fn run(name: &str, req: &LintRequest) -> i32 {
    let tools = match list_tools(&req.url, req.token.as_ref().map(crate::config::Secret::expose)).await {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{name}: lint: {e}");
            return EXIT_UNREACHABLE;
        }
    };
    let report: Vec<(String, Vec<Finding>)> =
        tools.iter().map(|t| (t.get("name").and_then(Value::as_str).unwrap_or("?").to_owned(), lint_tool(t))).collect();
    let count = |s: Severity| report.iter().flat_map(|(_, f)| f).filter(|f| f.severity == s).count();
    let (errors, warnings) = (count(Severity::Error), count(Severity::Warning));
    if req.json {
        let tools: Vec<Value> = report
            .iter()
            .map(|(name, findings)| {
                let f: Vec<Value> = findings
                    .iter()
                    .map(|f| {
                        let sev = if f.severity == Severity::Error { "error" } else { "warning" };
                        json!({ "severity": sev, "pointer": f.pointer, "rule": f.rule, "message": f.message })
                    })
                    .collect();
                json!({ "name": name, "findings": f })
            })
            .collect();
        println!("{}", json!({ "url": req.url, "tools": tools, "errors": errors, "warnings": warnings }));
    } else {
        for (name, findings) in &report {
            println!(
                "{name}: {} error(s), {} warning(s)",
                findings.iter().filter(|f| f.severity == Severity::Error).count(),
                findings.iter().filter(|f| f.severity == Severity::Warning).count()
            );
            for f in findings {
                let sev = if f.severity == Severity::Error { "error" } else { "warning" };
                println!("  {sev} {f}");
            }
        }
        println!("{} tool(s), {errors} error(s), {warnings} warning(s)", report.len());
    }
    if errors > 0 { EXIT_FINDINGS } else { 0 }
}
