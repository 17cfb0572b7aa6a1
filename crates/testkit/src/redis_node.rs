//! One process of a Redis topology (a data node or a Sentinel), and what the topologies share: free ports,
//! `redis-cli` with a deadline, and waiting for a condition with a panic that says which step, which node and why.

use std::fmt;
use std::fs;
use std::io::Read as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError, mpsc};
use std::time::{Duration, Instant};

/// How long one step of a topology (a start, an attach, an agreement, a failover) may take before the test panics.
pub(crate) const STEP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one `redis-cli` call may take: a node that does not answer must not hang the test.
const CLI_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a wait polls.
const POLL: Duration = Duration::from_millis(50);
/// How many lines of a node's log a panic message shows.
const LOG_TAIL_LINES: usize = 30;
/// How many times a node is started on fresh ports when it exits at once (someone took a port meanwhile).
const START_ATTEMPTS: usize = 5;

/// What a node says it is, from `ROLE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A master.
    Master,
    /// A replica of the master on `<its topology's host>:<master_port>`; `link_up` once it is connected and in sync.
    Replica { master_port: u16, link_up: bool },
    /// A Sentinel.
    Sentinel,
}

/// One `redis-server` process of a [`RedisServer`](crate::RedisServer), a [`RedisCluster`](crate::RedisCluster) or
/// a [`RedisSentinel`](crate::RedisSentinel), a data node or a Sentinel, on a free port of its topology's host
/// (`127.0.0.1`, or the service address of a [`NetLab`](crate::NetLab)), in a temp dir of its own that holds its
/// config files and its log. Its topology owns it and kills it (and removes its dir) on drop; tests get `&RedisNode`
/// handles to look at it, kill it or stop it. Its `redis-cli` helpers speak TLS and log in as the topology's ACL user
/// when it has them.
#[derive(Debug)]
pub struct RedisNode {
    label: String,
    port: u16,
    pid: std::sync::atomic::AtomicU32,
    access: Access,
    /// Its command line, to start it again on the same port.
    argv: Vec<std::ffi::OsString>,
    child: Mutex<Child>,
    dir: tempfile::TempDir,
}

