use std::process::Command;

use crate::redis_node::RedisNode;
use crate::redis_options::{RedisOptions, Setup};

/// A `redis-server` of its own, on a free port in a temp dir, stopped on drop. By default on `127.0.0.1`, plaintext,
/// with the open default user; [`RedisServer::start_with`] adds TLS, an ACL user or a [`NetLab`](crate::NetLab).
#[derive(Debug)]
pub struct RedisServer {
    node: RedisNode,
    setup: Setup,
}

impl RedisServer {
    /// Starts one and waits until it answers.
    ///
    /// # Panics
    /// If `redis-server` is not installed or does not come up within 20 s.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(&RedisOptions::default())
    }

    /// Starts one that speaks only TLS (no plaintext port), with a certificate for `localhost` and `127.0.0.1`
    /// signed by a CA of its own ([`RedisServer::ca_file`]); clients need no certificate.
    ///
    /// # Panics
    /// If `redis-server` (built with TLS, as Debian's is) or `openssl` is missing, or it does not come up.
    #[must_use]
    pub fn start_tls() -> Self {
        Self::start_with(&RedisOptions::default().with_tls())
    }

    /// Starts one as `options` say (TLS only, an ACL user, inside a lab) and waits until it answers.
    ///
    /// # Panics
    /// If `redis-server` (built with TLS, as Debian's is), `openssl` or, in a lab, `ip` is missing, or it does not
    /// come up within 20 s; the message has the tail of its log.
    #[must_use]
    pub fn start_with(options: &RedisOptions) -> Self {
        let setup = Setup::new(options);
        let node = setup.data_node("redis server".to_owned(), 1, |_, _| {});
        Self { node, setup }
    }

    #[must_use]
    pub fn port(&self) -> u16 {
        self.node.port()
    }

    /// `<host>:<port>`.
    #[must_use]
    pub fn addr(&self) -> String {
        self.node.addr()
    }

    /// `redis://127.0.0.1:<port>/`, or `rediss://localhost:<port>/` for a TLS server (in a lab: its service address
    /// either way), with `user:password@` (percent-encoded) when it has an ACL user.
    #[must_use]
    pub fn url(&self) -> String {
        let host = if self.setup.tls() && !self.setup.in_lab() { "localhost" } else { self.host() };
        self.setup.data_access().url(host, self.port())
    }

    /// The process, e.g. for its log.
    #[must_use]
    pub fn node(&self) -> &RedisNode {
        &self.node
    }

    /// `redis-cli` for this server (over TLS when it speaks TLS, as its ACL user when it has one).
    fn redis_cli(&self) -> Command {
        self.node.redis_cli()
    }

    /// Runs one command through `redis-cli` and returns its output (`--no-raw`); `None` when `redis-cli` fails
    /// (e.g. no connection) or takes more than 5 s. An error reply is output like any other.
    #[must_use]
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        self.node.cli_result(&["--no-raw"], args).ok()
    }

    /// Runs one command through `redis-cli --raw`.
    #[must_use]
    pub fn raw(&self, args: &[&str]) -> String {
        let out = self.redis_cli().arg("--raw").args(args).output().expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// All keys, sorted.
    #[must_use]
    pub fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> =
            self.raw(&["KEYS", "*"]).lines().filter(|l| !l.is_empty()).map(str::to_owned).collect();
        k.sort();
        k
    }

    /// `INFO commandstats` as (command, calls) pairs.
    #[must_use]
    pub fn command_stats(&self) -> Vec<(String, u64)> {
        self.raw(&["INFO", "commandstats"])
            .lines()
            .filter_map(|l| {
                let l = l.strip_prefix("cmdstat_")?;
                let (name, rest) = l.split_once(':')?;
                let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?.parse().ok()?;
                Some((name.to_owned(), calls))
            })
            .collect()
    }

    /// Pauses the process (SIGSTOP) or resumes it (SIGCONT), for outage tests.
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill").args([sig, &self.node.pid().to_string()]).status();
    }
}

crate::redis_options::setup_accessors!(RedisServer);
