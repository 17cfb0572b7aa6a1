//! A network lab of Linux network namespaces, so that a test can cut the real links between server replicas and
//! Redis while the test, the clients and the proxy keep reaching both.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::redis_node::run;

/// The second octets a lab may take: each lab is `10.<net>.0.0/16` for a `net` of this range that nothing on the
/// machine routes yet.
const NETS: std::ops::RangeInclusive<u8> = 64..=253;
/// At most this many replica namespaces per lab (the third octet of their links is `64 + i` and `128 + i`).
const MAX_REPLICAS: usize = 64;
/// How long one `ip` command may take.
const IP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a healed link may take to come up.
const HEAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Every name a lab makes starts with this: namespaces `mcpf<net>-<pid>-rd`, root links `mcpf<net>m`, ...
const NAME: &str = "mcpf";

/// Labs made by this process so far, to start each one's search for a free `net` elsewhere.
static LABS: AtomicU32 = AtomicU32::new(0);

/// Where a Redis topology runs inside a [`NetLab`]: the lab's Redis namespace and its service address. Give it to
/// [`RedisOptions::lab`](crate::RedisOptions::lab), e.g. through
/// [`RedisOptions::in_lab`](crate::RedisOptions::in_lab).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabSite {
    /// The network namespace the nodes run in (`ip netns exec`).
    pub netns: String,
    /// The address every node serves on.
    pub ip: Ipv4Addr,
}

/// A network lab: one namespace for Redis (`<prefix>-rd`) and one per server replica (`<prefix>-r<i>`, `i` from 0,
/// like a fleet's replicas), wired with veth pairs so that a test can cut a replica off Redis for real (its packets
/// are dropped: connections hang until their timeouts, as in a partition) while the test process, its clients and
/// its proxy, which stay in the root namespace, still reach every replica and Redis itself.
///
/// The address plan of a lab, `10.<net>.0.0/16` with a `net` in 64..=253 that nothing on the machine routes yet
/// (several test binaries may run labs at once: a lab claims its `net` by creating the root link `mcpf<net>m`,
/// which fails for a second comer):
///
/// - the Redis service address [`redis_ip`](Self::redis_ip), `10.<net>.0.1/32`, on `lo` of `<prefix>-rd`;
/// - the management link, never cut: root `mcpf<net>m` `10.<net>.1.1/24` to `mgmt` `10.<net>.1.2/24` in
///   `<prefix>-rd`;
/// - the front link of replica `i`: root `mcpf<net>f<i>` `10.<net>.<64+i>.1/24` ([`root_ip`](Self::root_ip)) to
///   `front` `10.<net>.<64+i>.2/24` ([`replica_ip`](Self::replica_ip)) in `<prefix>-r<i>`;
/// - the back link of replica `i`, the one [`cut`](Self::cut) cuts: `back` `10.<net>.<128+i>.2/24` in
///   `<prefix>-r<i>` to `r<i>` `10.<net>.<128+i>.1/24` in `<prefix>-rd`.
///
/// Routes: the root namespace reaches `10.<net>.0.1` over the management link, replica `i` over its back link only
/// (it has no other route to it, nor a default route); the Redis namespace answers over the link a packet came in
/// on (connected routes). No namespace forwards: nothing needs it, and no sysctl of the root namespace is touched.
/// The root namespace gets the lab's links and one host route, which go when the lab is dropped.
///
/// A replica in `<prefix>-r<i>` reaches the test process only at [`root_ip(i)`](Self::root_ip): a server of the
/// test (an issuer, a collector) that replicas must reach has to listen there or on `0.0.0.0`, not on `127.0.0.1`.
///
/// Drop removes every link and namespace the lab made and kills nothing: processes belong to their handles. Drop
/// the topologies and fleets inside a lab before the lab (declare the lab first: locals drop in reverse order). A
/// lab dropped first is tolerated: its links are deleted at once, so whatever still runs inside is cut off from
/// everything, and each namespace goes with its last process.
#[derive(Debug)]
pub struct NetLab {
    net: u8,
    prefix: String,
    replicas: usize,
    /// Made so far, removed on drop in reverse order.
    root_links: Vec<String>,
    namespaces: Vec<String>,
}

