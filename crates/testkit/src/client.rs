use futures::StreamExt as _;
use serde_json::{Value, json};
use std::time::Duration;

/// One SSE event as the client saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    pub id: Option<String>,
    pub data: String,
    pub retry: Option<u64>,
}

impl SseEvent {
    /// The data as JSON, if it is JSON.
    #[must_use]
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.data).ok()
    }
}

/// A raw MCP client over HTTP, for tests that need to see statuses, headers and single SSE events.
#[derive(Debug, Clone)]
pub struct McpClient {
    pub http: reqwest::Client,
    pub user: Option<String>,
    /// Sent as `Authorization: Bearer …`.
    pub token: Option<String>,
    pub session: Option<String>,
}

/// An open SSE response, read event by event.
pub struct SseStream {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: String,
}

impl std::fmt::Debug for SseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SseStream").finish_non_exhaustive()
    }
}

impl SseStream {
    #[must_use]
    pub fn new(resp: reqwest::Response) -> Self {
        Self { body: resp.bytes_stream().boxed(), buf: String::new() }
    }

    /// The next event (keep-alive comments skipped), `None` when the server closed the stream, or an error
    /// after `timeout`.
    ///
    /// # Errors
    /// Timeout or a broken connection.
    pub async fn next(&mut self, timeout: Duration) -> Result<Option<SseEvent>, String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(pos) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..pos + 2).collect();
                let mut ev = SseEvent { id: None, data: String::new(), retry: None };
                let mut any = false;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        ev.id = Some(v.trim().to_owned());
                        any = true;
                    } else if let Some(v) = line.strip_prefix("data:") {
                        ev.data.push_str(v.strip_prefix(' ').unwrap_or(v));
                        any = true;
                    } else if let Some(v) = line.strip_prefix("retry:") {
                        ev.retry = v.trim().parse().ok();
                        any = true;
                    }
                }
                if any {
                    return Ok(Some(ev));
                }
                continue;
            }
            match tokio::time::timeout_at(deadline, self.body.next()).await {
                Err(_) => return Err("timed out waiting for an SSE event".into()),
                Ok(None) => return Ok(None),
                Ok(Some(Err(e))) => return Err(format!("stream broke: {e}")),
                Ok(Some(Ok(b))) => self.buf.push_str(&String::from_utf8_lossy(&b)),
            }
        }
    }

    /// Reads until the server closes the stream; returns every event.
    ///
    /// # Errors
    /// Timeout or a broken connection.
    pub async fn collect(&mut self, timeout: Duration) -> Result<Vec<SseEvent>, String> {
        let mut out = Vec::new();
        while let Some(e) = self.next(timeout).await? {
            out.push(e);
        }
        Ok(out)
    }

    /// Reads events until a server→client request for `method` arrives; returns that message.
    ///
    /// # Errors
    /// Timeout, a broken connection, or a stream that ended first.
    pub async fn until_method(&mut self, method: &str, timeout: Duration) -> Result<Value, String> {
        loop {
            let e = self.next(timeout).await?.ok_or_else(|| format!("the stream ended before {method}"))?;
            if let Some(m) = e.json().filter(|m| m["method"] == method) {
                return Ok(m);
            }
        }
    }
}

/// The JSON-RPC messages among `events` (priming events and keep-alives carry none).
#[must_use]
pub fn data_messages(events: &[SseEvent]) -> Vec<Value> {
    events.iter().filter(|e| !e.data.is_empty()).filter_map(SseEvent::json).collect()
}

/// The `progress` values of the `notifications/progress` among `messages`, in order.
#[must_use]
pub fn progress_values(messages: &[Value]) -> Vec<u64> {
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "progress counts in the tests")]
    messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .filter_map(|m| m["params"]["progress"].as_f64())
        .map(|f| f as u64)
        .collect()
}

impl McpClient {
    #[must_use]
    pub fn new() -> Self {
        crate::init_tls();
        Self {
            http: reqwest::Client::builder().no_proxy().build().expect("client"),
            user: None,
            token: None,
            session: None,
        }
    }

    /// Acts as this principal (through the test authenticator).
    #[must_use]
    pub fn as_user(mut self, user: &str) -> Self {
        self.user = Some(user.to_owned());
        self
    }

    /// Sends this bearer token.
    #[must_use]
    pub fn with_token(mut self, token: &str) -> Self {
        self.token = Some(token.to_owned());
        self
    }

    /// Who the client is: its bearer token, or its test principal.
    fn identity(&self, mut rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        if let Some(t) = &self.token {
            rb = rb.header("authorization", format!("Bearer {t}"));
        }
        if let Some(u) = &self.user {
            rb = rb.header(crate::TEST_USER_HEADER, u);
        }
        rb
    }

    fn headers(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let mut rb = self.identity(rb.header("mcp-protocol-version", "2025-11-25"));
        if let Some(s) = &self.session {
            rb = rb.header("mcp-session-id", s);
        }
        rb
    }

