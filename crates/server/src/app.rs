//! The public entry point: [`Server`] takes a tool writer's tools (and optionally a [`Catalog`] of resources,
//! prompts and completions) and runs the `mcpfleet` command line under the writer's own name and version
//! ([`Server::run`]), or builds a replica for a test or an embedding program ([`Server::build`] → [`App`]).

use crate::catalog::{CheckedCatalog, Combined};
use crate::config::{self, Config, Parsed};
use crate::{Built, ServerError, database};
use mcpfleet_db::Database;
use mcpfleet_skills::Skill;
use mcpfleet_tools::{Catalog, Registry, Tool};
use mcpfleet_transport::{AdminState, AppState, Readiness, admin_router};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// An MCP server of your own on the mcpfleet fleet: your tools, the `mcpfleet` command line (`serve`, `token`,
/// `lint`, `migrate`, `audit`, and `demo-data` with the `reference` feature; every flag, environment variable
/// and exit code), under your name and version: clap's `--help` and `--version`, the `serverInfo` clients see,
/// the OpenTelemetry `service.name`, and the protected resource metadata's `resource_name`.
///
/// ```no_run
/// use mcpfleet::{JsonSchema, Tool, ToolContext, ToolError, ToolInfo, ToolOutput, async_trait, schemars};
/// use serde::Deserialize;
///
/// struct Greet;
///
/// #[derive(Deserialize, JsonSchema)]
/// #[serde(deny_unknown_fields)]
/// struct Args {
///     /// Who to greet.
///     #[schemars(length(max = 64))]
///     name: String,
/// }
///
/// #[async_trait]
/// impl Tool for Greet {
///     type Args = Args;
///
///     fn info(&self) -> ToolInfo {
///         ToolInfo::new("greet").description("Greets someone by name.").read_only()
///     }
///
///     async fn call(&self, args: Args, _cx: &dyn ToolContext) -> Result<ToolOutput, ToolError> {
///         Ok(ToolOutput::text(format!("Hello, {}", args.name)))
///     }
/// }
///
/// fn main() -> std::process::ExitCode {
///     mcpfleet::Server::new("greet", "0.1.0").tool(Greet).run()
/// }
/// ```
#[derive(Debug)]
pub struct Server {
    name: String,
    version: String,
    registry: Registry,
    catalog: Option<Arc<dyn Catalog>>,
    instructions: Option<String>,
    /// Skills added by code, and directories of skills read at start (docs/SKILLS.md).
    skills: Vec<Skill>,
    skill_dirs: Vec<PathBuf>,
    /// Registration errors, reported when the server starts (exit 64).
    errors: Vec<String>,
}

