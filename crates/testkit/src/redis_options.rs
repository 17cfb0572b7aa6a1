//! How a Redis topology is deployed: TLS only or plaintext, an ACL user or the open default user, on `127.0.0.1` or
//! inside a [`NetLab`], and the node command lines and `redis-cli` flags that follow from that.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::netns::{LabSite, NetLab};
use crate::redis_node::{Access, LOG_FILE, RedisNode};

/// How [`RedisServer::start_with`](crate::RedisServer::start_with),
/// [`RedisCluster::start_with`](crate::RedisCluster::start_with) and
/// [`RedisSentinel::start_with`](crate::RedisSentinel::start_with) deploy their nodes. The default is what `start()`
/// does: plaintext, the open default user, on `127.0.0.1`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisOptions {
    /// TLS only: the data nodes (and the sentinels) serve no plaintext port, with a certificate for `localhost`,
    /// `127.0.0.1` and the lab's service address, signed by a CA of the topology's own (its `ca_file()`). Replication,
    /// the cluster bus and the sentinels' links to the data nodes use TLS too. Clients need no certificate.
    pub tls: bool,
    /// An ACL user and its password: on every data node the default user is off and this user may do anything
    /// (`~* &* +@all`); replicas log in as it (`masteruser`/`masterauth`), so do the sentinels (`auth-user`,
    /// `auth-pass`). The sentinels themselves ask for no password. Neither may hold whitespace, `"`, `'` or `\`.
    pub acl: Option<(String, String)>,
    /// More ACL users for the data nodes, as `user` lines of an ACL config (`<name> on ><password> <rules>`),
    /// beside [`acl`](Self::acl) (which they need): a test can give the application a user with only the rights
    /// its docs say it needs.
    pub users: Vec<String>,
    /// Inside a [`NetLab`]: every node runs in the lab's Redis namespace and serves on its service address, which
    /// the test process reaches over the lab's management link. See [`NetLab`] for the order of drops.
    pub lab: Option<LabSite>,
}

impl RedisOptions {
    /// With [`tls`](Self::tls).
    #[must_use]
    pub fn with_tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// With an [`acl`](Self::acl) user.
    #[must_use]
    pub fn with_acl(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.acl = Some((user.into(), password.into()));
        self
    }

    /// With one more ACL user (see [`users`](Self::users)): `line` is what follows `user ` in an ACL config.
    #[must_use]
    pub fn with_user(mut self, line: impl Into<String>) -> Self {
        self.users.push(line.into());
        self
    }

    /// Inside `lab` (see [`lab`](Self::lab)).
    #[must_use]
    pub fn in_lab(mut self, lab: &NetLab) -> Self {
        self.lab = Some(lab.redis_site());
        self
    }
}

/// The accessors every topology has from its [`Setup`]: where it serves, its CA, its ACL user and password.
macro_rules! setup_accessors {
    ($topology:ty) => {
        impl $topology {
            /// The address every node serves on (and a cluster's nodes announce): `127.0.0.1`, or the service
            /// address of its lab.
            #[must_use]
            pub fn host(&self) -> &str {
                self.setup.host()
            }

            /// The CA that signed the certificate of every node, sentinels included (PEM); `None` without TLS.
            #[must_use]
            pub fn ca_file(&self) -> Option<std::path::PathBuf> {
                self.setup.ca_file()
            }

            /// The data nodes' ACL user, if they have one (sentinels ask for no password).
            #[must_use]
            pub fn user(&self) -> Option<&str> {
                self.setup.user()
            }

            /// The ACL user's password, if there is one.
            #[must_use]
            pub fn password(&self) -> Option<&str> {
                self.setup.password()
            }
        }
    };
}
pub(crate) use setup_accessors;

/// [`RedisOptions`] put to work for one topology: its certificates, how to reach its nodes, where they run.
#[derive(Debug)]
pub(crate) struct Setup {
    /// How to reach a data node (a sentinel: the same without the user).
    access: Access,
    netns: Option<String>,
    /// More `user` lines for the data nodes' ACL.
    users: Vec<String>,
    /// The CA, the server certificate and its key (`ca.pem`, `server.crt`, `server.key`) in `tls/`.
    certs: Option<tempfile::TempDir>,
}

impl Setup {
    /// Makes the certificates when `options` asks for TLS.
    ///
    /// # Panics
    /// If the ACL user or password is empty or holds a character a config line would need to quote, or `openssl`
    /// fails.
    pub(crate) fn new(options: &RedisOptions) -> Self {
        assert!(options.users.is_empty() || options.acl.is_some(), "more ACL users need an acl user (the admin)");
        if let Some((user, password)) = &options.acl {
            for (what, text) in [("user", user), ("password", password)] {
                assert!(
                    !text.is_empty() && !text.chars().any(|c| c.is_whitespace() || ['"', '\'', '\\'].contains(&c)),
                    "the ACL {what} {text:?} must be non-empty, without whitespace, quotes or backslashes"
                );
            }
        }
        let host: IpAddr = options.lab.as_ref().map_or(IpAddr::from([127, 0, 0, 1]), |site| site.ip.into());
        let certs = options.tls.then(|| {
            let dir =
                tempfile::Builder::new().prefix("mcpfleet-redis-tls-").tempdir().expect("temp dir for certificates");
            crate::tls::make_certificates(&dir.path().join("tls"), &[host]);
            dir
        });
        let ca = certs.as_ref().map(|d| d.path().join("tls").join("ca.pem"));
        Self {
            access: Access { host: host.to_string(), ca, auth: options.acl.clone() },
            netns: options.lab.as_ref().map(|site| site.netns.clone()),
            users: options.users.clone(),
            certs,
        }
    }

    /// The address every node serves on.
    pub(crate) fn host(&self) -> &str {
        &self.access.host
    }

