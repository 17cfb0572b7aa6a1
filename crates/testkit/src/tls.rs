//! Test certificates: a CA and a server certificate it signed, for the servers the testkit starts with TLS
//! (PostgreSQL, Redis).

use std::fmt::Write as _;
use std::fs;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// A test CA (`ca.pem`, `ca.key`) and a server certificate it signed for `localhost`, `127.0.0.1` and `more_ips`
/// (`server.crt`, `server.key`, mode 0600 as PostgreSQL requires), all ECDSA P-256, made with the `openssl` CLI.
/// The server certificate serves as a client certificate too: the nodes of a TLS Redis Cluster present theirs to
/// each other on the cluster bus, which always asks for one.
pub(crate) fn make_certificates(dir: &Path, more_ips: &[IpAddr]) {
    fs::create_dir(dir).expect("create the tls dir");
    let key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    openssl(
        dir,
        &format!("req -x509 {key} -keyout ca.key -out ca.pem -days 2 -subj /CN=mcpfleet-testkit-ca"),
        &["-addext=basicConstraints=critical,CA:TRUE", "-addext=keyUsage=critical,keyCertSign,cRLSign"],
    );
    openssl(dir, &format!("req -new {key} -keyout server.key -out server.csr -subj /CN=localhost"), &[]);
    let mut names = "DNS:localhost, IP:127.0.0.1".to_owned();
    for ip in more_ips {
        let _ = write!(names, ", IP:{ip}");
    }
    let ext = format!(
        "basicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature, keyEncipherment\n\
         extendedKeyUsage = serverAuth, clientAuth\nsubjectAltName = {names}\n"
    );
    fs::write(dir.join("server.ext"), ext).expect("write server.ext");
    openssl(
        dir,
        "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.crt -days 2",
        &["-extfile=server.ext"],
    );
    fs::set_permissions(dir.join("server.key"), fs::Permissions::from_mode(0o600)).expect("chmod server.key");
}

/// Runs `openssl` in `dir` with the whitespace-separated `args`, then `more`.
fn openssl(dir: &Path, args: &str, more: &[&str]) {
    let out = Command::new("openssl")
        .args(args.split_whitespace())
        .args(more)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl (install the Debian package openssl)");
    assert!(out.status.success(), "openssl {args} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
}