/// Why a lab cannot be made.
#[derive(Debug)]
enum Refusal {
    /// The name is someone else's: try another `net`.
    Taken,
    /// Anything else: give up.
    Failed(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Taken => f.write_str("the name is taken"),
            Self::Failed(why) => f.write_str(why),
        }
    }
}

impl NetLab {
    /// Makes a lab with `replicas` replica namespaces (at most 64). Namespaces left behind by test processes that
    /// no longer exist are removed first.
    ///
    /// # Errors
    /// When namespaces cannot be made (not root, no `ip`, no veth support, a sandbox), or every `net` is taken;
    /// the reason says which command failed and why.
    pub fn create(replicas: usize) -> Result<Self, String> {
        if replicas > MAX_REPLICAS {
            return Err(format!("{replicas} replicas: a lab has at most {MAX_REPLICAS}"));
        }
        reclaim_stale_namespaces();
        let taken = routed_prefixes()?;
        let pid = std::process::id();
        let serial = LABS.fetch_add(1, Ordering::Relaxed);
        let count = u32::from(NETS.end() - NETS.start()) + 1;
        let start = pid.wrapping_mul(31).wrapping_add(serial.wrapping_mul(7)) % count;
        for offset in 0..count {
            let net = NETS.start() + u8::try_from((start + offset) % count).expect("below the range's size");
            if taken.iter().any(|&(addr, len)| overlaps(addr, len, net))
                || Path::new(&format!("/sys/class/net/{NAME}{net}m")).exists()
            {
                continue;
            }
            let mut lab = Self {
                net,
                prefix: format!("{NAME}{net}-{pid}"),
                replicas,
                root_links: Vec::new(),
                namespaces: Vec::new(),
            };
            match lab.wire() {
                Ok(()) => return Ok(lab),
                Err(Refusal::Taken) => {}
                Err(Refusal::Failed(why)) => return Err(why),
            }
        }
        Err(format!("every 10.<net>.0.0/16 with net in {NETS:?} is routed already or taken by another lab"))
    }

    /// A lab for a test that needs one: [`create`](Self::create)'s, or, when it cannot be made, `None` after
    /// printing `skipped: network namespaces unavailable: <reason>` to stderr, so that the test returns early.
    ///
    /// # Panics
    /// When it cannot be made and the environment variable `CI` is `true`: there, a skipped test would hide a
    /// broken runner.
    #[must_use]
    pub fn require(replicas: usize) -> Option<Self> {
        match Self::create(replicas) {
            Ok(lab) => Some(lab),
            Err(why) if in_ci() => panic!("network namespaces unavailable (and CI=true): {why}"),
            Err(why) => {
                eprintln!("skipped: network namespaces unavailable: {why}");
                None
            }
        }
    }

    /// The lab's name prefix, `mcpf<net>-<pid>`.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How many replica namespaces it has.
    #[must_use]
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// The namespace Redis runs in, `<prefix>-rd`.
    #[must_use]
    pub fn redis_ns(&self) -> String {
        format!("{}-rd", self.prefix)
    }

