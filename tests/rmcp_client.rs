//! Interoperability with the official Rust SDK: rmcp's own Streamable HTTP client, through a round-robin proxy in
//! front of three replicas sharing one Redis, so that consecutive requests of its session (and its answer to a
//! sampling request) land on different replicas. One test runs a client of each generation against the same
//! fleet at once: rmcp speaking 2026-07-28 (its default version, with `server/discover` and no session; input
//! requests as multi round-trip retries) and rmcp speaking 2025-11-25 (initialize and a session).

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]
#![expect(
    deprecated,
    reason = "sampling and logging are deprecated by the 2026-07-28 revision; these tests use them in both generations"
)]

use mcpfleet_fleetkit::{Fleet, RedisServer, RoundRobinProxy};
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationCapability, Implementation,
    LoggingMessageNotificationParam, ProtocolVersion, SamplingCapability, SamplingMessage, SubscriptionFilter,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt as _, ErrorData, RoleClient, ServiceExt as _};
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct TestClient {
    prompts: Arc<Mutex<Vec<String>>>,
    logs: Arc<Mutex<Vec<serde_json::Value>>>,
    /// Speaks rmcp's default version (2026-07-28) instead of 2025-11-25.
    stateless: bool,
}

impl ClientHandler for TestClient {
    fn get_info(&self) -> ClientConfig {
        let mut caps = ClientCapabilities::default();
        caps.sampling = Some(SamplingCapability::default());
        caps.elicitation = Some(ElicitationCapability::default());
        let config = ClientConfig::new(caps, Implementation::new("rmcp-test", "1"));
        if self.stateless { config } else { config.with_protocol_version(ProtocolVersion::V_2025_11_25) }
    }

    async fn create_elicitation(
        &self,
        _params: ElicitRequestParams,
        _cx: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let content = serde_json::json!({ "name": "rmcp", "color": "green" });
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(content))
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
    mcpfleet_fleetkit::eventually(5, "three log notifications", || {
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

/// The same workflow for either generation: list, a plain call, a call that samples the client's model, and a
/// tool that asks the user twice (two rounds of input in 2026-07-28, two server→client requests in 2025).
async fn workflow(client: &rmcp::service::RunningService<RoleClient, TestClient>, label: &str) {
    let tools = client.peer().list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "test_input_required_result_multi_round"), "{label}");
    let simple = client.call_tool(CallToolRequestParams::new("test_simple_text")).await.unwrap();
    assert_eq!(text_of(&simple), "This is a simple text response for testing.", "{label}");
    let args = serde_json::json!({ "prompt": format!("from {label}") }).as_object().cloned().unwrap();
    let sampled = client.call_tool(CallToolRequestParams::new("test_sampling").with_arguments(args)).await.unwrap();
    assert_eq!(text_of(&sampled), "LLM response: answered by rmcp", "{label}");
    let asked = client.call_tool(CallToolRequestParams::new("test_input_required_result_multi_round")).await.unwrap();
    assert_eq!(text_of(&asked), "rmcp likes green.", "{label}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_clients_of_both_generations_on_one_fleet() {
    let redis = RedisServer::start();
    let fleet = Fleet::builder().replicas(3).redis(redis.url()).start().await;
    let proxy = RoundRobinProxy::start(fleet.bases()).await;
    let stateless_handler = TestClient { stateless: true, ..TestClient::default() };
    let discover = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
    let stateless = stateless_handler
        .clone()
        .serve_with_lifecycle(StreamableHttpClientTransport::from_uri(proxy.url()), discover)
        .await
        .unwrap();
    let session_handler = TestClient::default();
    let session = session_handler.clone().serve(StreamableHttpClientTransport::from_uri(proxy.url())).await.unwrap();
    assert_eq!(stateless.peer_info().unwrap().protocol_version, ProtocolVersion::V_2026_07_28);
    assert_eq!(session.peer_info().unwrap().protocol_version, ProtocolVersion::V_2025_11_25);
    // Both at once, interleaved on the same replicas.
    tokio::join!(workflow(&stateless, "2026-07-28"), workflow(&session, "2025-11-25"));
    assert!(stateless_handler.prompts.lock().unwrap().iter().any(|p| p.contains("from 2026-07-28")));
    assert!(session_handler.prompts.lock().unwrap().iter().any(|p| p.contains("from 2025-11-25")));
    // The stateless client's subscription hears a resource update made by a call that lands on another replica.
    let filter = SubscriptionFilter::builder().resource_subscription("test://watched-resource").build();
    let mut sub = stateless.listen(filter).await.unwrap();
    stateless.call_tool(CallToolRequestParams::new("test_update_watched_resource")).await.unwrap();
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), sub.next()).await.unwrap().unwrap().unwrap();
    let n = serde_json::to_value(&n).unwrap();
    assert_eq!(n["method"], "notifications/resources/updated", "{n}");
    assert_eq!(n["params"]["uri"], "test://watched-resource");
    sub.cancel().await.unwrap();
    session.cancel().await.unwrap();
    stateless.cancel().await.unwrap();
}
