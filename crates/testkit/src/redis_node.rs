//! One process of a Redis topology (a data node or a Sentinel), and what the topologies share: free ports,
//! `redis-cli` with a deadline, and waiting for a condition with a panic that says which step, which node and why.

use std::fmt;
use std::fs::{self, File};
use std::io::Read as _;
use std::net::TcpListener;
use std::path::Path;
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
    /// A replica of the master on `127.0.0.1:<master_port>`; `link_up` once it is connected and in sync.
    Replica { master_port: u16, link_up: bool },
    /// A Sentinel.
    Sentinel,
}

/// One `redis-server` process of a [`RedisCluster`](crate::RedisCluster) or a
/// [`RedisSentinel`](crate::RedisSentinel), a data node or a Sentinel, on a free loopback port, in a temp dir of its
/// own that holds its config files and its log. Its topology owns it and kills it (and removes its dir) on drop;
/// tests get `&RedisNode` handles to look at it, kill it or stop it.
#[derive(Debug)]
pub struct RedisNode {
    label: String,
    port: u16,
    pid: u32,
    child: Mutex<Child>,
    dir: tempfile::TempDir,
}

impl RedisNode {
    /// Starts a node and waits until it answers (`INFO server`, with its pid). `command` gets the node's dir and `ports` free ports (the
    /// first is the one it serves on) and returns its command line, which should log to [`LOG_FILE`] in that dir.
    /// When the node exits at once, most likely because someone took a port between our probe and its bind, it is
    /// started again on fresh ports.
    pub(crate) fn spawn(label: String, ports: usize, command: impl Fn(&Path, &[u16]) -> Command) -> Self {
        crate::init_tls();
        let dir = tempfile::Builder::new().prefix("mcpfleet-redis-").tempdir().expect("temp dir for a redis node");
        for _ in 0..START_ATTEMPTS {
            let ports = free_ports(ports);
            let port = ports[0];
            let stdio = File::create(dir.path().join(STDIO_FILE)).expect("create the node's stdio log");
            let mut child = command(dir.path(), &ports)
                .stdin(Stdio::null())
                .stdout(stdio.try_clone().expect("clone a file handle"))
                .stderr(stdio)
                .spawn()
                .expect("spawn redis-server (is it installed? .ci/run installs it)");
            let pid = child.id();
            let deadline = Instant::now() + STEP_TIMEOUT;
            loop {
                // Its pid, not just any answer: whoever took the port from it would answer too.
                if cli(port, &["--raw"], &["INFO", "server"]).is_some_and(|o| answers_as(&o, pid)) {
                    return Self { label, port, pid, child: Mutex::new(child), dir };
                }
                if child.try_wait().ok().flatten().is_some() {
                    break; // lost a port: try others
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "{label} (127.0.0.1:{port}, pid {pid}) does not answer {} s after its start\n{}",
                        STEP_TIMEOUT.as_secs(),
                        log_tail(dir.path())
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("{label} exited at start {START_ATTEMPTS} times, on fresh ports each time\n{}", log_tail(dir.path()));
    }

    /// The port it serves on, on 127.0.0.1.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    #[must_use]
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `redis://127.0.0.1:<port>/`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid
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
        let _ = Command::new("kill").args(["-TERM", &self.pid.to_string()]).status();
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

    /// The last lines of its log, with a header naming it, for panic messages.
    #[must_use]
    pub fn log_tail(&self) -> String {
        format!("--- the log of {self} ---\n{}", log_tail(self.dir.path()))
    }

    /// `redis-cli --raw -e <args>`.
    pub(crate) fn raw_opt(&self, args: &[&str]) -> Option<String> {
        cli(self.port, &["--raw", "-e"], args)
    }

    /// `redis-cli --json -e <args>` (RESP3: maps are objects), parsed.
    pub(crate) fn json(&self, args: &[&str]) -> Option<serde_json::Value> {
        serde_json::from_str(&cli(self.port, &["--json", "-e"], args)?).ok()
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
        write!(f, "{} (127.0.0.1:{}, pid {})", self.label, self.port, self.pid)
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether `INFO server` output comes from process `pid`.
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

/// `n` distinct free loopback ports (each held until all are chosen, so they differ).
/// `n` distinct free loopback ports (each held until all are picked), for every server the testkit starts.
pub(crate) fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> =
        (0..n).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free port")).collect();
    listeners.iter().map(|l| l.local_addr().expect("a bound address").port()).collect()
}

/// Runs `redis-cli -p <port> <flags> <args>` and returns its stdout when it exits with 0 within 5 s.
pub(crate) fn cli(port: u16, flags: &[&str], args: &[&str]) -> Option<String> {
    cli_result(port, flags, args).ok()
}

/// Like [`cli`], with what went wrong otherwise.
pub(crate) fn cli_result(port: u16, flags: &[&str], args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-p", &port.to_string()]).args(flags).args(args);
    run(cmd, CLI_TIMEOUT)
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

/// The `redis-server` arguments every data node gets, the ones [`RedisServer`](crate::RedisServer) passes and a
/// log file, plus an immediate diskless full sync (the default waits 5 s for more replicas to come).
pub(crate) fn data_node_command(dir: &Path, port: u16) -> Command {
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--enable-debug-command", "local", "--repl-diskless-sync-delay", "0"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join(LOG_FILE));
    cmd
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
    fn free_ports_differ() {
        let mut ports = free_ports(8);
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 8);
    }
}
