use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where Debian's `postgresql-15` puts the server binaries (not on `PATH`).
const DEBIAN_BIN_DIR: &str = "/usr/lib/postgresql/15/bin";
/// The unprivileged user created to run the server when the `postgres` system user is missing.
const FALLBACK_USER: &str = "mcpfleet-pg";
const INSTALL_HINT: &str = "install the Debian package postgresql-15 (tests/run-all.sh does)";

/// A PostgreSQL server of its own: a fresh cluster (`initdb`) in a temp dir under `/tmp`, listening on a free
/// loopback port with trust authentication for the `postgres` role, stopped and deleted on drop.
///
/// It is tuned for tests: `fsync` and `full_page_writes` are off, which only a crash of the machine punishes.
/// `synchronous_commit` stays on, so a commit survives [`stop`](Self::stop) and [`kill`](Self::kill) (with it off,
/// the commits of the last 200 ms are lost in a crash, which a crash test would take for a bug).
///
/// `initdb` and `pg_ctl` refuse to run as root: as root, they run as the `postgres` system user (or a `mcpfleet-pg`
/// system user, created on first use), which owns the temp dir.
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    tls: bool,
    bin: PathBuf,
    /// The user that runs `initdb`, `pg_ctl` and the server, when we are root; `None` to run them as ourselves.
    run_as: Option<String>,
    /// Its port while it is away ([`stop`](Self::stop), [`kill`](Self::kill)): bound, never listening, so that a
    /// client is refused as by a server that is down, and no other server of a parallel test takes the port.
    held: std::sync::Mutex<Option<crate::redis_node::PortHold>>,
    dir: tempfile::TempDir,
}

impl PostgresServer {
    /// Creates a cluster, starts it and waits until it accepts connections.
    ///
    /// # Panics
    /// If PostgreSQL is not installed or the server does not come up.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// Like [`start`](Self::start), but with TLS on and required: the server presents a certificate for
    /// `localhost` and `127.0.0.1` signed by a test CA made at start (see [`ca_file`](Self::ca_file)), and refuses
    /// connections over TCP without TLS.
    ///
    /// # Panics
    /// If PostgreSQL or the `openssl` CLI is not installed, or the server does not come up.
    #[must_use]
    pub fn start_tls() -> Self {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Self {
        crate::init_tls();
        let bin = bin_dir();
        let dir = tempfile::Builder::new().prefix("mcpfleet-pg-").tempdir_in("/tmp").expect("temp dir in /tmp");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).expect("chmod the temp dir");
        let run_as = (fs::metadata(dir.path()).expect("stat the temp dir").uid() == 0).then(server_user);
        if tls {
            crate::tls::make_certificates(&dir.path().join("tls"), &[]);
        }
        if let Some(user) = &run_as {
            chown_tree(dir.path(), user);
        }
        let mut me = Self { port: 0, tls, bin, run_as, held: std::sync::Mutex::default(), dir };
        me.init_cluster();
        for _ in 0..5 {
            me.port = crate::redis_node::free_ports(1)[0];
            if me.pg_ctl_start().status.success() {
                return me;
            }
            // Most likely someone took the port between our probe and the server's bind: try another.
        }
        panic!("PostgreSQL did not start; its log:\n{}", me.log_tail());
    }

    /// The port it listens on, on 127.0.0.1.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    #[must_use]
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// `postgres://postgres@127.0.0.1:<port>/<db>`.
    #[must_use]
    pub fn url_for(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The PEM certificate of the test CA that signed the server's certificate, when started with
    /// [`start_tls`](Self::start_tls).
    #[must_use]
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.tls.then(|| self.dir.path().join("tls/ca.pem"))
    }

