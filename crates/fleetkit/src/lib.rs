//! mcpfleet-fleetkit: fleets of replicas for the end-to-end suites: real `mcpfleet` processes on `127.0.0.1:0`
//! (or in-process replicas serving a test catalog with a header-based test authenticator), sharing one Redis,
//! and `JwtFleet` for tests that act as several principals. It re-exports the whole of `mcpfleet-testkit`
//! (Redis, issuer, clients, proxy), so that a suite imports one crate.
//!
//! It depends on the server; what needs no server lives in `mcpfleet-testkit`, a leaf that the state contract
//! suite uses without building the server. A dev-dependency only: it must never be linked into the server.
#![expect(clippy::expect_used, reason = "test support: failing loudly with a reason is its job")]

pub use mcpfleet_testkit::*;

use async_trait::async_trait;
use mcpfleet_auth::{AuthError, Authenticator, Principal, Scopes};
use mcpfleet_state::UserKey;
use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The `requestState` key every replica of a Redis fleet gets (`KID:BASE64SECRET`, 32 bytes).
pub const TEST_STATE_KEY: &str = "fleet:dGVzdC1mbGVldC1yZXF1ZXN0LXN0YXRlLWtleS0wMTIzNDU2Nzg5YWI=";

/// Test-only authenticator: the principal is whatever `x-test-user` says. Never linked into the server.
#[derive(Debug, Default)]
pub struct HeaderAuth;

#[async_trait]
impl Authenticator for HeaderAuth {
    async fn authenticate(&self, parts: &http::request::Parts) -> Result<Principal, AuthError> {
        let name = parts.headers.get(TEST_USER_HEADER).and_then(|v| v.to_str().ok());
        let user = name.and_then(UserKey::new).ok_or(AuthError::MissingCredentials)?;
        Ok(Principal {
            user,
            issuer: "x-test-user".to_owned(),
            subject: name.unwrap_or_default().to_owned(),
            client_id: None,
            scopes: Scopes::All,
            tenant: None,
        })
    }
}

/// One replica: a real `mcpfleet` process, or the library serving in this process (for injected principals).
#[derive(Debug)]
pub enum Replica {
    Process { child: Child, addr: String, admin: String, stdout: BufReader<std::process::ChildStdout> },
    InProcess { addr: String, stop: CancellationToken },
}

impl Replica {
    #[must_use]
    pub fn base(&self) -> String {
        match self {
            Self::Process { addr, .. } | Self::InProcess { addr, .. } => format!("http://{addr}"),
        }
    }

    #[must_use]
    pub fn url(&self) -> String {
        format!("{}/mcp", self.base())
    }

    /// SIGKILL for a process replica; an abrupt stop of the listener for an in-process one.
    pub fn kill(&mut self) {
        match self {
            Self::Process { child, .. } => {
                let _ = child.kill();
                let _ = child.wait();
            }
            Self::InProcess { stop, .. } => stop.cancel(),
        }
    }
}

impl Replica {
    /// `http://<admin address>` of a process replica: `/metrics`, `/healthz`, `/readyz`.
    ///
    /// # Panics
    /// Not a process replica.
    #[must_use]
    pub fn admin(&self) -> String {
        let Self::Process { admin, .. } = self else { panic!("not a process replica") };
        format!("http://{admin}")
    }

    /// The process id of a process replica.
    ///
    /// # Panics
    /// Not a process replica.
    #[must_use]
    pub fn pid(&self) -> u32 {
        let Self::Process { child, .. } = self else { panic!("not a process replica") };
        child.id()
    }

    /// The next line a process replica printed on stdout after its `listening on` line (with `--auth dev`, the
    /// dev token line).
    ///
    /// # Panics
    /// Not a process replica, or stdout closed.
    pub fn stdout_line(&mut self) -> String {
        let Self::Process { stdout, .. } = self else { panic!("not a process replica") };
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read stdout");
        line
    }

    /// Sends SIGTERM to a process replica (a graceful shutdown); stops an in-process one.
    pub fn terminate(&mut self) {
        match self {
            Self::Process { child, .. } => {
                let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            }
            Self::InProcess { stop, .. } => stop.cancel(),
        }
    }

    /// Waits up to `secs` for a process replica to exit; its exit code.
    #[must_use]
    pub fn wait_exit(&mut self, secs: u64) -> Option<i32> {
        let Self::Process { child, .. } = self else { return None };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The `mcpfleet` binary built next to the running test.
///
/// # Panics
/// If it has not been built (`cargo test --workspace` builds it).
#[must_use]
pub fn server_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("mcpfleet");
    assert!(bin.exists(), "{} is missing: run `cargo build -p mcpfleet` (cargo test --workspace does)", bin.display());
    bin
}

/// Builds a fleet of replicas sharing one Redis.
#[derive(Debug, Clone)]
pub struct FleetBuilder {
    replicas: usize,
    redis_url: Option<String>,
    args: Vec<String>,
    header_auth: bool,
    catalog: Option<Arc<dyn mcpfleet_tools::Catalog>>,
    log_file: Option<PathBuf>,
    server_limits: bool,
}

/// A running fleet.
#[derive(Debug)]
pub struct Fleet {
    pub replicas: Vec<Replica>,
}

impl Fleet {
    /// Stops every process replica with SIGTERM and waits (up to 30 s) for each to exit, so that they flush their
    /// logs; their exit codes.
    ///
    /// # Panics
    /// If the waiting task fails.
    pub async fn stop_gracefully(mut self) -> Vec<Option<i32>> {
        for r in &mut self.replicas {
            r.terminate();
        }
        tokio::task::spawn_blocking(move || self.replicas.iter_mut().map(|r| r.wait_exit(30)).collect())
            .await
            .expect("wait for the replicas")
    }

