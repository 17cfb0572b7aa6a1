//! mcpfleet-fleetkit: fleets of replicas for the end-to-end suites: real `mcpfleet` processes on `127.0.0.1:0`, or
//! each in a replica namespace of a [`NetLab`] (or in-process replicas serving a test catalog with a header-based
//! test authenticator), sharing one Redis (a URL, or any topology through its flags), and `JwtFleet` for tests that
//! act as several principals. It re-exports the whole of `mcpfleet-testkit` (Redis, issuer, clients, proxy, network
//! lab), so that a suite imports one crate.
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
            claims: std::sync::Arc::default(),
            plan: None,
            token_id: None,
            proof: None,
            bound_to: None,
        })
    }
}

/// One replica: a real `mcpfleet` process, or the library serving in this process (for injected principals).
///
/// A process replica of a fleet [`in_lab`](FleetBuilder::in_lab) was started through `ip netns exec`, which execs
/// the server: its `child` is the server itself, so [`kill`](Self::kill), [`terminate`](Self::terminate),
/// [`pid`](Self::pid) and [`wait_exit`](Self::wait_exit) act on the server as for any other.
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

/// Runs `mcpfleet serve` on loopback with `args`, which must refuse to start: asserts exit 64 and one line on
/// stderr, and returns that line.
///
/// # Panics
/// The server cannot be run, or it did not refuse as a configuration error in one line.
#[must_use]
pub fn refused_start<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[S]) -> String {
    let out = Command::new(server_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(args)
        .output()
        .expect("run the server");
    let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "one line for {args:?}: {err}");
    err
}

/// The newest release's `mcpfleet` binary (releases.toml), for [`FleetBuilder::release`]: built by
/// `tests/release-bin.sh` from the release's commit the first time on a machine, then taken from its cache.
///
/// # Panics
/// If the script fails (the commit is not in the clone, or the build fails): its stderr says why.
#[must_use]
pub fn previous_release() -> PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(root.join("tests/release-bin.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run tests/release-bin.sh");
    assert!(out.status.success(), "tests/release-bin.sh failed ({}): see its message above", out.status);
    PathBuf::from(String::from_utf8(out.stdout).expect("a path").trim())
}

/// The `mcpfleet serve` flags with which replicas reach a Redis topology of the testkit, for
/// [`FleetBuilder::redis_topology`]: TLS (`--redis-tls`, `--redis-ca-file`) and the ACL user (`--redis-username`,
/// `--redis-password`) included when the topology has them.
pub trait RedisTopology {
    /// The flags, without `--request-state-key` (the builder adds it).
    fn serve_flags(&self) -> Vec<String>;
}

impl RedisTopology for RedisServer {
    /// `--redis-url <url>` (which carries the user and password, if any) and, with TLS, `--redis-ca-file <ca>`.
    fn serve_flags(&self) -> Vec<String> {
        let mut flags = vec!["--redis-url".to_owned(), self.url()];
        if let Some(ca) = self.ca_file() {
            flags.extend(["--redis-ca-file".to_owned(), ca.to_string_lossy().into_owned()]);
        }
        flags
    }
}

impl RedisTopology for RedisCluster {
    /// `--redis-mode cluster --redis-nodes <every node>` and the TLS and ACL flags.
    fn serve_flags(&self) -> Vec<String> {
        let mut flags = ["--redis-mode", "cluster", "--redis-nodes"].map(str::to_owned).to_vec();
        flags.push(self.seeds().join(","));
        flags.extend(secure_flags(self.user().zip(self.password()), self.ca_file()));
        flags
    }
}

impl RedisTopology for RedisSentinel {
    /// `--redis-mode sentinel --redis-nodes <every sentinel> --redis-sentinel-master <name>` and the TLS and ACL
    /// flags (the user is the data nodes'; the sentinels ask for none, and speak TLS when the data nodes do).
    fn serve_flags(&self) -> Vec<String> {
        let mut flags = ["--redis-mode", "sentinel", "--redis-nodes"].map(str::to_owned).to_vec();
        flags.push(self.sentinels().join(","));
        flags.extend(["--redis-sentinel-master".to_owned(), self.master_name().to_owned()]);
        flags.extend(secure_flags(self.user().zip(self.password()), self.ca_file()));
        flags
    }
}