    /// POSTs one JSON-RPC message.
    ///
    /// # Panics
    /// On a connection error.
    pub async fn post(&self, url: &str, body: &Value) -> reqwest::Response {
        self.post_with(url, body, &[]).await
    }

    /// POSTs one JSON-RPC message with extra headers (e.g. `traceparent`, `x-request-id`) besides the client's own.
    ///
    /// # Panics
    /// On a connection error.
    pub async fn post_with(&self, url: &str, body: &Value, extra: &[(&str, &str)]) -> reqwest::Response {
        let mut rb = self
            .headers(self.http.post(url))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        for (k, v) in extra {
            rb = rb.header(*k, *v);
        }
        rb.body(body.to_string()).send().await.expect("POST")
    }

    /// POSTs `body` exactly as given (for what a `Value` cannot hold: a duplicate key, `1.0`, `-0`), with the
    /// client's identity and session, and `version` as `MCP-Protocol-Version` (none when `None`).
    ///
    /// # Panics
    /// On a connection error.
    pub async fn post_raw(&self, url: &str, body: &str, version: Option<&str>) -> reqwest::Response {
        let mut rb = self
            .identity(self.http.post(url))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(s) = &self.session {
            rb = rb.header("mcp-session-id", s);
        }
        if let Some(v) = version {
            rb = rb.header("mcp-protocol-version", v);
        }
        rb.body(body.to_owned()).send().await.expect("POST")
    }

    /// Initializes a session and sends `notifications/initialized`; keeps the session id.
    ///
    /// # Panics
    /// If initialization fails.
    pub async fn initialize(&mut self, url: &str) -> String {
        self.initialize_with(url, json!({ "sampling": {}, "elicitation": {} })).await
    }

    /// [`initialize`](Self::initialize), declaring `capabilities`.
    ///
    /// # Panics
    /// If initialization fails.
    pub async fn initialize_with(&mut self, url: &str, capabilities: Value) -> String {
        let body = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": capabilities,
            "clientInfo": { "name": "mcpfleet-tests", "version": "1" } } });
        let resp = self.post(url, &body).await;
        assert_eq!(resp.status(), 200, "initialize failed");
        let sid = resp.headers().get("mcp-session-id").expect("session id").to_str().expect("ascii").to_owned();
        self.session = Some(sid.clone());
        let r = self.post(url, &json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })).await;
        assert_eq!(r.status(), 202);
        sid
    }

    /// A request; returns the JSON body of a JSON response.
    ///
    /// # Panics
    /// If the response is not 200 JSON.
    pub async fn request(&self, url: &str, id: i64, method: &str, params: Value) -> Value {
        let resp = self.post(url, &json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })).await;
        assert_eq!(resp.status(), 200, "{method} failed");
        resp.json().await.expect("json body")
    }

    /// Starts a tool call and returns its SSE stream (panics if it answered with JSON).
    ///
    /// # Panics
    /// If the response is not an SSE stream.
    pub async fn call_streaming(&self, url: &str, id: i64, tool: &str, args: Value) -> SseStream {
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": { "name": tool, "arguments": args, "_meta": { "progressToken": id } } });
        let resp = self.post(url, &body).await;
        assert_eq!(resp.status(), 200);
        let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert!(ct.starts_with("text/event-stream"), "expected SSE, got {ct}");
        SseStream::new(resp)
    }

    /// GET on the endpoint, optionally resuming from `last_event_id`.
    ///
    /// # Panics
    /// On a connection error.
    pub async fn get(&self, url: &str, last_event_id: Option<&str>) -> reqwest::Response {
        let mut rb = self.headers(self.http.get(url)).header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            rb = rb.header("last-event-id", id);
        }
        rb.send().await.expect("GET")
    }

    /// DELETE of the session.
    ///
    /// # Panics
    /// On a connection error.
    pub async fn delete(&self, url: &str) -> reqwest::Response {
        self.headers(self.http.delete(url)).send().await.expect("DELETE")
    }
}

impl Default for McpClient {
    fn default() -> Self {
        Self::new()
    }
}

/// A client of the 2026-07-28 generation: every request carries its version, capabilities and client info in
/// `_meta`, and the `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers; there is no session.
#[derive(Debug, Clone)]
pub struct StatelessClient {
    /// The connection and the identity (no session: a 2026-07-28 client never has one).
    base: McpClient,
    capabilities: Value,
}

impl StatelessClient {
    /// A client that declares the sampling, elicitation and roots capabilities.
    #[must_use]
    pub fn new() -> Self {
        Self { base: McpClient::new(), capabilities: json!({ "sampling": {}, "elicitation": {}, "roots": {} }) }
    }

    /// Acts as this principal (through the test authenticator).
    #[must_use]
    pub fn as_user(self, user: &str) -> Self {
        Self { base: self.base.as_user(user), ..self }
    }