    #[must_use]
    pub fn builder() -> FleetBuilder {
        mcpfleet_testkit::init_tls();
        FleetBuilder {
            replicas: 1,
            redis_url: None,
            args: Vec::new(),
            header_auth: false,
            log_file: None,
            server_limits: false,
            catalog: None,
        }
    }

    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.replicas.iter().map(Replica::url).collect()
    }

    #[must_use]
    pub fn bases(&self) -> Vec<String> {
        self.replicas.iter().map(Replica::base).collect()
    }
}

impl FleetBuilder {
    #[must_use]
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    #[must_use]
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.redis_url = Some(url.into());
        self
    }

    /// Extra `mcpfleet serve` arguments.
    #[must_use]
    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }

    /// Short leases (1.5 s, with a 0.5 s Redis deadline to satisfy the lease ≥ 3 × timeout rule), so that tests of
    /// lost replicas and outages run in seconds.
    #[must_use]
    pub fn short_leases(self) -> Self {
        self.arg("--lease-ttl").arg("1500ms").arg("--redis-timeout").arg("500ms")
    }

    /// `--auth jwt` against `issuer`, audience [`mcpfleet_testkit::issuer::AUDIENCE`], resource `https://mcp.test/mcp`, and a
    /// one-second JWKS refresh interval.
    #[must_use]
    pub fn jwt(self, issuer: &mcpfleet_testkit::Issuer) -> Self {
        let mut b = self;
        for a in [
            "--auth",
            "jwt",
            "--jwt-issuer",
            &issuer.id(),
            "--jwt-audience",
            mcpfleet_testkit::issuer::AUDIENCE,
            "--jwks-url",
            &issuer.jwks_url(),
            "--resource-url",
            "https://mcp.test/mcp",
            "--jwks-refresh-interval",
            "1s",
        ] {
            b = b.arg(a);
        }
        b
    }

    /// `--auth dev` with the dev issuer's key in `key_file` (created if missing; replicas given the same file share
    /// the issuer).
    #[must_use]
    pub fn dev_auth(self, key_file: &std::path::Path) -> Self {
        self.arg("--auth").arg("dev").arg("--dev-key-file").arg(key_file.to_string_lossy())
    }

    /// Keeps the server's own default limits (bucket, caps) instead of the testkit's, which no ordinary test
    /// reaches: for tests of what a new user gets.
    #[must_use]
    pub fn server_limits(mut self) -> Self {
        self.server_limits = true;
        self
    }

    /// Appends every replica's stderr (its logs) to `path`, at `level`.
    #[must_use]
    pub fn log_to(mut self, path: impl Into<PathBuf>, level: &str) -> Self {
        self.log_file = Some(path.into());
        self.arg("--log").arg(level)
    }

    /// Serve in this process with [`HeaderAuth`], so that tests can act as several principals.
    #[must_use]
    pub fn header_auth(mut self) -> Self {
        self.header_auth = true;
        self
    }

    /// Serves `catalog` instead of the fixtures, without the start-up lint (so a test can serve an open one), from
    /// in-process replicas that share it, like replicas share a database. Identity is the configured `--auth`,
    /// or [`FleetBuilder::header_auth`].
    #[must_use]
    pub fn catalog(mut self, catalog: Arc<dyn mcpfleet_tools::Catalog>) -> Self {
        self.catalog = Some(catalog);
        self
    }

    fn serve_args(&self) -> Vec<String> {
        let mut a = vec!["mcpfleet".to_owned(), "serve".to_owned(), "--listen".to_owned(), "127.0.0.1:0".to_owned()];
        if !self.args.iter().any(|x| x == "--fixtures") {
            a.extend(["--fixtures".to_owned(), "conformance".to_owned()]);
        }
        if let Some(u) = &self.redis_url {
            a.extend(["--redis-url".to_owned(), u.clone()]);
            // One requestState key for the whole fleet, as an operator would configure it.
            if !self.args.iter().any(|x| x == "--request-state-key") {
                a.extend(["--request-state-key".to_owned(), TEST_STATE_KEY.to_owned()]);
            }
        }
        // Every replica gets its own admin port, a SIGTERM that stops accepting at once, and limits no ordinary
        // test reaches (the suites run many requests as one anonymous principal), unless the test says otherwise.
        let defaults = [
            ("--admin-listen", "127.0.0.1:0"),
            ("--drain-delay", "0s"),
            ("--rate-burst", "1000000"),
            ("--rate-per-second", "1000000"),
            ("--max-sessions-per-user", "0"),
            ("--max-streams-per-user", "0"),
            ("--max-inflight-per-user", "0"),
        ];
        let defaults = if self.server_limits { &defaults[..2] } else { &defaults[..] };
        for &(flag, value) in defaults {
            if !self.args.iter().any(|x| x == flag) {
                a.extend([flag.to_owned(), value.to_owned()]);
            }
        }
        a.extend(self.args.iter().cloned());
        a
    }

    /// Starts every replica and waits until each listens.
    ///
    /// # Panics
    /// If a replica does not start.
    pub async fn start(self) -> Fleet {
        let mut replicas = Vec::new();
        for _ in 0..self.replicas {
            let in_process = self.header_auth || self.catalog.is_some();
            replicas.push(if in_process { self.start_in_process().await } else { self.start_process() });
        }
        Fleet { replicas }
    }

    fn start_process(&self) -> Replica {
        let args = self.serve_args();
        let stderr = match &self.log_file {
            Some(p) => {
                Stdio::from(std::fs::OpenOptions::new().create(true).append(true).open(p).expect("open log file"))
            }
            None => Stdio::inherit(),
        };
        let mut child = Command::new(server_bin())
            .args(&args[1..])
            .env("MCPFLEET_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn mcpfleet");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut address = |prefix: &str| {
            let mut line = String::new();
            stdout.read_line(&mut line).expect("read stdout");
            line.trim().strip_prefix(prefix).unwrap_or_else(|| panic!("expected {prefix:?}, got {line:?}")).to_owned()
        };
        let addr = address("listening on ");
        let admin = address("admin listening on ");
        Replica::Process { child, addr, admin, stdout }
    }

    async fn start_in_process(&self) -> Replica {
        let mcpfleet::config::Parsed::Serve(cfg) =
            mcpfleet::config::parse(self.serve_args().into_iter().map(Into::into)).expect("config")
        else {
            panic!("not a serve command");
        };
        let mut state = mcpfleet::build_state(&cfg).await.expect("state").state;
        if self.header_auth {
            state.auth = Arc::new(HeaderAuth);
        }
        if let Some(c) = &self.catalog {
            state.validator = Arc::new(mcpfleet_tools::validate::Validator::new(&c.tools()).expect("schemas compile"));
            state.catalog = c.clone();
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move {
            let _ = mcpfleet::serve(listener, state, s).await;
        });
        Replica::InProcess { addr, stop }
    }
}