    /// Creates a database, owned by `postgres`.
    ///
    /// # Panics
    /// If `psql` fails, e.g. because the database exists.
    pub fn create_database(&self, name: &str) {
        self.psql("postgres", &format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\"")));
    }

    /// Runs `sql` (one or more statements) in database `db` through `psql -qAtX` (quiet, unaligned, tuples only)
    /// as `postgres` over TCP (TLS required when started with [`start_tls`](Self::start_tls)), and returns its
    /// stdout: one line per row, columns separated by `|`, no command tags.
    ///
    /// # Panics
    /// If `psql` cannot run or the SQL fails; the message carries psql's stderr.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let sslmode = if self.tls { "require" } else { "disable" };
        let conninfo = format!("host=127.0.0.1 port={} user=postgres dbname={db} sslmode={sslmode}", self.port);
        let out = Command::new(psql_bin(&self.bin))
            .args(["-qAtX", "-v", "ON_ERROR_STOP=1", "-d", &conninfo, "-c", sql])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run psql: {e} ({INSTALL_HINT})"));
        assert!(out.status.success(), "psql failed on {sql:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`, like a crash: no checkpoint), keeping its data dir
    /// and its port for [`start_again`](Self::start_again): until then, connecting is refused.
    ///
    /// # Panics
    /// If `pg_ctl` fails, e.g. because the server is not running.
    pub fn stop(&self) {
        let out = self.pg_ctl(&["stop", "-m", "immediate", "-w", "-t", "30"]);
        assert!(out.status.success(), "pg_ctl stop failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        self.hold_port();
    }

    fn hold_port(&self) {
        *self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(crate::redis_node::PortHold::new(self.port));
    }

    /// Kills the postmaster with SIGKILL, to simulate a crash, keeping its port as [`stop`](Self::stop) does. Its
    /// backends notice and exit on their own; [`start_again`](Self::start_again) waits for them.
    ///
    /// # Panics
    /// If the server is not running or cannot be signalled.
    pub fn kill(&self) {
        let pid_file = self.data_dir().join("postmaster.pid");
        let pid = fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u32>().ok()))
            .expect("postmaster.pid (is the server running?)");
        let status = Command::new("kill").args(["-KILL", &pid.to_string()]).status().expect("run kill");
        assert!(status.success(), "kill -KILL {pid} failed");
        let deadline = Instant::now() + Duration::from_secs(10);
        while process_alive(pid) {
            assert!(Instant::now() < deadline, "postmaster {pid} still alive 10 s after SIGKILL");
            std::thread::sleep(Duration::from_millis(10));
        }
        // A dead postmaster that nobody reaps stays a zombie, which looks alive to the next one's lock file check.
        let _ = fs::remove_file(pid_file);
        let _ = fs::remove_file(self.dir.path().join(format!(".s.PGSQL.{}.lock", self.port)));
        self.hold_port();
    }

    /// Starts the server again, after [`stop`](Self::stop) or [`kill`](Self::kill), on the same port and data
    /// dir, and waits until it accepts connections (after crash recovery).
    ///
    /// # Panics
    /// If it does not come up within 30 s.
    pub fn start_again(&self) {
        self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // After a kill, the old backends may hold the shared memory for a moment: the new postmaster refuses.
            let out = self.pg_ctl_start();
            if out.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "PostgreSQL did not start again on port {}: {}\nits log:\n{}",
                self.port,
                String::from_utf8_lossy(&out.stderr).trim(),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.log_file()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// A command for a server binary, run as the server's user when we are root.
    fn server_command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        let mut cmd = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(program);
                c
            }
            None => Command::new(program),
        };
        // The server's user may not be able to enter our working directory.
        cmd.current_dir(self.dir.path()).stdin(Stdio::null());
        cmd
    }

    fn init_cluster(&self) {
        let out = self
            .server_command("initdb")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"])
            .output()
            .unwrap_or_else(|e| panic!("run initdb: {e} ({INSTALL_HINT})"));
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        let dir = self.dir.path().display();
        let mut conf = format!(
            "\n# mcpfleet-testkit\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{dir}'\n\
             fsync = off\nfull_page_writes = off\n"
        );
        let mut hba = String::from("local all all trust\n");
        if self.tls {
            conf +=
                &format!("ssl = on\nssl_cert_file = '{dir}/tls/server.crt'\nssl_key_file = '{dir}/tls/server.key'\n");
            hba += "hostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n";
        } else {
            hba += "host all all 127.0.0.1/32 trust\n";
        }
        // Both files exist (initdb wrote them, as the server's user): writing into them keeps their owner.
        fs::OpenOptions::new()
            .append(true)
            .open(self.data_dir().join("postgresql.conf"))
            .and_then(|mut f| f.write_all(conf.as_bytes()))
            .expect("append to postgresql.conf");
        fs::write(self.data_dir().join("pg_hba.conf"), hba).expect("write pg_hba.conf");
    }

    /// `pg_ctl start -w` on our port: it returns once the server accepts connections, or failed to start.
    fn pg_ctl_start(&self) -> Output {
        let mut cmd = self.server_command("pg_ctl");
        cmd.arg("-D").arg(self.data_dir()).arg("-l").arg(self.log_file());
        cmd.args(["-o", &format!("-p {}", self.port), "-w", "-t", "30", "start"]);
        cmd.output().unwrap_or_else(|e| panic!("run pg_ctl: {e} ({INSTALL_HINT})"))
    }

    fn pg_ctl(&self, args: &[&str]) -> Output {
        let mut cmd = self.server_command("pg_ctl");
        cmd.arg("-D").arg(self.data_dir()).args(args);
        cmd.output().unwrap_or_else(|e| panic!("run pg_ctl: {e} ({INSTALL_HINT})"))
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["stop", "-m", "immediate", "-w", "-t", "10"]);
    }
}