    /// Sends this bearer token.
    #[must_use]
    pub fn with_token(self, token: &str) -> Self {
        Self { base: self.base.with_token(token), ..self }
    }

    /// Declares these client capabilities on every request.
    #[must_use]
    pub fn with_capabilities(mut self, capabilities: Value) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// The request `method` with `params`, its `_meta` completed with the per-request fields.
    #[must_use]
    pub fn body(&self, id: i64, method: &str, mut params: Value) -> Value {
        let meta = params.as_object_mut().expect("params object").entry("_meta").or_insert_with(|| json!({}));
        let m = meta.as_object_mut().expect("_meta object");
        m.entry("io.modelcontextprotocol/protocolVersion").or_insert_with(|| json!("2026-07-28"));
        m.entry("io.modelcontextprotocol/clientCapabilities").or_insert_with(|| self.capabilities.clone());
        m.entry("io.modelcontextprotocol/clientInfo")
            .or_insert_with(|| json!({ "name": "mcpfleet-tests", "version": "1" }));
        json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
    }

    /// POSTs `body` with the standard headers taken from it, plus `extra` (which may override them).
    ///
    /// # Panics
    /// On a connection error.
    pub async fn send(&self, url: &str, body: &Value, extra: &[(&str, &str)]) -> reqwest::Response {
        let method = body["method"].as_str().unwrap_or("");
        let version =
            body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"].as_str().unwrap_or("2026-07-28");
        let mut rb = self
            .base
            .identity(self.base.http.post(url))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        let overridden = |h: &str| extra.iter().any(|(k, _)| k.eq_ignore_ascii_case(h));
        if !overridden("mcp-protocol-version") {
            rb = rb.header("mcp-protocol-version", version);
        }
        if !overridden("mcp-method") {
            rb = rb.header("mcp-method", method);
        }
        let name = match method {
            "tools/call" | "prompts/get" => body["params"]["name"].as_str(),
            "resources/read" => body["params"]["uri"].as_str(),
            "tasks/get" | "tasks/update" | "tasks/cancel" => body["params"]["taskId"].as_str(),
            _ => None,
        };
        if let Some(n) = name.filter(|_| !overridden("mcp-name")) {
            rb = rb.header("mcp-name", n);
        }
        for (k, v) in extra {
            rb = rb.header(*k, *v);
        }
        rb.body(body.to_string()).send().await.expect("POST")
    }

    /// A request answered with JSON: the status and the body.
    ///
    /// # Panics
    /// On a connection error or a body that is not JSON.
    pub async fn request(&self, url: &str, id: i64, method: &str, params: Value) -> (u16, Value) {
        let resp = self.send(url, &self.body(id, method, params), &[]).await;
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("json body"))
    }

    /// `tools/call` of `tool` with `args` and any other `params` (`inputResponses`, `requestState`, `_meta`);
    /// the JSON-RPC response, from a JSON or an SSE answer.
    ///
    /// # Panics
    /// On a connection error, or an answer without a response.
    pub async fn call(&self, url: &str, id: i64, tool: &str, args: Value, mut params: Value) -> Value {
        params["name"] = json!(tool);
        params["arguments"] = args;
        let resp = self.send(url, &self.body(id, "tools/call", params), &[]).await;
        response_of(resp).await
    }

    /// Polls `tasks/get` for `task` over `urls` in turn, every 100 ms, until `done` holds for the task; returns it
    /// (the `result` of the last answer).
    ///
    /// # Panics
    /// On an answer that is not 200, or when `secs` pass first (with the last answer).
    pub async fn poll_task(&self, urls: &[String], task: &str, secs: u64, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        for i in 0.. {
            let (status, r) = self.request(&urls[i % urls.len()], 2, "tasks/get", json!({ "taskId": task })).await;
            assert_eq!(status, 200, "{r}");
            let t = r["result"].clone();
            if done(&t) {
                return t;
            }
            assert!(std::time::Instant::now() < deadline, "task {task} never got there in {secs} s; last: {t}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        unreachable!("the loop returns or panics")
    }
}

impl Default for StatelessClient {
    fn default() -> Self {
        Self::new()
    }
}

/// The JSON-RPC response of an answer: the JSON body, or the SSE event that carries it.
///
/// # Panics
/// On a body with no response.
pub async fn response_of(resp: reqwest::Response) -> Value {
    let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    if !ct.starts_with("text/event-stream") {
        return resp.json().await.expect("json body");
    }
    let mut s = SseStream::new(resp);
    loop {
        let e = s.next(std::time::Duration::from_secs(30)).await.expect("sse").expect("a response before the end");
        if let Ok(v) = serde_json::from_str::<Value>(&e.data)
            && (v.get("result").is_some() || v.get("error").is_some())
        {
            return v;
        }
    }
}