/// A fleet of process replicas on a Redis of its own with `--auth jwt`, against an issuer publishing one Ed25519
/// key: tests act as any principal by its `sub`. Its fields drop in order, the replicas first.
#[derive(Debug)]
pub struct JwtFleet {
    pub fleet: Fleet,
    pub key: mcpfleet_testkit::TestKey,
    pub issuer: mcpfleet_testkit::Issuer,
    pub redis: mcpfleet_testkit::RedisServer,
}

impl JwtFleet {
    /// Starts `n` replicas with `extra` serve flags.
    pub async fn start(n: usize, extra: &[&str]) -> Self {
        let redis = mcpfleet_testkit::RedisServer::start();
        let key = mcpfleet_testkit::TestKey::load("ed-1", "ed", jsonwebtoken::Algorithm::EdDSA);
        let issuer = mcpfleet_testkit::Issuer::start(&[&key]).await;
        let mut b = Fleet::builder().replicas(n).redis(redis.url()).jwt(&issuer);
        for a in extra {
            b = b.arg(*a);
        }
        let fleet = b.start().await;
        Self { fleet, key, issuer, redis }
    }

    /// A signed access token for `sub`.
    #[must_use]
    pub fn token(&self, sub: &str) -> String {
        self.key.token(&self.issuer.id(), sub).sign()
    }

    /// A token builder for `sub` (to add claims).
    #[must_use]
    pub fn token_for(&self, sub: &str) -> mcpfleet_testkit::TokenBuilder {
        self.key.token(&self.issuer.id(), sub)
    }

    /// A 2025-generation client with `sub`'s token.
    #[must_use]
    pub fn client(&self, sub: &str) -> mcpfleet_testkit::McpClient {
        mcpfleet_testkit::McpClient::new().with_token(&self.token(sub))
    }

    /// A 2026-07-28 client with `sub`'s token.
    #[must_use]
    pub fn modern(&self, sub: &str) -> mcpfleet_testkit::ModernClient {
        mcpfleet_testkit::ModernClient::new().with_token(&self.token(sub))
    }

    /// The `/mcp` URL of replica `i`.
    #[must_use]
    pub fn url(&self, i: usize) -> String {
        self.fleet.urls()[i].clone()
    }

    /// A metric summed over every replica (0 where a replica has none).
    pub async fn metric(&self, name: &str) -> f64 {
        let mut sum = 0.0;
        for r in &self.fleet.replicas {
            sum += mcpfleet_testkit::scrape(&r.admin()).await.get(name).copied().unwrap_or(0.0);
        }
        sum
    }
}