/// Debian's PostgreSQL 15 bin dir, else the newest other version's, else an empty path: the binaries on `PATH`.
fn bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if Path::new(DEBIAN_BIN_DIR).join("initdb").exists() {
            return PathBuf::from(DEBIAN_BIN_DIR);
        }
        let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
            .filter(|(_, bin)| bin.join("initdb").exists())
            .collect();
        versions.sort();
        versions.pop().map(|(_, bin)| bin).unwrap_or_default() // empty: rely on PATH
    })
    .clone()
}

fn psql_bin(bin: &Path) -> PathBuf {
    let psql = bin.join("psql");
    if psql.exists() { psql } else { PathBuf::from("psql") }
}

/// The unprivileged user that runs the server when we are root: `postgres`, else `mcpfleet-pg`, created if need be.
fn server_user() -> String {
    static USER: OnceLock<String> = OnceLock::new();
    USER.get_or_init(|| {
        if id("-u", "postgres").is_some() {
            return "postgres".to_owned();
        }
        if id("-u", FALLBACK_USER).is_none() {
            // Another test process may create it at the same time: only the check after counts.
            let _ = Command::new("useradd")
                .args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", FALLBACK_USER])
                .output();
        }
        assert!(id("-u", FALLBACK_USER).is_some(), "no postgres user, and `useradd --system {FALLBACK_USER}` failed");
        FALLBACK_USER.to_owned()
    })
    .clone()
}

/// `id <flag> <user>` as a number: `-u` for the uid, `-g` for the primary gid.
fn id(flag: &str, user: &str) -> Option<u32> {
    let out = Command::new("id").args([flag, user]).stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().parse().ok()).flatten()
}

fn chown_tree(path: &Path, user: &str) {
    let uid = id("-u", user).expect("uid of the server user");
    let gid = id("-g", user).expect("gid of the server user");
    fn walk(path: &Path, uid: u32, gid: u32) {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown for the server user");
        if path.is_dir() {
            for entry in fs::read_dir(path).expect("read dir") {
                walk(&entry.expect("dir entry").path(), uid, gid);
            }
        }
    }
    walk(path, uid, gid);
}