    /// The Redis service address, `10.<net>.0.1`: every node of a topology inside the lab serves on it.
    #[must_use]
    pub fn redis_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 0, 1)
    }

    /// Where a Redis topology runs in this lab, for [`RedisOptions`](crate::RedisOptions).
    #[must_use]
    pub fn redis_site(&self) -> LabSite {
        LabSite { netns: self.redis_ns(), ip: self.redis_ip() }
    }

    /// The namespace of replica `i` (from 0), `<prefix>-r<i>`.
    ///
    /// # Panics
    /// If the lab has no replica `i`.
    #[must_use]
    pub fn replica_ns(&self, i: usize) -> String {
        self.check(i);
        format!("{}-r{i}", self.prefix)
    }

    /// The front address of replica `i`, `10.<net>.<64+i>.2`: a replica listens there, and the root namespace
    /// (the test, its clients, its proxy) reaches it there, cut or not.
    ///
    /// # Panics
    /// If the lab has no replica `i`.
    #[must_use]
    pub fn replica_ip(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 64 + self.octet(i), 2)
    }

    /// The root namespace's end of replica `i`'s front link, `10.<net>.<64+i>.1`: the one address at which replica
    /// `i` reaches the test process.
    ///
    /// # Panics
    /// If the lab has no replica `i`.
    #[must_use]
    pub fn root_ip(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 64 + self.octet(i), 1)
    }

    /// Cuts replica `i` off Redis: its back link goes down on the Redis side, so that its packets to Redis are
    /// dropped (new connections hang, open ones stall) and Redis's replies go nowhere. The root namespace still
    /// reaches replica `i`, and Redis.
    ///
    /// # Panics
    /// If the lab has no replica `i`, or `ip` fails.
    pub fn cut(&self, i: usize) {
        self.check(i);
        self.ip_or_panic(&["-n", &self.redis_ns(), "link", "set", &format!("r{i}"), "down"]);
    }

    /// Undoes [`cut(i)`](Self::cut) and returns once both ends of the back link are up again (the kernel takes up
    /// to a second to notice a carrier): replica `i` reaches Redis again, and open connections resume if neither
    /// end has given up on them meanwhile.
    ///
    /// # Panics
    /// If the lab has no replica `i`, `ip` fails, or the link is not up within 5 s.
    pub fn heal(&self, i: usize) {
        self.check(i);
        let (rd, ns, peer) = (self.redis_ns(), self.replica_ns(i), format!("r{i}"));
        self.ip_or_panic(&["-n", &rd, "link", "set", &peer, "up"]);
        // The route survives the lost carrier; put it back anyway, should a kernel have dropped it.
        let (gateway, service) = (self.back_rd_ip(i).to_string(), format!("{}/32", self.redis_ip()));
        self.ip_or_panic(&["-n", &ns, "route", "replace", &service, "via", &gateway, "dev", "back"]);
        let deadline = Instant::now() + HEAL_TIMEOUT;
        while !(link_up(&rd, &peer) && link_up(&ns, "back")) {
            assert!(
                Instant::now() < deadline,
                "lab {}: the back link of replica {i} is not up after the heal",
                self.prefix
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // An address resolution begun during the cut holds new packets until its next probe, up to a second
        // later: start afresh.
        self.ip_or_panic(&["-n", &ns, "neigh", "flush", "dev", "back"]);
        self.ip_or_panic(&["-n", &rd, "neigh", "flush", "dev", &peer]);
    }

    /// Cuts every replica off Redis.
    ///
    /// # Panics
    /// If `ip` fails.
    pub fn cut_all(&self) {
        (0..self.replicas).for_each(|i| self.cut(i));
    }

    /// Heals every replica's link to Redis.
    ///
    /// # Panics
    /// If `ip` fails.
    pub fn heal_all(&self) {
        (0..self.replicas).for_each(|i| self.heal(i));
    }

    /// `ip netns exec <ns> <program>`, to add arguments to and run: `program` runs inside `ns` (`ip` execs it, so
    /// the child's pid is the program's).
    #[must_use]
    pub fn exec(&self, ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program);
        cmd
    }

    /// The Redis side of replica `i`'s back link, its gateway to Redis.
    fn back_rd_ip(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 128 + self.octet(i), 1)
    }

    fn check(&self, i: usize) {
        assert!(i < self.replicas, "the lab {} has {} replicas, no replica {i}", self.prefix, self.replicas);
    }

    /// `i` as an octet, checked.
    fn octet(&self, i: usize) -> u8 {
        self.check(i);
        u8::try_from(i).expect("a lab has at most 64 replicas")
    }

    fn ip_or_panic(&self, args: &[&str]) {
        if let Err(why) = ip(args) {
            panic!("lab {}: {why}", self.prefix);
        }
    }

    /// Makes the namespaces and links, recording each as it goes so that drop removes what was made.
    fn wire(&mut self) -> Result<(), Refusal> {
        let net = self.net;
        let rd = self.redis_ns();
        match ip(&["netns", "add", &rd]) {
            Ok(()) => self.namespaces.push(rd.clone()),
            Err(why) if why.contains("File exists") => return Err(Refusal::Taken),
            Err(why) => return Err(Refusal::Failed(why)),
        }
        // The claim on `net`: only one lab can make this link.
        let mgmt = format!("{NAME}{net}m");
        match ip(&["link", "add", &mgmt, "type", "veth", "peer", "name", "mgmt", "netns", &rd]) {
            Ok(()) => self.root_links.push(mgmt.clone()),
            Err(why) if why.contains("File exists") => return Err(Refusal::Taken),
            Err(why) => return Err(Refusal::Failed(why)),
        }
        let service = self.redis_ip().to_string();
        let failed = Refusal::Failed;
        ip(&["-n", &rd, "link", "set", "lo", "up"]).map_err(failed)?;
        ip(&["-n", &rd, "addr", "add", &format!("{service}/32"), "dev", "lo"]).map_err(failed)?;
        ip(&["addr", "add", &format!("10.{net}.1.1/24"), "dev", &mgmt]).map_err(failed)?;
        ip(&["link", "set", &mgmt, "up"]).map_err(failed)?;
        ip(&["-n", &rd, "addr", "add", &format!("10.{net}.1.2/24"), "dev", "mgmt"]).map_err(failed)?;
        ip(&["-n", &rd, "link", "set", "mgmt", "up"]).map_err(failed)?;
        ip(&["route", "add", &format!("{service}/32"), "via", &format!("10.{net}.1.2"), "dev", &mgmt])
            .map_err(failed)?;
        for i in 0..self.replicas {
            let ns = self.replica_ns(i);
            ip(&["netns", "add", &ns]).map_err(failed)?;
            self.namespaces.push(ns.clone());
            ip(&["-n", &ns, "link", "set", "lo", "up"]).map_err(failed)?;
            let front = format!("{NAME}{net}f{i}");
            ip(&["link", "add", &front, "type", "veth", "peer", "name", "front", "netns", &ns]).map_err(failed)?;
            self.root_links.push(front.clone());
            ip(&["addr", "add", &format!("{}/24", self.root_ip(i)), "dev", &front]).map_err(failed)?;
            ip(&["link", "set", &front, "up"]).map_err(failed)?;
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", self.replica_ip(i)), "dev", "front"]).map_err(failed)?;
            ip(&["-n", &ns, "link", "set", "front", "up"]).map_err(failed)?;
            let peer = format!("r{i}");
            ip(&["-n", &ns, "link", "add", "back", "type", "veth", "peer", "name", &peer, "netns", &rd])
                .map_err(failed)?;
            let back_replica = Ipv4Addr::new(10, net, 128 + self.octet(i), 2);
            ip(&["-n", &ns, "addr", "add", &format!("{back_replica}/24"), "dev", "back"]).map_err(failed)?;
            ip(&["-n", &ns, "link", "set", "back", "up"]).map_err(failed)?;
            ip(&["-n", &rd, "addr", "add", &format!("{}/24", self.back_rd_ip(i)), "dev", &peer]).map_err(failed)?;
            ip(&["-n", &rd, "link", "set", &peer, "up"]).map_err(failed)?;
            let gateway = self.back_rd_ip(i).to_string();
            ip(&["-n", &ns, "route", "add", &format!("{service}/32"), "via", &gateway, "dev", "back"])
                .map_err(failed)?;
        }
        Ok(())
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        let mut failures = Vec::new();
        // A veth pair goes with either end, wherever the other is: the root links first, then the back links
        // (from the replica side; a namespace still held by a process keeps its links otherwise).
        for link in self.root_links.iter().rev() {
            failures.extend(ip(&["link", "del", link]).err());
        }
        for ns in self.namespaces.iter().rev().filter(|ns| !ns.ends_with("-rd")) {
            let _ = ip(&["-n", ns, "link", "del", "back"]);
        }
        for ns in self.namespaces.iter().rev() {
            failures.extend(ip(&["netns", "del", ns]).err());
        }
        if !failures.is_empty() {
            eprintln!("lab {}: cleaning up: {}", self.prefix, failures.join("; "));
        }
    }
}