impl Server {
    /// A server named `name` at `version` (usually `env!("CARGO_PKG_NAME")` and `env!("CARGO_PKG_VERSION")`),
    /// with no tools yet.
    #[must_use]
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
            registry: Registry::new(),
            catalog: None,
            instructions: None,
            skills: Vec::new(),
            skill_dirs: Vec::new(),
            errors: Vec::new(),
        }
    }

    /// Adds a tool. Its input schema is derived from its `Args` (or given by hand, [`ToolInfo::input_schema`]);
    /// the server lints it before it serves: an open or unbounded schema refuses to start (exit 64, one line
    /// naming the tool, the JSON pointer and the rule), as does a name that is invalid or taken.
    ///
    /// [`ToolInfo::input_schema`]: mcpfleet_tools::ToolInfo::input_schema
    #[must_use]
    pub fn tool<T: Tool>(mut self, tool: T) -> Self {
        if let Err(e) = self.registry.register(tool) {
            self.errors.push(e);
        }
        self
    }

    /// Adds a catalog: its resources, resource templates, prompts and completions, and any tools it lists (which
    /// must not share a name with a [`tool`](Self::tool)). One catalog per server; a second replaces the first.
    #[must_use]
    pub fn catalog(mut self, catalog: impl Catalog + 'static) -> Self {
        self.catalog = Some(Arc::new(catalog));
        self
    }

    /// The `instructions` of the initialize result (and of `server/discover`).
    #[must_use]
    pub fn instructions(mut self, text: impl Into<String>) -> Self {
        self.instructions = Some(text.into());
        self
    }

    /// Serves a skill (the `io.modelcontextprotocol/skills` extension, docs/SKILLS.md): built from its files with
    /// [`Skill::new`], or read with [`Skill::from_dir`]; a skill that fails to build is passed as its error, and
    /// refuses the start (exit 64) with it. The extension is declared when a server has at least one skill.
    #[must_use]
    pub fn skill(mut self, skill: Result<Skill, mcpfleet_skills::SkillError>) -> Self {
        match skill {
            Ok(s) => self.skills.push(s),
            Err(e) => self.errors.push(format!("skills: {e}")),
        }
        self
    }

    /// Serves every skill under `dir`, read once at start (as `--skills DIR` does): each directory below it with
    /// a `SKILL.md` is one, at `skill://<its path>/`.
    #[must_use]
    pub fn skills_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.skill_dirs.push(dir.into());
        self
    }

    /// Runs the command line of this process ([`std::env::args_os`]) and returns its exit code: 0, 64 for bad
    /// configuration (and a tool that fails its checks), 69 for a dependency unreachable at start, 78 for a
    /// database schema behind this binary, 1 for a server failure.
    #[must_use]
    pub fn run(self) -> ExitCode {
        ExitCode::from(u8::try_from(self.run_with(std::env::args_os())).unwrap_or(1))
    }

    /// [`run`](Self::run) over `args` (the program name first, then a subcommand and its flags); the exit code.
    pub fn run_with<I: IntoIterator<Item = OsString>>(self, args: I) -> i32 {
        let name = self.name.clone();
        let cfg = match config::parse_as(args, &self.name, &self.version) {
            Ok(Parsed::Serve(c)) => c,
            Ok(other) => return crate::run_command(&name, other),
            Err(e) => {
                eprintln!("{name}: {e}");
                return e.exit_code();
            }
        };
        // The catalog is checked before logging starts, so that a refusal is one line; the reference tools need
        // the pool.
        let (checked, db) = match database::open(&cfg).and_then(|db| Ok((self.check(&cfg, db.as_ref())?, db))) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{name}: {e}");
                return e.exit_code();
            }
        };
        crate::serve_process(&name, *cfg, checked, db)
    }

    /// Builds one replica from the flags of `serve` (`--redis-url …`, `--auth …`; not the program name nor the
    /// subcommand), with every start-up check of [`run`](Self::run), without binding a socket, installing a
    /// logger or a tracer provider, or handling signals: those are the embedding program's. Serve it with
    /// [`App::serve`] or mount [`App::router`].
    ///
    /// It reaches Redis once: unlike [`run`](Self::run), which listens and waits for a Redis that is away, `build`
    /// returns the failure, and the embedding program decides whether to retry.
    ///
    /// # Errors
    /// What makes [`run`](Self::run) exit: [`ServerError::exit_code`] says which code; and Redis away at start
    /// ([`ServerError::Store`], 69).
    pub async fn build<I, S>(self, serve_flags: I) -> Result<App, ServerError>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let args = [OsString::from(&self.name), OsString::from("serve")]
            .into_iter()
            .chain(serve_flags.into_iter().map(Into::into));
        let cfg = match config::parse_as(args, &self.name, &self.version)? {
            Parsed::Serve(c) => c,
            _ => return Err(ServerError::Config("not a serve command line".to_owned())),
        };
        let db = database::open(&cfg)?;
        let checked = self.check(&cfg, db.as_ref())?;
        let instruments = crate::start::Instruments::register()?;
        let store = crate::start::connect_store(&cfg, instruments.store.clone(), None).await?;
        let ready = instruments.transport.ready_gauge();
        let built = crate::build_state_with(&cfg, checked, db, instruments, store).await?;
        // A database found unusable after the start stops this replica, as the process would stop.
        built.fatal.cancels(built.state.shutdown.clone());
        let readiness = Readiness::new(built.state.shutdown.clone(), ready);
        readiness.serving(built.state.store.clone(), built.state.auth.clone(), built.state.policy.clone());
        Ok(App { cfg, built, readiness })
    }

    /// The catalog this server serves, after the start-up checks (the lint, unique names, `--quota` names); the
    /// fixture sets work on `db`.
    #[cfg_attr(
        not(any(feature = "fixtures", feature = "reference")),
        expect(unused_variables, reason = "only the fixture sets use the database")
    )]
    fn check(self, cfg: &Config, db: Option<&Database>) -> Result<CheckedCatalog, ServerError> {
        if !self.errors.is_empty() {
            return Err(ServerError::Config(format!("tools: {}", self.errors.join("; "))));
        }
        let mut dirs = self.skill_dirs;
        dirs.extend(cfg.skills.dir.clone());
        let skills = crate::catalog::skills(self.skills, &dirs, cfg.skills.page_size, cfg.skills.digest.as_deref())?;
        let skills = Arc::new(skills);
        #[cfg(any(feature = "fixtures", feature = "reference"))]
        if let Some(f) = cfg.fixtures {
            if !self.registry.is_empty() || self.catalog.is_some() {
                return Err(ServerError::Config(format!(
                    "--fixtures serves the fixture sets of the mcpfleet binary; {} has tools of its own",
                    self.name
                )));
            }
            let checked = CheckedCatalog::new(crate::fixtures::catalog(f, cfg, db)?, cfg.limits.plan.quotas.keys())?;
            return Ok(CheckedCatalog { skills, ..checked });
        }
        let catalog = Combined { tools: self.registry, rest: self.catalog, instructions: self.instructions };
        let checked = CheckedCatalog::new(Arc::new(catalog), cfg.limits.plan.quotas.keys())?;
        Ok(CheckedCatalog { skills, ..checked })
    }
}

