//! Interoperability with the official Rust SDK: rmcp's own Streamable HTTP client, through a round-robin proxy in
//! front of three replicas sharing one Redis, so that consecutive requests of its session (and its answer to a
//! sampling request) land on different replicas.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]
#![expect(
    deprecated,
    reason = "sampling and logging are deprecated by the 2026-07-28 revision; this test covers the 2025 generation"
)]

use mcpfleet_testkit::{Fleet, RedisServer, RoundRobinProxy};
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, CreateMessageRequestParams, CreateMessageResult,
    Implementation, LoggingMessageNotificationParam, ProtocolVersion, SamplingCapability, SamplingMessage,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt as _};
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct TestClient {
    prompts: Arc<Mutex<Vec<String>>>,
    logs: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl ClientHandler for TestClient {
    fn get_info(&self) -> ClientConfig {
        let mut caps = ClientCapabilities::default();
        caps.sampling = Some(SamplingCapability::default());
        ClientConfig::new(caps, Implementation::new("rmcp-test", "1"))
            .with_protocol_version(ProtocolVersion::V_2025_11_25)
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _cx: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let prompt = serde_json::to_value(&params.messages).unwrap_or_default().to_string();
        self.prompts.lock().unwrap().push(prompt);
        Ok(CreateMessageResult::new(SamplingMessage::assistant_text("answered by rmcp"), "test-model".to_owned()))
    }

    async fn on_logging_message(&self, params: LoggingMessageNotificationParam, _cx: NotificationContext<RoleClient>) {
        self.logs.lock().unwrap().push(params.data);
    }
}

fn text_of(result: &rmcp::model::CallToolResult) -> String {
    serde_json::to_value(&result.content).unwrap()[0]["text"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_client_through_round_robin_proxy() {
    let redis = RedisServer::start();
    let fleet = Fleet::builder().replicas(3).redis(redis.url()).start().await;
    let proxy = RoundRobinProxy::start(fleet.bases()).await;
    let handler = TestClient::default();
    let client = handler.clone().serve(StreamableHttpClientTransport::from_uri(proxy.url())).await.unwrap();

    let tools = client.peer().list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "test_sampling"));

    let simple = client.peer().call_tool(CallToolRequestParams::new("test_simple_text")).await.unwrap();
    assert_eq!(text_of(&simple), "This is a simple text response for testing.");

    let args = serde_json::json!({ "prompt": "from rmcp" }).as_object().cloned().unwrap();
    let sampled =
        client.peer().call_tool(CallToolRequestParams::new("test_sampling").with_arguments(args)).await.unwrap();
    assert_eq!(text_of(&sampled), "LLM response: answered by rmcp");
    assert!(handler.prompts.lock().unwrap()[0].contains("from rmcp"));

    let logged = client.peer().call_tool(CallToolRequestParams::new("test_tool_with_logging")).await.unwrap();
    assert_eq!(text_of(&logged), "Logging test completed");
    // rmcp handles each notification in a task of its own, so the count may trail the call's result a little.
    let logs = handler.logs.clone();
    mcpfleet_testkit::eventually(5, "three log notifications", || {
        let logs = logs.clone();
        async move { logs.lock().unwrap().len() == 3 }
    })
    .await;

    for i in 0..6 {
        let r = client.peer().call_tool(CallToolRequestParams::new("test_simple_text")).await.unwrap();
        assert_eq!(r.is_error, None, "call {i}");
    }
    client.cancel().await.unwrap();
}