/// Runs `ip <args>`; what went wrong otherwise.
fn ip(args: &[&str]) -> Result<(), String> {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    run(cmd, IP_TIMEOUT).map(drop).map_err(|e| e.trim_end().replace('\n', " "))
}

/// Whether `link` in namespace `ns` is up, carrier included (`state UP`).
fn link_up(ns: &str, link: &str) -> bool {
    let mut cmd = Command::new("ip");
    cmd.args(["-n", ns, "-o", "link", "show", link]);
    run(cmd, IP_TIMEOUT).is_ok_and(|out| out.contains(" state UP "))
}

/// Whether the environment variable `CI` is `true`, as on CI runners.
#[expect(clippy::disallowed_methods, reason = "test support: CI decides whether a lab may be skipped")]
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Removes the namespaces of labs whose process no longer exists (a test that was killed before its lab's drop).
/// Processes still inside one keep it alive, with its links, until they end: their `net` stays taken meanwhile.
fn reclaim_stale_namespaces() {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "list"]);
    let Ok(list) = run(cmd, IP_TIMEOUT) else { return };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        if let Some(pid) = stale_owner(name)
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// The pid in a lab's namespace name, `mcpf<net>-<pid>-rd` or `mcpf<net>-<pid>-r<i>`.
fn stale_owner(name: &str) -> Option<u32> {
    let mut parts = name.strip_prefix(NAME)?.split('-');
    let (net, pid, role) = (parts.next()?, parts.next()?, parts.next()?);
    let role_ok = role == "rd" || role.strip_prefix('r').is_some_and(|i| i.parse::<usize>().is_ok());
    (parts.next().is_none() && net.parse::<u8>().is_ok() && role_ok).then_some(())?;
    pid.parse().ok()
}