impl RedisNode {
    /// Starts a node and waits until it answers (`INFO server`, with its pid) through `access`. `command` gets the
    /// node's dir and `ports` free ports (the first is the one it serves on) and returns its command line, which
    /// should log to [`LOG_FILE`] in that dir; with `netns`, it runs in that network namespace (`ip netns exec`
    /// execs it: the child is the node). When the node exits at once, most likely because someone took a port
    /// between our probe and its bind, it is started again on fresh ports.
    pub(crate) fn spawn(
        label: String,
        ports: usize,
        access: Access,
        netns: Option<&str>,
        command: impl Fn(&Path, &[u16]) -> Command,
    ) -> Self {
        crate::init_tls();
        let dir = tempfile::Builder::new().prefix("mcpfleet-redis-").tempdir().expect("temp dir for a redis node");
        let host = &access.host;
        for _ in 0..START_ATTEMPTS {
            let ports = free_ports(ports);
            let port = ports[0];
            let mut command = command(dir.path(), &ports);
            if let Some(netns) = netns {
                let mut wrapped = Command::new("ip");
                wrapped.args(["netns", "exec", netns]).arg(command.get_program()).args(command.get_args());
                command = wrapped;
            }
            let argv: Vec<std::ffi::OsString> =
                std::iter::once(command.get_program()).chain(command.get_args()).map(ToOwned::to_owned).collect();
            let mut child = launch(&argv, dir.path());
            let pid = child.id();
            let deadline = Instant::now() + STEP_TIMEOUT;
            loop {
                // Its pid, not just any answer: whoever took the port from it would answer too.
                if access.cli(port, &["--raw"], &["INFO", "server"]).is_some_and(|o| answers_as(&o, pid)) {
                    let pid = pid.into();
                    return Self { label, port, pid, access, argv, child: Mutex::new(child), dir };
                }
                if child.try_wait().ok().flatten().is_some() {
                    break; // lost a port: try others
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "{label} ({host}:{port}, pid {pid}) does not answer {} s after its start\n{}",
                        STEP_TIMEOUT.as_secs(),
                        log_tail(dir.path())
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("{label} exited at start {START_ATTEMPTS} times, on fresh ports each time\n{}", log_tail(dir.path()));
    }

    /// The port it serves on (its TLS port when it speaks TLS: then it has no other).
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address it serves on: `127.0.0.1`, or the service address of the [`NetLab`](crate::NetLab) it runs in.
    #[must_use]
    pub fn host(&self) -> &str {
        &self.access.host
    }

    /// `<host>:<port>`.
    #[must_use]
    pub fn addr(&self) -> String {
        format!("{}:{}", self.access.host, self.port)
    }

    /// `redis://<host>:<port>/`, `rediss://` when it speaks TLS, with `user:password@` when its topology has an ACL
    /// user (a Sentinel has none).
    #[must_use]
    pub fn url(&self) -> String {
        self.access.url(&self.access.host, self.port)
    }

    /// The process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Starts it again, after [`stop`](Self::stop) or [`kill`](Self::kill), on the same port with the same
    /// command line (an empty data set: nothing is saved), and waits until it answers.
    ///
    /// # Panics
    /// It is still running, or it does not answer within 20 s (someone took its port meanwhile).
    pub fn start_again(&self) {
        assert!(!self.is_running(), "{self} is still running");
        let child = launch(&self.argv, self.dir.path());
        let pid = child.id();
        *self.child() = child;
        self.pid.store(pid, std::sync::atomic::Ordering::Release);
        let deadline = Instant::now() + STEP_TIMEOUT;
        while !self.access.cli(self.port, &["--raw"], &["INFO", "server"]).is_some_and(|o| answers_as(&o, pid)) {
            assert!(Instant::now() < deadline, "{self} does not answer after its restart\n{}", self.log_tail());
            std::thread::sleep(POLL);
        }
    }

    /// Whether the process is still running (it is reaped when it has exited).
    #[must_use]
    pub fn is_running(&self) -> bool {
        self.child().try_wait().is_ok_and(|status| status.is_none())
    }

    /// Kills the process with SIGKILL, like a crash, and reaps it. A node that is not running stays so.
    pub fn kill(&self) {
        let mut child = self.child();
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Stops the process with SIGTERM, which Redis takes as `SHUTDOWN` (nothing is saved: there are no save points),
    /// and waits until it has exited; after 10 s, kills it.
    pub fn stop(&self) {
        if !self.is_running() {
            return;
        }
        let _ = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.is_running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
    }

    /// What it says it is (`ROLE`), or `None` when it does not answer.
    #[must_use]
    pub fn role(&self) -> Option<Role> {
        let out = self.raw_opt(&["ROLE"])?;
        let lines: Vec<&str> = out.lines().collect();
        match *lines.first()? {
            "master" => Some(Role::Master),
            "sentinel" => Some(Role::Sentinel),
            "slave" => {
                Some(Role::Replica { master_port: lines.get(2)?.parse().ok()?, link_up: *lines.get(3)? == "connected" })
            }
            _ => None,
        }
    }

    /// Runs one command through `redis-cli` on this node and returns its raw output; `None` when it does not
    /// answer within 5 s or replies with an error.
    #[must_use]
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        self.raw_opt(args)
    }

    /// `redis-cli` for this node, with its host, port, TLS and ACL flags, to add flags and a command to.
    #[must_use]
    pub fn redis_cli(&self) -> Command {
        self.access.redis_cli(self.port)
    }

    /// The last lines of its log, with a header naming it, for panic messages.
    #[must_use]
    pub fn log_tail(&self) -> String {
        format!("--- the log of {self} ---\n{}", log_tail(self.dir.path()))
    }

    /// `redis-cli --raw -e <args>`.
    pub(crate) fn raw_opt(&self, args: &[&str]) -> Option<String> {
        self.cli_result(&["--raw", "-e"], args).ok()
    }

    /// `redis-cli <flags> <args>` with a deadline, or what went wrong.
    pub(crate) fn cli_result(&self, flags: &[&str], args: &[&str]) -> Result<String, String> {
        self.access.cli_result(self.port, flags, args)
    }

    /// `redis-cli --json -e <args>` (RESP3: maps are objects), parsed.
    pub(crate) fn json(&self, args: &[&str]) -> Option<serde_json::Value> {
        serde_json::from_str(&self.cli_result(&["--json", "-e"], args).ok()?).ok()
    }

    /// A `field:value` section (`INFO`, `CLUSTER INFO`) as a lookup.
    pub(crate) fn info(&self, args: &[&str]) -> Option<Vec<(String, String)>> {
        let out = self.raw_opt(args)?;
        Some(
            out.lines()
                .filter_map(|l| l.trim_end().split_once(':'))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    fn child(&self) -> MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Display for RedisNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}:{}, pid {})", self.label, self.access.host, self.port, self.pid())
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether `INFO server` output comes from process `pid`.
/// Runs `argv` with its output appended to the node's stdio log in `dir`.
fn launch(argv: &[std::ffi::OsString], dir: &Path) -> Child {
    let stdio =
        fs::OpenOptions::new().create(true).append(true).open(dir.join(STDIO_FILE)).expect("open the node's stdio log");
    Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(stdio.try_clone().expect("clone a file handle"))
        .stderr(stdio)
        .spawn()
        .expect("spawn redis-server (is it installed? .ci/run installs it)")
}

fn answers_as(info: &str, pid: u32) -> bool {
    info.lines().any(|l| l.trim_end().strip_prefix("process_id:") == Some(pid.to_string().as_str()))
}

/// The log every node writes (`--logfile` / `logfile`), in its dir.
pub(crate) const LOG_FILE: &str = "redis.log";
/// Where a node's stdout and stderr go: what it says before it opens its log, e.g. a config error.
const STDIO_FILE: &str = "stdio.log";

/// The last lines of the log in `dir`, and whatever the process printed.
fn log_tail(dir: &Path) -> String {
    let mut out = String::new();
    for file in [STDIO_FILE, LOG_FILE] {
        let text = fs::read_to_string(dir.join(file)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for line in &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..] {
            out.push_str(line);
            out.push('\n');
        }
    }
    if out.is_empty() { "(empty)\n".to_owned() } else { out }
}

/// `n` distinct free loopback ports (each held until all are picked), for every server the testkit starts. They are
/// free in this process's network namespace: in a [`NetLab`](crate::NetLab)'s, where only the lab's nodes listen,
/// a node that meets another's port exits at once and [`RedisNode::spawn`] picks again.
pub(crate) fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> =
        (0..n).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free port")).collect();
    listeners.iter().map(|l| l.local_addr().expect("a bound address").port()).collect()
}

/// A loopback port bound and not listening, until dropped: connecting to it is refused (as to a server that is
/// down), and no one else binds it meanwhile. A server that stops for a while keeps its port so.
#[derive(Debug)]
pub(crate) struct PortHold(
    #[expect(dead_code, reason = "held for its binding, until dropped")] Option<tokio::net::TcpSocket>,
);

impl PortHold {
    /// Binds `port` (with `SO_REUSEADDR`, beside the server's connections in `TIME_WAIT`). The dying server's
    /// processes may hold it for a moment: it tries for up to 5 s, then holds nothing.
    pub(crate) fn new(port: u16) -> Self {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let bound = tokio::net::TcpSocket::new_v4().and_then(|s| {
                s.set_reuseaddr(true)?;
                s.bind(std::net::SocketAddr::from(([127, 0, 0, 1], port)))?;
                Ok(s)
            });
            match bound {
                Ok(s) => return Self(Some(s)),
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => return Self(None),
            }
        }
    }
}

/// How `redis-cli` and clients reach the nodes of a topology: the host they serve on, the CA that signed their
/// certificate when they speak TLS only, and the ACL user to log in as (data nodes only: a Sentinel has none).
#[derive(Debug, Clone)]
pub(crate) struct Access {
    pub(crate) host: String,
    pub(crate) ca: Option<PathBuf>,
    pub(crate) auth: Option<(String, String)>,
}

impl Access {
    /// `redis-cli -h <host> -p <port>`, with `--tls --cacert <ca>` and `--user <u> --pass <p> --no-auth-warning`
    /// when they apply.
    pub(crate) fn redis_cli(&self, port: u16) -> Command {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-h", &self.host, "-p", &port.to_string()]).args(self.flags());
        cmd
    }

    /// The TLS and ACL flags of `redis-cli`, e.g. for `redis-cli --cluster create`.
    pub(crate) fn flags(&self) -> Vec<std::ffi::OsString> {
        let mut flags = Vec::new();
        if let Some(ca) = &self.ca {
            flags.extend(["--tls".into(), "--cacert".into(), ca.clone().into_os_string()]);
        }
        if let Some((user, password)) = &self.auth {
            flags.extend(["--user", user, "--pass", password, "--no-auth-warning"].map(Into::into));
        }
        flags
    }

    /// Runs `redis-cli <flags> <args>` on `port` and returns its stdout when it exits with 0 within 5 s.
    pub(crate) fn cli(&self, port: u16, flags: &[&str], args: &[&str]) -> Option<String> {
        self.cli_result(port, flags, args).ok()
    }

    /// Like [`cli`](Self::cli), with what went wrong otherwise.
    pub(crate) fn cli_result(&self, port: u16, flags: &[&str], args: &[&str]) -> Result<String, String> {
        let mut cmd = self.redis_cli(port);
        cmd.args(flags).args(args);
        run(cmd, CLI_TIMEOUT)
    }

    /// `redis://` or `rediss://`, with `user:password@` (percent-encoded) when there is a user, then `host:port/`.
    pub(crate) fn url(&self, host: &str, port: u16) -> String {
        let scheme = if self.ca.is_some() { "rediss" } else { "redis" };
        let credentials = self
            .auth
            .as_ref()
            .map(|(user, password)| format!("{}:{}@", percent_encode(user), percent_encode(password)))
            .unwrap_or_default();
        format!("{scheme}://{credentials}{host}:{port}/")
    }
}

/// `text` with every byte but the URL-unreserved ones (`A-Z a-z 0-9 - . _ ~`) as `%XX`.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Runs `cmd`, killing it after `timeout`. Its stdout when it exits with 0, else its stdout and stderr (or why it
/// did not run).
pub(crate) fn run(mut cmd: Command, timeout: Duration) -> Result<String, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let (tx, rx) = mpsc::channel();
    for (i, pipe) in [child.stdout.take().map(box_read), child.stderr.take().map(box_read)].into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut buf);
            }
            let _ = tx.send((i, String::from_utf8_lossy(&buf).into_owned()));
        });
    }
    let deadline = Instant::now() + timeout;
    let mut streams = [String::new(), String::new()];
    let mut timed_out = false;
    for _ in 0..2 {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((i, text)) => streams[i] = text,
            Err(_) => {
                timed_out = true;
                let _ = child.kill();
                break;
            }
        }
    }
    let status = child.wait().map_err(|e| format!("cannot wait for {cmd:?}: {e}"))?;
    let [stdout, stderr] = streams;
    if timed_out {
        Err(format!("{cmd:?} timed out after {} s\nstdout:\n{stdout}\nstderr:\n{stderr}", timeout.as_secs()))
    } else if status.success() {
        Ok(stdout)
    } else {
        Err(format!("{cmd:?} failed ({status})\nstdout:\n{stdout}\nstderr:\n{stderr}"))
    }
}

