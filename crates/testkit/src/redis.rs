use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of its own, on a free loopback port in a temp dir, stopped on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    /// With TLS: the dir of its certificates (`ca.pem`, `server.crt`, `server.key`).
    tls: Option<PathBuf>,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts one and waits until it answers `PING`.
    ///
    /// # Panics
    /// If `redis-server` is not installed or does not come up within 10 s.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// Starts one that speaks only TLS (no plaintext port), with a certificate for `localhost` and `127.0.0.1`
    /// signed by a CA of its own ([`RedisServer::ca_file`]); clients need no certificate.
    ///
    /// # Panics
    /// If `redis-server` (built with TLS, as Debian's is) or `openssl` is missing, or it does not come up.
    #[must_use]
    pub fn start_tls() -> Self {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Self {
        crate::init_tls();
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("temp dir");
            let port = crate::redis_node::free_ports(1)[0];
            let mut cmd = Command::new(redis_server_bin());
            let certs = dir.path().join("tls");
            if tls {
                crate::tls::make_certificates(&certs);
                cmd.args(["--port", "0", "--tls-port", &port.to_string(), "--tls-auth-clients", "no"])
                    .arg("--tls-cert-file")
                    .arg(certs.join("server.crt"))
                    .arg("--tls-key-file")
                    .arg(certs.join("server.key"))
                    .arg("--tls-ca-cert-file")
                    .arg(certs.join("ca.pem"));
            } else {
                cmd.args(["--port", &port.to_string()]);
            }
            let child = cmd
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--enable-debug-command", "local"])
                .arg("--dir")
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server (is it installed? .ci/run installs it)");
            let mut me = Self { child, port, tls: tls.then_some(certs), _dir: dir };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if me.cli(&["PING"]).is_some_and(|o| o.trim() == "PONG") {
                    return me;
                }
                if me.child.try_wait().ok().flatten().is_some() {
                    break; // lost the port to someone else: try another
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("redis-server did not start");
    }

    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`, or `rediss://localhost:<port>/` for a TLS server.
    #[must_use]
    pub fn url(&self) -> String {
        match self.tls {
            Some(_) => format!("rediss://localhost:{}/", self.port),
            None => format!("redis://127.0.0.1:{}/", self.port),
        }
    }

    /// The CA that signed a TLS server's certificate (PEM); `None` without TLS.
    #[must_use]
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.tls.as_ref().map(|d| d.join("ca.pem"))
    }

    /// `redis-cli` for this server (over TLS when it speaks TLS).
    fn redis_cli(&self) -> Command {
        let mut c = Command::new("redis-cli");
        c.args(["-p", &self.port.to_string()]);
        if let Some(ca) = self.ca_file() {
            c.arg("--tls").arg("--cacert").arg(ca);
        }
        c
    }

    /// Runs one command through `redis-cli` and returns its raw output.
    #[must_use]
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        let out = self.redis_cli().arg("--no-raw").args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
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
        let _ = Command::new("kill").args([sig, &self.child.id().to_string()]).status();
    }
}

fn redis_server_bin() -> PathBuf {
    PathBuf::from("redis-server")
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