/// Whether `pid` is alive, a zombie counting as dead (Linux `/proc`).
fn process_alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()))
        .is_some_and(|state| state != 'Z' && state != 'X')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn psql_conninfo(conninfo: &str) -> Output {
        Command::new(psql_bin(&bin_dir())).args(["-qAtX", "-d", conninfo, "-c", "select 1"]).output().expect("psql")
    }

    #[test]
    fn starts_creates_a_database_and_answers() {
        let pg = PostgresServer::start();
        assert_ne!(pg.port(), 5432);
        assert_eq!(pg.url(), format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port()));
        assert_eq!(pg.url_for("app"), format!("postgres://postgres@127.0.0.1:{}/app", pg.port()));
        assert_eq!(pg.ca_file(), None);
        pg.create_database("app");
        assert_eq!(pg.psql("app", "select 1"), "1\n");
        pg.psql("app", "create table t (k text primary key, v int); insert into t values ('a', 1), ('b', 2)");
        assert_eq!(pg.psql("app", "select k, v from t order by k"), "a|1\nb|2\n");
        let out = psql_conninfo(&format!("host=127.0.0.1 port={} user=postgres dbname=app", pg.port()));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    #[test]
    fn comes_back_after_a_stop_and_after_a_kill() {
        let pg = PostgresServer::start();
        pg.create_database("app");
        pg.psql("app", "create table t (v int); insert into t values (1)");
        pg.stop();
        assert!(!psql_conninfo(&format!("host=127.0.0.1 port={} user=postgres", pg.port())).status.success());
        pg.start_again();
        assert_eq!(pg.psql("app", "select v from t"), "1\n");
        // Killed mid-query: the orphaned backend must go away before the server can start again.
        let conninfo = format!("host=127.0.0.1 port={} user=postgres dbname=app", pg.port());
        let mut busy = Command::new(psql_bin(&bin_dir()))
            .args(["-qAtX", "-d", &conninfo, "-c", "insert into t values (2); select pg_sleep(60)"])
            .stderr(Stdio::null())
            .spawn()
            .expect("psql");
        let busy_query = "select count(*) from pg_stat_activity where query like '%pg_sleep(60)'"; // not itself
        let deadline = Instant::now() + Duration::from_secs(10);
        while pg.psql("app", busy_query) != "1\n" {
            assert!(Instant::now() < deadline, "the busy query never showed up");
            std::thread::sleep(Duration::from_millis(10));
        }
        pg.kill();
        assert!(!psql_conninfo(&format!("host=127.0.0.1 port={} user=postgres", pg.port())).status.success());
        pg.start_again();
        assert_eq!(pg.psql("app", "select count(*) from t"), "1\n");
        assert!(!busy.wait().expect("wait for psql").success());
    }

    #[test]
    #[should_panic(expected = "psql failed")]
    fn psql_panics_on_bad_sql() {
        let pg = PostgresServer::start();
        pg.psql("postgres", "select * from no_such_table");
    }

    #[test]
    fn tls_only_with_a_verifiable_certificate() {
        let pg = PostgresServer::start_tls();
        let ca = pg.ca_file().expect("a CA file");
        assert!(fs::read_to_string(&ca).expect("read the CA").starts_with("-----BEGIN CERTIFICATE-----"));
        assert_eq!(pg.psql("postgres", "select 1"), "1\n");
        let port = pg.port();
        let plain = psql_conninfo(&format!("host=127.0.0.1 port={port} user=postgres sslmode=disable"));
        assert!(!plain.status.success(), "a connection without TLS was accepted");
        let stderr = String::from_utf8_lossy(&plain.stderr);
        assert!(stderr.contains("no encryption"), "{stderr}");
        for host in ["localhost", "127.0.0.1"] {
            let conninfo =
                format!("host={host} port={port} user=postgres sslmode=verify-full sslrootcert={}", ca.display());
            let out = psql_conninfo(&conninfo);
            assert!(out.status.success(), "{host}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let ssl = pg.psql("postgres", "select ssl from pg_stat_ssl where pid = pg_backend_pid()");
        assert_eq!(ssl, "t\n");
    }
}