fn box_read(pipe: impl std::io::Read + Send + 'static) -> Box<dyn std::io::Read + Send> {
    Box::new(pipe)
}

/// Why a wait is not over yet: the node to blame and what is missing.
#[derive(Debug)]
pub(crate) struct NotYet<'a> {
    pub(crate) node: &'a RedisNode,
    pub(crate) why: String,
}

impl<'a> NotYet<'a> {
    pub(crate) fn new(node: &'a RedisNode, why: impl Into<String>) -> Self {
        Self { node, why: why.into() }
    }
}

/// Polls `check` until it returns `Ok`, for at most [`STEP_TIMEOUT`].
///
/// # Panics
/// After the timeout, with `topology`, `step`, the node the last check blamed, why, and that node's log tail.
pub(crate) fn wait_for<'a, T>(topology: &str, step: &str, mut check: impl FnMut() -> Result<T, NotYet<'a>>) -> T {
    let started = Instant::now();
    loop {
        match check() {
            Ok(done) => return done,
            Err(not_yet) if started.elapsed() >= STEP_TIMEOUT => panic!(
                "{topology}: {step}: not done after {} s: {}: {}\n{}",
                STEP_TIMEOUT.as_secs(),
                not_yet.node,
                not_yet.why,
                not_yet.node.log_tail()
            ),
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_a_node_by_its_pid() {
        let info = "# Server\r\nredis_version:7.0.15\r\nprocess_id:4242\r\ntcp_port:6379\r\n";
        assert!(answers_as(info, 4242));
        assert!(!answers_as(info, 424));
        assert!(!answers_as("", 4242));
    }

    #[test]
    fn urls_carry_tls_and_credentials() {
        let mut access = Access { host: "10.9.0.1".to_owned(), ca: None, auth: None };
        assert_eq!(access.url("10.9.0.1", 7000), "redis://10.9.0.1:7000/");
        access.ca = Some(PathBuf::from("/tmp/ca.pem"));
        access.auth = Some(("fleet".to_owned(), "p@ss w/rd".to_owned()));
        assert_eq!(access.url("localhost", 7000), "rediss://fleet:p%40ss%20w%2Frd@localhost:7000/");
        let flags: Vec<String> = access.flags().iter().map(|f| f.to_string_lossy().into_owned()).collect();
        assert_eq!(
            flags,
            ["--tls", "--cacert", "/tmp/ca.pem", "--user", "fleet", "--pass", "p@ss w/rd", "--no-auth-warning"]
        );
    }

    #[test]
    fn free_ports_differ() {
        let mut ports = free_ports(8);
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 8);
    }
}