/// One replica, built and checked ([`Server::build`]): serve it on a listener ([`serve`](Self::serve)), or mount
/// its router in an axum application of yours ([`router`](Self::router)).
#[derive(Debug)]
pub struct App {
    cfg: Box<Config>,
    built: Built,
    readiness: Arc<Readiness>,
}

impl App {
    /// The state every request handler sees (the store, the catalog, the limits, the metrics).
    #[must_use]
    pub fn state(&self) -> &AppState {
        &self.built.state
    }

    /// The same replica with its state changed (a test's authenticator, say).
    #[must_use]
    pub fn map_state(mut self, change: impl FnOnce(&mut mcpfleet_transport::Shared)) -> Self {
        self.built.state = self.built.state.with(change);
        self
    }

    /// The Prometheus registry of this replica's metrics (what the admin listener's `/metrics` serves).
    #[must_use]
    pub fn metrics(&self) -> &prometheus::Registry {
        &self.built.registry
    }

    /// Fires when this replica stops serving; cancel it to stop [`serve`](Self::serve) (every open stream ends
    /// with a `retry:` hint).
    #[must_use]
    pub fn shutdown_token(&self) -> CancellationToken {
        self.built.state.shutdown.clone()
    }

    /// The MCP router (`/mcp`, the protected resource metadata, and the dev issuer's routes with `--auth dev`),
    /// for a listener of your own; it starts this replica's task workers (once). Behind your listener the
    /// replica loses what [`serve`](Self::serve)'s accept loop gives each connection: the peer address (with
    /// `--auth none` the rate limit is then keyed by the anonymous principal, one bucket for everyone, instead of
    /// by address), the request-head deadline (`--header-read-timeout`) and the bounded header buffer
    /// (`--max-header-bytes`), the draining of unread request bodies (a refused upload then closes the connection
    /// instead of keeping it alive), and TCP_NODELAY. Add them in your listener, or use [`serve`](Self::serve).
    pub fn router(&self) -> axum::Router {
        mcpfleet_transport::start_workers(&self.built.state);
        mcpfleet_transport::router(self.built.state.clone())
    }

    /// The admin router: `/metrics`, `/healthz`, `/readyz` (503 once [`shutdown_token`](Self::shutdown_token)
    /// fires). Keep it off the public listener.
    pub fn admin_router(&self) -> axum::Router {
        admin_router(AdminState { registry: self.built.registry.clone(), readiness: self.readiness.clone() })
    }

    /// Serves MCP on `listener` until [`shutdown_token`](Self::shutdown_token) fires; then takes no more queued
    /// tasks (re-runnable runs go back to the queue), waits for the open connections to close, and for the running
    /// calls within `--shutdown-grace`; then closes the audit trail.
    ///
    /// # Errors
    /// None today: accept errors are logged and retried.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        let state = self.built.state.clone();
        let shutdown = state.shutdown.clone();
        let calls = state.calls.clone();
        // As the process's drain does: once stopping, take no more queued tasks and hand re-runnable runs back.
        let tasks = state.tasks.clone();
        let stopping = shutdown.clone();
        tokio::spawn(async move {
            stopping.cancelled().await;
            tasks.stop();
        });
        mcpfleet_transport::serve(listener, state, shutdown).await?;
        calls.close();
        let _ = tokio::time::timeout(self.cfg.shutdown_grace, calls.wait()).await;
        if let Some(w) = self.built.audit {
            w.close(std::time::Duration::from_secs(5)).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcpfleet_tools::{ToolContext, ToolError, ToolInfo, ToolOutput, async_trait, schemars};
    use serde::Deserialize;
    use serde_json::{Value, json};

    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Args {
        #[schemars(length(max = 8))]
        word: String,
    }

    struct Echo(&'static str);

    #[async_trait]
    impl Tool for Echo {
        type Args = Args;
        fn info(&self) -> ToolInfo {
            ToolInfo::new(self.0)
        }
        async fn call(&self, a: Args, _cx: &dyn ToolContext) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::text(a.word))
        }
    }

    async fn refusal(server: Server, flags: &[&str]) -> String {
        match server.build(flags.iter().copied()).await {
            Ok(_) => panic!("built"),
            Err(e) => {
                assert_eq!(e.exit_code(), 64, "{e}");
                e.to_string()
            }
        }
    }

