//! The real authorization server and downstream API of the downstream tests (docs/DOWNSTREAM.md): each a Node
//! process running `tests/downstream/servers.mjs` (`oidc-provider` with RFC 8693 token exchange registered, and a
//! small API that checks each token's issuer, audience and subject), on a loopback port of its own that it keeps
//! across [`NodeServer::stop`] and [`NodeServer::start_again`], so a test can take the authorization server down
//! and bring it back. Node and the packages come from `.tools/` (tests/run-all.sh installs them).

use serde_json::Value;
use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One `servers.mjs` process.
#[derive(Debug)]
pub struct NodeServer {
    role: &'static str,
    port: u16,
    args: Vec<String>,
    child: Option<Child>,
    ready: Value,
}

impl NodeServer {
    fn spawn(role: &'static str, args: Vec<String>) -> Self {
        let port = crate::redis_node::free_ports(1)[0];
        let mut s = Self { role, port, args, child: None, ready: Value::Null };
        s.start_again();
        s
    }

    /// Starts the process again on its port (after [`stop`](Self::stop)); waits until it listens.
    ///
    /// # Panics
    /// Node is missing, or the server does not say it is ready within 30 s.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "{} is running", self.role);
        let node = root().join(".tools/node_modules/.bin/node");
        assert!(node.exists(), "{} is missing: run tests/run-all.sh, which installs it", node.display());
        let mut child = Command::new(node)
            .arg(root().join("tests/downstream/servers.mjs"))
            .arg(self.role)
            .args(["--port", &self.port.to_string()])
            .args(&self.args)
            .current_dir(root())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn node");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut line = String::new();
        while Instant::now() < deadline {
            line.clear();
            if out.read_line(&mut line).expect("read node's stdout") == 0 {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{} exited before it was ready", self.role);
            }
            if let Some(json) = line.trim().strip_prefix("ready ") {
                self.ready = serde_json::from_str(json).expect("ready line");
                // Keep draining stdout, so the process never blocks on a full pipe.
                std::thread::spawn(move || {
                    let mut sink = String::new();
                    while out.read_line(&mut sink).unwrap_or(0) > 0 {
                        sink.clear();
                    }
                });
                self.child = Some(child);
                return;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("{} was not ready within 30 s", self.role);
    }

    /// Stops the process (connections to its port are refused until it starts again).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `http://127.0.0.1:<port>`.
    #[must_use]
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What it counted (`GET /_stats`).
    ///
    /// # Panics
    /// It does not answer.
    pub async fn stats(&self) -> Value {
        reqwest::get(format!("{}/_stats", self.base())).await.expect("stats").json().await.expect("stats JSON")
    }
}

impl Drop for NodeServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How the authorization server is set up.
#[derive(Clone, Debug)]
pub struct AuthServerSetup<'a> {
    /// The fleet's issuer: subject tokens must be its, for `subject_audience`.
    pub subject_issuer: &'a crate::Issuer,
    pub subject_audience: &'a str,
    /// The one audience it issues exchanged tokens for, and the scopes it allows.
    pub audience: &'a str,
    pub scope: &'a str,
    /// The longest lifetime of an exchanged token (also bounded by the subject token's).
    pub ttl: Duration,
    /// The secret of its clients `fleet-basic` (client_secret_basic) and `fleet-post` (client_secret_post).
    pub secret: &'a str,
    /// The public JWK of its client `fleet-jwt` (private_key_jwt, ES256).
    pub client_jwk: Value,
}

/// `oidc-provider` with token exchange: its token endpoint is `<base>/token`, its JWKS `<base>/jwks`. Its signing
/// key is kept in a file of its own, so it signs with the same key after [`NodeServer::start_again`].
#[derive(Debug)]
pub struct AuthServer(
    pub NodeServer,
    #[expect(dead_code, reason = "held for the key file, until dropped")] tempfile::TempDir,
);

impl AuthServer {
    #[must_use]
    pub fn start(s: &AuthServerSetup<'_>) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let args = [
            ("--key-file", dir.path().join("as-key.json").display().to_string()),
            ("--subject-jwks", s.subject_issuer.jwks_url()),
            ("--subject-issuer", s.subject_issuer.id()),
            ("--subject-audience", s.subject_audience.to_owned()),
            ("--audience", s.audience.to_owned()),
            ("--scope", s.scope.to_owned()),
            ("--ttl", s.ttl.as_secs().to_string()),
            ("--secret", s.secret.to_owned()),
            ("--client-jwk", s.client_jwk.to_string()),
        ];
        Self(NodeServer::spawn("as", args.into_iter().flat_map(|(k, v)| [k.to_owned(), v]).collect()), dir)
    }

    /// The same server, started again with `uri` as client `fleet-post`'s redirect URI (URL mode's callback), and
    /// the authorization code and refresh grants.
    #[must_use]
    pub fn with_redirect_uri(mut self, uri: &str) -> Self {
        self.0.stop();
        self.0.args.extend(["--redirect-uri".to_owned(), uri.to_owned()]);
        self.0.start_again();
        self
    }

    /// Its issuer identifier (`http://127.0.0.1:<port>`).
    #[must_use]
    pub fn issuer(&self) -> String {
        self.0.base()
    }

    #[must_use]
    pub fn token_endpoint(&self) -> String {
        format!("{}/token", self.0.base())
    }
}

/// The downstream API: `GET /events?days=N` for a token of `issuer` for `audience`; 401 otherwise.
#[derive(Debug)]
pub struct DownstreamApi(pub NodeServer);

impl DownstreamApi {
    #[must_use]
    pub fn start(issuer: &str, audience: &str) -> Self {
        let args = vec!["--as-issuer".to_owned(), issuer.to_owned(), "--audience".to_owned(), audience.to_owned()];
        Self(NodeServer::spawn("api", args))
    }

    #[must_use]
    pub fn url(&self) -> String {
        self.0.base()
    }

    /// Answers 401 to `sub`'s next `times` requests, whatever their token.
    ///
    /// # Panics
    /// It does not answer.
    pub async fn reject(&self, sub: &str, times: u32) {
        let url = format!("{}/_reject?sub={sub}&times={times}", self.0.base());
        let r = reqwest::Client::new().post(url).send().await.expect("reject");
        assert!(r.status().is_success());
    }
}