    pub(crate) fn tls(&self) -> bool {
        self.certs.is_some()
    }

    pub(crate) fn in_lab(&self) -> bool {
        self.netns.is_some()
    }

    pub(crate) fn ca_file(&self) -> Option<PathBuf> {
        self.access.ca.clone()
    }

    pub(crate) fn user(&self) -> Option<&str> {
        self.access.auth.as_ref().map(|(user, _)| user.as_str())
    }

    pub(crate) fn password(&self) -> Option<&str> {
        self.access.auth.as_ref().map(|(_, password)| password.as_str())
    }

    /// How to reach a data node.
    pub(crate) fn data_access(&self) -> &Access {
        &self.access
    }

    /// Starts a data node (see [`data_node_command`](Self::data_node_command)) on `ports` free ports, the first
    /// one its own; `more` adds to its command line.
    pub(crate) fn data_node(&self, label: String, ports: usize, more: impl Fn(&mut Command, &[u16])) -> RedisNode {
        RedisNode::spawn(label, ports, self.access.clone(), self.netns.as_deref(), |dir, ports| {
            let mut cmd = self.data_node_command(dir, ports[0]);
            more(&mut cmd, ports);
            cmd
        })
    }

    /// Starts a Sentinel whose config file (in its dir, Sentinel rewrites it) is [`sentinel_conf`](Self::sentinel_conf)
    /// followed by `monitor` (given the master's `host`).
    pub(crate) fn sentinel_node(&self, label: String, monitor: impl Fn(&str) -> String) -> RedisNode {
        let access = Access { auth: None, ..self.access.clone() };
        RedisNode::spawn(label, 1, access, self.netns.as_deref(), |dir, ports| {
            let conf = dir.join("sentinel.conf");
            let text = format!("{}{}", self.sentinel_conf(dir, ports[0]), monitor(self.host()));
            fs::write(&conf, text).expect("write sentinel.conf");
            let mut cmd = Command::new("redis-server");
            cmd.arg(conf).arg("--sentinel");
            cmd
        })
    }

    /// The lines a sentinel's config file with `sentinel monitor <master_name> ...` needs for the data nodes'
    /// ACL user (none without one).
    pub(crate) fn sentinel_auth(&self, master_name: &str) -> String {
        self.access
            .auth
            .as_ref()
            .map(|(user, password)| {
                format!("sentinel auth-user {master_name} {user}\nsentinel auth-pass {master_name} {password}\n")
            })
            .unwrap_or_default()
    }

    /// The command line of a data node serving on `port`: the arguments [`RedisServer`](crate::RedisServer) always
    /// had (no persistence, `DEBUG` for local clients), a log file, an immediate diskless full sync (the default
    /// waits 5 s for more replicas to come), and what the options ask for. With an ACL user, its config file
    /// (`node.conf` in `dir`) holds the users and `masteruser`/`masterauth`; with TLS, it serves only a TLS port
    /// and replicates over TLS. Inside a lab, where no client comes from a loopback address (the test process
    /// comes over the management link), protected mode is off and `DEBUG` is open to every client.
    pub(crate) fn data_node_command(&self, dir: &Path, port: u16) -> Command {
        let mut cmd = Command::new("redis-server");
        if let Some((user, password)) = &self.access.auth {
            let conf = dir.join("node.conf");
            let mut text = format!(
                "user default off\nuser {user} on >{password} ~* &* +@all\nmasteruser {user}\nmasterauth {password}\n"
            );
            for line in &self.users {
                text.push_str(&format!("user {line}\n"));
            }
            fs::write(&conf, text).expect("write node.conf");
            cmd.arg(conf);
        }
        match self.tls_files() {
            Some([cert, key, ca]) => {
                cmd.args(["--port", "0", "--tls-port", &port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(cert)
                    .arg("--tls-key-file")
                    .arg(key)
                    .arg("--tls-ca-cert-file")
                    .arg(ca)
                    .args(["--tls-auth-clients", "no", "--tls-replication", "yes"]);
            }
            None => {
                cmd.args(["--port", &port.to_string()]);
            }
        }
        if self.in_lab() {
            // Clients come from other namespaces, not from a loopback address.
            cmd.args(["--protected-mode", "no"]);
        }
        let debug = if self.in_lab() { "yes" } else { "local" };
        cmd.args(["--bind", self.host(), "--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", debug, "--repl-diskless-sync-delay", "0"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join(LOG_FILE));
        cmd
    }

    /// The first lines of a sentinel's config file: where it listens (a TLS port only with TLS, and then it talks
    /// TLS to the data nodes and the other sentinels; without protected mode inside a lab), its dir and its log.
    fn sentinel_conf(&self, dir: &Path, port: u16) -> String {
        let listen = match self.tls_files() {
            Some([cert, key, ca]) => format!(
                "port 0\ntls-port {port}\ntls-cert-file \"{}\"\ntls-key-file \"{}\"\ntls-ca-cert-file \"{}\"\n\
                 tls-auth-clients no\ntls-replication yes\n",
                cert.display(),
                key.display(),
                ca.display()
            ),
            None => format!("port {port}\n"),
        };
        let protected = if self.in_lab() { "no" } else { "yes" };
        format!(
            "{listen}bind {host}\nprotected-mode {protected}\ndir \"{dir}\"\nlogfile \"{log}\"\n",
            host = self.host(),
            dir = dir.display(),
            log = dir.join(LOG_FILE).display()
        )
    }

    /// The server certificate, its key and the CA, with TLS.
    fn tls_files(&self) -> Option<[PathBuf; 3]> {
        let tls = self.certs.as_ref()?.path().join("tls");
        Some([tls.join("server.crt"), tls.join("server.key"), tls.join("ca.pem")])
    }
}