    #[tokio::test]
    async fn what_refuses_to_start() {
        let e = refusal(Server::new("s", "1").tool(Echo("echo")).tool(Echo("echo")), &[]).await;
        assert_eq!(e, "tools: tool echo is registered twice");
        let e = refusal(Server::new("s", "1").tool(Echo("not a name")), &[]).await;
        assert!(e.contains("is not [A-Za-z0-9_.-]{1,128}"), "{e}");
        let e = refusal(Server::new("s", "1").tool(Echo("echo")), &["--quota", "ehco=1/1m"]).await;
        assert_eq!(e, "--quota names \"ehco\", which is not a tool of this server");
        #[cfg(feature = "fixtures")]
        {
            let e = refusal(Server::new("s", "1").tool(Echo("echo")), &["--fixtures", "conformance"]).await;
            assert_eq!(e, "--fixtures serves the fixture sets of the mcpfleet binary; s has tools of its own");
            let e = refusal(Server::new("s", "1").catalog(mcpfleet_tools::EmptyCatalog), &["--fixtures", "open"]).await;
            assert!(e.contains("has tools of its own"), "{e}");
        }
    }

    #[tokio::test]
    async fn a_built_server_carries_its_name_and_version_and_serves_its_tools() {
        let app = Server::new("echo-server", "2.3.4").tool(Echo("echo")).build(["--auth", "none"]).await.unwrap();
        let cfg = &app.state().config;
        assert_eq!((cfg.server_name.as_str(), cfg.server_version.as_str()), ("echo-server", "2.3.4"));
        let tools = app.state().catalog.tools();
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0]["inputSchema"]["properties"]["word"]["maxLength"], 8);
        let caps = app.state().catalog.capabilities();
        assert_eq!(caps, serde_json::json!({ "tools": { "listChanged": false }, "logging": {} }));
        let none = Server::new("s", "1").build(["--auth", "none"]).await.unwrap();
        assert_eq!(none.state().catalog.capabilities(), mcpfleet_tools::EmptyCatalog.capabilities(), "as before");
        assert!(none.state().catalog.tools().is_empty());
        let metrics = prometheus::TextEncoder::new().encode_to_string(&app.metrics().gather()).unwrap();
        assert!(metrics.contains("tool=\"echo\""), "the per-tool series are seeded: {metrics}");
    }

    async fn post(http: &reqwest::Client, url: &str, body: Value) -> Value {
        let resp = http
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", body["method"].as_str().unwrap())
            .header("mcp-name", body["params"]["name"].as_str().unwrap_or("echo"))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        resp.json().await.unwrap()
    }

    /// An embedding program's view: `serve` on its own listener, the admin router beside it, on a real Redis.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serve_on_a_listener_of_ones_own_until_the_shutdown_token_fires() {
        let redis = mcpfleet_fleetkit::RedisServer::start();
        let flags =
            ["--auth", "none", "--redis-url", &redis.url(), "--request-state-key", mcpfleet_fleetkit::TEST_STATE_KEY];
        let app = Server::new("embedded", "3.0.0").tool(Echo("echo")).build(flags).await.unwrap();
        let (stop, admin) = (app.shutdown_token(), app.admin_router());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (url, admin_url) = (
            format!("http://{}/mcp", listener.local_addr().unwrap()),
            format!("http://{}", admin_listener.local_addr().unwrap()),
        );
        tokio::spawn(async move { axum::serve(admin_listener, admin).await });
        let served = tokio::spawn(app.serve(listener));
        let http = reqwest::Client::new();
        let meta = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                           "io.modelcontextprotocol/clientCapabilities": {} });
        let call = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                           "params": { "name": "echo", "arguments": { "word": "hi" }, "_meta": meta } });
        let answer = post(&http, &url, call).await;
        assert_eq!(answer["result"]["content"][0]["text"], "hi", "{answer}");
        assert_eq!(answer["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "embedded", "{answer}");
        let ready = http.get(format!("{admin_url}/readyz")).send().await.unwrap().status();
        assert_eq!(ready, 200);
        let metrics = http.get(format!("{admin_url}/metrics")).send().await.unwrap().text().await.unwrap();
        assert!(metrics.contains("mcp_tool_calls_total{outcome=\"ok\",tool=\"echo\"} 1"), "{metrics}");
        stop.cancel();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), served).await;
        assert!(matches!(ended, Ok(Ok(Ok(())))), "serve returns once the token fires: {ended:?}");
        assert_eq!(http.get(format!("{admin_url}/readyz")).send().await.unwrap().status(), 503, "draining");
    }
}