/// `--redis-username`/`--redis-password` for an ACL user, `--redis-tls --redis-ca-file` for a CA.
fn secure_flags(acl: Option<(&str, &str)>, ca: Option<PathBuf>) -> Vec<String> {
    let mut flags = Vec::new();
    if let Some((user, password)) = acl {
        flags.extend(["--redis-username", user, "--redis-password", password].map(str::to_owned));
    }
    if let Some(ca) = ca {
        flags.extend(["--redis-tls".to_owned(), "--redis-ca-file".to_owned(), ca.to_string_lossy().into_owned()]);
    }
    flags
}

/// Builds a fleet of replicas sharing one Redis.
#[derive(Debug, Clone)]
pub struct FleetBuilder {
    replicas: usize,
    /// How replicas reach Redis: its `serve` flags.
    redis: Option<Vec<String>>,
    /// With [`in_lab`](Self::in_lab): each process replica's namespace and front address, in order.
    lab: Option<Vec<(String, std::net::Ipv4Addr)>>,
    args: Vec<String>,
    header_auth: bool,
    catalog: Option<Arc<dyn mcpfleet_tools::Catalog>>,
    log_file: Option<PathBuf>,
    server_limits: bool,
    /// A server binary of a tool writer's instead of `mcpfleet` (no `--fixtures` then).
    binary: Option<PathBuf>,
    /// An earlier release's `mcpfleet` binary instead of this tree's (same flags, fixtures included).
    release: Option<PathBuf>,
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
            redis: None,
            lab: None,
            args: Vec::new(),
            header_auth: false,
            log_file: None,
            server_limits: false,
            catalog: None,
            binary: None,
            release: None,
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

    /// Replicas reach Redis at `url` (`--redis-url`), with the fleet's `--request-state-key` unless given. Replaces
    /// [`redis_flags`](Self::redis_flags).
    #[must_use]
    pub fn redis(self, url: impl Into<String>) -> Self {
        self.redis_flags(["--redis-url".to_owned(), url.into()])
    }

    /// Replicas reach Redis as `flags` say, e.g. `--redis-mode cluster --redis-nodes a:1,b:2`, with the fleet's
    /// `--request-state-key` unless given (here or through [`arg`](Self::arg)). Replaces [`redis`](Self::redis).
    #[must_use]
    pub fn redis_flags(mut self, flags: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.redis = Some(flags.into_iter().map(Into::into).collect());
        self
    }

    /// Replicas reach `topology` (a [`RedisServer`], a [`RedisCluster`] or a [`RedisSentinel`], TLS and ACL user
    /// included): [`redis_flags`](Self::redis_flags) with its [`RedisTopology::serve_flags`].
    #[must_use]
    pub fn redis_topology(self, topology: &impl RedisTopology) -> Self {
        self.redis_flags(topology.serve_flags())
    }

    /// Runs process replica `i` inside `lab`'s namespace [`replica_ns(i)`](NetLab::replica_ns), listening (and
    /// serving its admin endpoints) on its front address [`replica_ip(i)`](NetLab::replica_ip), so that
    /// [`NetLab::cut`] cuts it off Redis while the test still reaches it. Redis should be a topology inside the lab
    /// ([`RedisOptions::in_lab`]); anything else the replicas need from the test process must listen on
    /// [`NetLab::root_ip`] or `0.0.0.0`, not on loopback: use [`jwt_file`](Self::jwt_file) rather than
    /// [`jwt`](Self::jwt) (the server takes only `--auth jwt` on a non-loopback address). Unless the test gives
    /// `--allowed-hosts`, a replica answers the Host names `<its address>:*`, `127.0.0.1:*` and `localhost:*` (the
    /// test talks to it by address, or through a [`RoundRobinProxy`], which passes the client's Host on). Only for
    /// process replicas, at most as many as the lab has namespaces; drop the fleet before the lab.
    #[must_use]
    pub fn in_lab(self, lab: &NetLab) -> Self {
        self.in_namespaces((0..lab.replicas()).map(|i| (lab.replica_ns(i), lab.replica_ip(i))).collect())
    }

