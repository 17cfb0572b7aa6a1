use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use futures::TryStreamExt as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use tokio_util::sync::CancellationToken;

/// A plain round-robin HTTP proxy: each request, SSE GETs included, goes to the next target in turn. No
/// stickiness of any kind, like the load balancers mcpfleet runs behind.
#[derive(Debug)]
pub struct RoundRobinProxy {
    addr: std::net::SocketAddr,
    stop: CancellationToken,
    targets: Arc<RwLock<Vec<String>>>,
    pins: Arc<RwLock<Vec<(String, usize)>>>,
}

#[derive(Clone)]
struct ProxyState {
    targets: Arc<RwLock<Vec<String>>>,
    /// Path prefixes a test sends to one target (see [`RoundRobinProxy::pin`]).
    pins: Arc<RwLock<Vec<(String, usize)>>>,
    next: Arc<AtomicUsize>,
    client: reqwest::Client,
}

const HOP_BY_HOP: [&str; 7] =
    ["connection", "keep-alive", "transfer-encoding", "te", "upgrade", "content-length", "proxy-connection"];

async fn forward(State(st): State<ProxyState>, req: Request) -> Response {
    let target = {
        let targets = st.targets.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let pins = st.pins.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        match pins.iter().find(|(prefix, _)| req.uri().path().starts_with(prefix.as_str())) {
            Some((_, i)) => targets[*i].clone(),
            None => targets[st.next.fetch_add(1, Ordering::Relaxed) % targets.len()].clone(),
        }
    };
    let (parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let url = format!("{target}{path}");
    let Ok(body) = axum::body::to_bytes(body, 64 * 1024 * 1024).await else {
        return Response::builder().status(502).body(Body::empty()).unwrap_or_default();
    };
    let mut rb = st.client.request(parts.method.clone(), url).body(body);
    for (k, v) in &parts.headers {
        if !HOP_BY_HOP.contains(&k.as_str()) {
            rb = rb.header(k, v);
        }
    }
    match rb.send().await {
        Ok(resp) => {
            let mut out = Response::builder().status(resp.status());
            for (k, v) in resp.headers() {
                if !HOP_BY_HOP.contains(&k.as_str()) {
                    out = out.header(k, v);
                }
            }
            let stream = resp.bytes_stream().map_err(std::io::Error::other);
            out.body(Body::from_stream(stream)).unwrap_or_default()
        }
        Err(_) => Response::builder().status(502).body(Body::empty()).unwrap_or_default(),
    }
}

impl RoundRobinProxy {
    /// Starts a proxy on `127.0.0.1:0` in front of `targets` (base URLs such as `http://127.0.0.1:1234`).
    ///
    /// # Panics
    /// If it cannot bind.
    pub async fn start(targets: Vec<String>) -> Self {
        Self::start_with(targets, reqwest::Client::builder()).await
    }

    /// Like [`start`](Self::start), closing a connection to a target once it has been idle for `idle` (reqwest's
    /// default keeps it 90 s), so that a quiet proxy leaves no connection open on the targets.
    ///
    /// # Panics
    /// If it cannot bind.
    pub async fn start_closing_idle(targets: Vec<String>, idle: std::time::Duration) -> Self {
        Self::start_with(targets, reqwest::Client::builder().pool_idle_timeout(idle)).await
    }

    async fn start_with(targets: Vec<String>, client: reqwest::ClientBuilder) -> Self {
        crate::init_tls();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        // Redirects go back to the client as they are (an OAuth authorization endpoint answers with one).
        let client = client.no_proxy().redirect(reqwest::redirect::Policy::none()).build().expect("client");
        let targets = Arc::new(RwLock::new(targets));
        let pins = Arc::new(RwLock::new(Vec::new()));
        let st = ProxyState { targets: targets.clone(), pins: pins.clone(), next: Arc::default(), client };
        let app = axum::Router::new().fallback(forward).with_state(st);
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(s.cancelled_owned()).await;
        });
        Self { addr, stop, targets, pins }
    }

    /// Sends every request whose path starts with `prefix` to target `i` (a test that must know which replica
    /// serves a step); the others still go round-robin.
    pub fn pin(&self, prefix: &str, i: usize) {
        self.pins.write().unwrap_or_else(std::sync::PoisonError::into_inner).push((prefix.to_owned(), i));
    }

    /// The proxy's origin, `http://127.0.0.1:<port>`.
    #[must_use]
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sends the requests that went to target `i` to `target` from now on (a rolling update swapping one replica
    /// for another); requests already forwarded go on where they went.
    ///
    /// # Panics
    /// If there is no target `i`.
    pub fn replace(&self, i: usize, target: String) {
        self.targets.write().unwrap_or_else(std::sync::PoisonError::into_inner)[i] = target;
    }

    /// The proxy's MCP endpoint.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

impl Drop for RoundRobinProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