/// Every IPv4 prefix the root namespace has an address in or a route to (`ip -4 addr`, `ip -4 route`).
fn routed_prefixes() -> Result<Vec<(Ipv4Addr, u8)>, String> {
    let mut prefixes = Vec::new();
    for args in [&["-4", "-o", "addr", "show"][..], &["-4", "route", "show", "table", "all"][..]] {
        let mut cmd = Command::new("ip");
        cmd.args(args);
        let out = run(cmd, IP_TIMEOUT).map_err(|e| e.trim_end().replace('\n', " "))?;
        prefixes.extend(out.lines().filter_map(|line| line.split_whitespace().find_map(parse_prefix)));
    }
    Ok(prefixes)
}

/// `a.b.c.d` (a /32) or `a.b.c.d/len`.
fn parse_prefix(word: &str) -> Option<(Ipv4Addr, u8)> {
    let (addr, len) = word.split_once('/').unwrap_or((word, "32"));
    let len: u8 = len.parse().ok()?;
    (len <= 32).then_some(())?;
    Some((addr.parse().ok()?, len))
}

/// Whether `addr/len` overlaps `10.<net>.0.0/16`. Prefixes of 8 bits or fewer (`10.0.0.0/8`, a default route) do
/// not count: a lab's routes are more specific, and every 10.x address would be out of reach otherwise.
fn overlaps(addr: Ipv4Addr, len: u8, net: u8) -> bool {
    if len <= 8 {
        return false;
    }
    let bits = u32::from(len.min(16));
    let mask = u32::MAX << (32 - bits);
    u32::from(addr) & mask == u32::from(Ipv4Addr::new(10, net, 0, 0)) & mask
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_what_overlaps_a_lab() {
        let a = |s: &str| parse_prefix(s).expect("a prefix");
        let hits = |s: &str, net| {
            let (addr, len) = a(s);
            overlaps(addr, len, net)
        };
        assert!(hits("10.70.3.0/24", 70));
        assert!(hits("10.70.0.1", 70));
        assert!(hits("10.64.0.0/10", 70));
        assert!(!hits("10.64.0.0/10", 128));
        assert!(!hits("10.0.0.0/8", 70), "a /8 does not count");
        assert!(!hits("10.71.0.0/16", 70));
        assert!(!hits("192.0.2.0/24", 70));
        assert_eq!(parse_prefix("default"), None);
        assert_eq!(parse_prefix("10.1.2.3/33"), None);
    }

    #[test]
    fn knows_the_names_of_its_labs() {
        assert_eq!(stale_owner("mcpf120-4242-rd"), Some(4242));
        assert_eq!(stale_owner("mcpf120-4242-r3"), Some(4242));
        assert_eq!(stale_owner("mcpf120-4242-rx"), None);
        assert_eq!(stale_owner("mcpf120-4242-rd-x"), None);
        assert_eq!(stale_owner("other-4242-rd"), None);
    }
}