    /// Like [`in_lab`](Self::in_lab), with each process replica's namespace and the address it listens on given
    /// as they are, in order.
    #[must_use]
    pub fn in_namespaces(mut self, places: Vec<(String, std::net::Ipv4Addr)>) -> Self {
        self.lab = Some(places);
        self
    }

    /// Adds serve flags, in order.
    #[must_use]
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        for a in args {
            self = self.arg(a);
        }
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
        let url = issuer.jwks_url();
        self.jwt_with(issuer, &["--jwks-url", &url, "--jwks-refresh-interval", "1s"])
    }

    /// Like [`jwt`](Self::jwt), with the keys `issuer` publishes now written to `jwks_file` and read from there
    /// (`--jwks-file`) instead of fetched: for replicas that cannot reach the issuer, which listens on loopback, e.g.
    /// [`in_lab`](Self::in_lab) (where `--auth jwt` is also the one mode the server accepts on a non-loopback
    /// address). Later rotations are not seen.
    #[must_use]
    pub fn jwt_file(self, issuer: &mcpfleet_testkit::Issuer, jwks_file: &std::path::Path) -> Self {
        issuer.write_jwks(jwks_file);
        self.jwt_with(issuer, &["--jwks-file", &jwks_file.to_string_lossy()])
    }

    /// `--auth jwt` against `issuer`'s id and audience, with the keys from `keys` (the flags that say where).
    fn jwt_with(self, issuer: &mcpfleet_testkit::Issuer, keys: &[&str]) -> Self {
        let id = issuer.id();
        let common = ["--auth", "jwt", "--jwt-issuer", &id, "--jwt-audience", mcpfleet_testkit::issuer::AUDIENCE];
        let resource = ["--resource-url", "https://mcp.test/mcp"];
        let mut b = self;
        for a in common.iter().chain(keys).chain(&resource) {
            b = b.arg(*a);
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

    /// Process replicas run `binary` (a server built on the `mcpfleet` library, with tools of its own) instead of
    /// the `mcpfleet` binary, with the same flags but `--fixtures`.
    #[must_use]
    pub fn binary(mut self, binary: impl Into<PathBuf>) -> Self {
        self.binary = Some(binary.into());
        self
    }

    /// Process replicas run `binary`, an earlier release's `mcpfleet` (e.g. [`previous_release`]), instead of this
    /// tree's, with the same flags, fixtures included: for fleets of mixed versions. The flags the builder adds are
    /// ones every release since 0.1.0 takes; a test's own must be, too.
    #[must_use]
    pub fn release(mut self, binary: impl Into<PathBuf>) -> Self {
        self.release = Some(binary.into());
        self
    }

    /// `mcpfleet serve ...` for a replica listening on `host` (`127.0.0.1` but in a lab).
    fn serve_args(&self, host: &str) -> Vec<String> {
        let listen = format!("{host}:0");
        let mut a = vec!["mcpfleet".to_owned(), "serve".to_owned(), "--listen".to_owned(), listen.clone()];
        if self.binary.is_none() && !self.args.iter().any(|x| x == "--fixtures") {
            a.extend(["--fixtures".to_owned(), "conformance".to_owned()]);
        }
        if let Some(redis_flags) = self.redis.clone() {
            // One requestState key for the whole fleet, as an operator would configure it.
            let given = self.args.iter().chain(&redis_flags).any(|x| x == "--request-state-key");
            a.extend(redis_flags);
            if !given {
                a.extend(["--request-state-key".to_owned(), TEST_STATE_KEY.to_owned()]);
            }
        }
        // Every replica gets its own admin port, a SIGTERM that stops accepting at once, and limits no ordinary
        // test reaches (the suites run many requests as one anonymous principal), unless the test says otherwise.
        let defaults = [
            ("--admin-listen", listen.as_str()),
            ("--drain-delay", "0s"),
            ("--rate-burst", "1000000"),
            ("--rate-per-second", "1000000"),
            ("--max-sessions-per-user", "0"),
            ("--max-streams-per-user", "0"),
            ("--max-inflight-per-user", "0"),
        ];
        let defaults = if self.server_limits { &defaults[..2] } else { &defaults[..] };
        // Off loopback (in a lab), the server answers only the Host of its resource URL by default: the test talks
        // to a replica by its address, or through the proxy on loopback, which passes the Host on.
        let hosts = format!("{host}:*,127.0.0.1:*,localhost:*");
        let off_loopback = host.parse::<std::net::IpAddr>().is_ok_and(|ip| !ip.is_loopback());
        let lab_defaults = [("--allowed-hosts", hosts.as_str())];
        let lab_defaults = if off_loopback { &lab_defaults[..] } else { &[] };
        for &(flag, value) in defaults.iter().chain(lab_defaults) {
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
    /// If a replica does not start; with [`in_lab`](Self::in_lab), if the replicas are in-process ones or
    /// outnumber the lab's namespaces.
    pub async fn start(self) -> Fleet {
        let in_process = self.header_auth || self.catalog.is_some();
        if let Some(places) = &self.lab {
            assert!(
                !in_process,
                "in_lab needs process replicas: an in-process replica cannot leave the test's namespace"
            );
            assert!(
                self.replicas <= places.len(),
                "{} replicas, but the lab has {} replica namespaces",
                self.replicas,
                places.len()
            );
        }
        let mut replicas = Vec::new();
        for i in 0..self.replicas {
            replicas.push(if in_process { self.start_in_process().await } else { self.start_process(i) });
        }
        Fleet { replicas }
    }

    /// The program a process replica runs: the release's, the tool writer's, or this tree's `mcpfleet`.
    fn program(&self) -> PathBuf {
        self.release.clone().or_else(|| self.binary.clone()).unwrap_or_else(server_bin)
    }

    /// Starts process replica `i`, inside its namespace when the fleet is in a lab.
    fn start_process(&self, i: usize) -> Replica {
        let place = self.lab.as_ref().map(|places| &places[i]);
        let host = place.map_or_else(|| "127.0.0.1".to_owned(), |(_, ip)| ip.to_string());
        let args = self.serve_args(&host);
        let stderr = match &self.log_file {
            Some(p) => {
                Stdio::from(std::fs::OpenOptions::new().create(true).append(true).open(p).expect("open log file"))
            }
            None => Stdio::inherit(),
        };
        let mut command = match place {
            // `ip netns exec` execs the server: the child is the server.
            Some((netns, _)) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", netns]).arg(self.program());
                c
            }
            None => Command::new(self.program()),
        };
        let mut child = command
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
        let flags = self.serve_args("127.0.0.1").into_iter().skip(2);
        let app = mcpfleet::Server::new("mcpfleet", env!("CARGO_PKG_VERSION")).build(flags).await.expect("a replica");
        let state = app.state().clone().with(|state| {
            if self.header_auth {
                state.auth = Arc::new(HeaderAuth);
            }
            if let Some(c) = &self.catalog {
                state.validator =
                    Arc::new(mcpfleet_tools::validate::Validator::new(&c.tools()).expect("schemas compile"));
                state.catalog = c.clone();
            }
        });
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

/// Three process replicas on a Redis of their own, with the server's default limits and `extra` flags, behind a
/// round-robin proxy: what a client sees of a fleet. Its fields drop in order, the proxy and the replicas first.
#[derive(Debug)]
pub struct ProxiedFleet {
    pub proxy: RoundRobinProxy,
    pub fleet: Fleet,
    pub redis: RedisServer,
}

impl ProxiedFleet {
    /// Starts it.
    pub async fn start(extra: &[&str]) -> Self {
        let redis = RedisServer::start();
        let mut b = Fleet::builder().replicas(3).redis(redis.url()).server_limits();
        for a in extra {
            b = b.arg(*a);
        }
        let fleet = b.start().await;
        let proxy = RoundRobinProxy::start(fleet.bases()).await;
        Self { proxy, fleet, redis }
    }

    /// The proxy's `/mcp` URL.
    #[must_use]
    pub fn url(&self) -> String {
        self.proxy.url()
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
    pub fn stateless(&self, sub: &str) -> mcpfleet_testkit::StatelessClient {
        mcpfleet_testkit::StatelessClient::new().with_token(&self.token(sub))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn value_of<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
        args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).map(String::as_str)
    }

    #[test]
    fn redis_flags_pass_through_with_the_fleet_state_key() {
        let b = Fleet::builder().redis_flags(["--redis-mode", "cluster", "--redis-nodes", "10.9.0.1:1,10.9.0.1:2"]);
        let args = b.serve_args("127.0.0.1");
        assert_eq!(value_of(&args, "--redis-mode"), Some("cluster"));
        assert_eq!(value_of(&args, "--redis-nodes"), Some("10.9.0.1:1,10.9.0.1:2"));
        assert_eq!(value_of(&args, "--request-state-key"), Some(TEST_STATE_KEY));
        assert!(!args.iter().any(|a| a == "--redis-url"));

        let own = ["--redis-url", "redis://x/", "--request-state-key", "k:a2V5"];
        let args = Fleet::builder().redis_flags(own).serve_args("127.0.0.1");
        assert_eq!(args.iter().filter(|a| *a == "--request-state-key").count(), 1);
        assert_eq!(value_of(&args, "--request-state-key"), Some("k:a2V5"));
        let args = Fleet::builder().redis("redis://x/").arg("--request-state-key").arg("k:a2V5").serve_args("h");
        assert_eq!(args.iter().filter(|a| *a == "--request-state-key").count(), 1);

        let args = Fleet::builder().redis_flags(own).redis("redis://y/").serve_args("127.0.0.1");
        assert_eq!(value_of(&args, "--redis-url"), Some("redis://y/"), "the last call wins");
        assert!(!Fleet::builder().serve_args("127.0.0.1").iter().any(|a| a == "--request-state-key"));
    }

    #[test]
    fn a_replica_in_a_lab_listens_on_its_front_address() {
        let b = Fleet::builder().replicas(2).in_namespaces(vec![
            ("lab-r0".to_owned(), std::net::Ipv4Addr::new(10, 9, 64, 2)),
            ("lab-r1".to_owned(), std::net::Ipv4Addr::new(10, 9, 65, 2)),
        ]);
        let args = b.serve_args("10.9.65.2");
        assert_eq!(value_of(&args, "--listen"), Some("10.9.65.2:0"));
        assert_eq!(value_of(&args, "--admin-listen"), Some("10.9.65.2:0"));
        assert_eq!(value_of(&args, "--allowed-hosts"), Some("10.9.65.2:*,127.0.0.1:*,localhost:*"));
        assert!(!b.serve_args("127.0.0.1").iter().any(|a| a == "--allowed-hosts"), "loopback keeps the server's own");
        let args = b.arg("--admin-listen").arg("10.9.65.2:9000").serve_args("10.9.65.2");
        assert_eq!(args.iter().filter(|a| *a == "--admin-listen").count(), 1);
        assert_eq!(value_of(&args, "--admin-listen"), Some("10.9.65.2:9000"));
    }

    #[test]
    fn secured_topologies_get_tls_and_credentials_flags() {
        assert!(secure_flags(None, None).is_empty());
        let flags = secure_flags(Some(("fleet", "pw")), Some(PathBuf::from("/tmp/ca.pem")));
        assert_eq!(
            flags,
            ["--redis-username", "fleet", "--redis-password", "pw", "--redis-tls", "--redis-ca-file", "/tmp/ca.pem"]
        );
    }
}
