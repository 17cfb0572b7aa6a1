//! The Skills extension (`io.modelcontextprotocol/skills`, docs/SKILLS.md) through three replicas on one Redis behind
//! round-robin: the extension declared in both generations, `skills/list` in pages that never split a skill (a
//! cursor from one replica honoured by the next), `skills/get`, every file read back with the bytes its digest and
//! size describe (compared with the files on disk), `resources/directory/read`, and each refusal as `-32602`. Then
//! the fleet check: a replica started with another skill set is reported by every replica's
//! `mcp_skills_fleet_differing_replicas`; and the start-up refusals (a skill that breaks a rule, a pinned digest
//! that does not match) exit 64 with one line.

#![expect(clippy::expect_used, reason = "test helpers fail loudly")]

use mcpfleet_fleetkit::{Fleet, RedisServer, RoundRobinProxy};
use mcpfleet_fleetkit::{McpClient, StatelessClient, eventually, scrape};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

fn skills_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/skills")
}

fn args(dir: &Path) -> Vec<String> {
    vec!["--skills".into(), dir.to_string_lossy().into_owned(), "--skills-page-size".into(), "2".into()]
}

/// Every file under `dir`, as `skill://` URI → bytes, for the skill rooted at `rel`.
fn files_on_disk(dir: &Path, rel: &str) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.join(rel), rel.to_owned())];
    while let Some((d, r)) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir") {
            let e = e.expect("entry");
            let name = e.file_name().to_string_lossy().into_owned();
            if e.file_type().expect("type").is_dir() {
                stack.push((e.path(), format!("{r}/{name}")));
            } else {
                out.push((format!("skill://{r}/{name}"), std::fs::read(e.path()).expect("read")));
            }
        }
    }
    out.sort();
    out
}

fn sha(bytes: &[u8]) -> String {
    format!("sha256:{}", Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// `resources/read` content as bytes: `text` as UTF-8, `blob` decoded.
fn content_bytes(c: &Value) -> Vec<u8> {
    use base64::Engine as _;
    match (c.get("text"), c.get("blob")) {
        (Some(Value::String(t)), _) => t.as_bytes().to_vec(),
        (_, Some(Value::String(b))) => base64::engine::general_purpose::STANDARD.decode(b).expect("base64"),
        _ => panic!("no content: {c}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skills_are_listed_paged_read_and_verified_through_three_replicas() {
    let redis = RedisServer::start();
    let dir = skills_dir();
    let fleet = Fleet::builder().replicas(3).redis(redis.url()).args(args(&dir)).start().await;
    let proxy = RoundRobinProxy::start(fleet.bases()).await;
    let url = proxy.url();

    // The 2025 generation: the extension in the initialize result, and the methods in the session.
    let init = McpClient::new()
        .post(
            &url,
            &json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "t", "version": "1" } } }),
        )
        .await;
    let init: Value = init.json().await.expect("json");
    let caps = &init["result"]["capabilities"];
    assert_eq!(caps["extensions"]["io.modelcontextprotocol/skills"], json!({ "directoryRead": true }));
    assert!(caps["resources"].is_object(), "the extension needs the resources capability: {caps}");
    let mut client = McpClient::new();
    client.initialize(&url).await;

    // Pages of two, each request on the next replica: every skill once, none split.
    let mut entries = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let params = cursor.as_ref().map_or_else(|| json!({}), |c| json!({ "cursor": c }));
        let r = client.request(&url, 10 + pages, "skills/list", params).await;
        let page = r["result"]["skills"].as_array().expect("skills").clone();
        assert!(!page.is_empty() && page.len() <= 2, "{r}");
        entries.extend(page);
        pages += 1;
        match r["result"]["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 2);
    let uris: Vec<&str> = entries.iter().map(|e| e["uri"].as_str().expect("uri")).collect();
    assert_eq!(
        uris,
        ["skill://acme/billing/refunds/SKILL.md", "skill://git-workflow/SKILL.md", "skill://pdf-processing/SKILL.md"]
    );

    // Each entry's manifest is the files on disk, digest and size, and every read returns those bytes, whichever
    // replica answers it.
    for (entry, rel) in entries.iter().zip(["acme/billing/refunds", "git-workflow", "pdf-processing"]) {
        let disk = files_on_disk(&dir, rel);
        let listed: Vec<(String, String, u64)> = entry["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .map(|r| {
                (
                    r["uri"].as_str().expect("uri").to_owned(),
                    r["digest"].as_str().expect("d").to_owned(),
                    r["size"].as_u64().expect("size"),
                )
            })
            .collect();
        let want: Vec<(String, String, u64)> =
            disk.iter().map(|(u, b)| (u.clone(), sha(b), u64::try_from(b.len()).expect("len"))).collect();
        assert_eq!(listed, want, "{rel}");
        for (i, (uri, bytes)) in disk.iter().enumerate() {
            let r =
                client.request(&url, 100 + i64::try_from(i).expect("i"), "resources/read", json!({ "uri": uri })).await;
            let c = &r["result"]["contents"][0];
            assert_eq!(c["uri"], json!(uri));
            assert_eq!(&content_bytes(c), bytes, "{uri}");
        }
        // skills/get answers the same entry on any replica.
        let got = client.request(&url, 200, "skills/get", json!({ "uri": entry["uri"] })).await;
        assert_eq!(&got["result"]["skill"], entry);
        assert!(got["result"].get("nextCursor").is_none());
    }
    let pdf = &entries[2];
    assert_eq!(pdf["frontmatter"]["metadata"], json!({ "version": "2.1.0", "owner": "docs-team" }), "verbatim");
    let png = client
        .request(&url, 300, "resources/read", json!({ "uri": "skill://pdf-processing/templates/logo.png" }))
        .await;
    assert_eq!(png["result"]["contents"][0]["mimeType"], "image/png");
    assert!(png["result"]["contents"][0].get("blob").is_some(), "bytes that are not UTF-8 go as a blob");

    // The SKILL.md files are listed as resources, named and described by their frontmatter.
    let listed = client.request(&url, 301, "resources/list", json!({})).await;
    let md = listed["result"]["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .find(|r| r["uri"] == "skill://git-workflow/SKILL.md")
        .expect("listed")
        .clone();
    assert_eq!(md["name"], "git-workflow");
    assert_eq!(md["mimeType"], "text/markdown");

    // Directories: direct children, subdirectories as inode/directory, the prefix levels too.
    let root = client.request(&url, 302, "resources/directory/read", json!({ "uri": "skill://pdf-processing" })).await;
    let children: Vec<(String, String)> = root["result"]["resources"]
        .as_array()
        .expect("children")
        .iter()
        .map(|c| (c["uri"].as_str().expect("uri").to_owned(), c["mimeType"].as_str().expect("mime").to_owned()))
        .collect();
    assert_eq!(children[0], ("skill://pdf-processing/SKILL.md".to_owned(), "text/markdown".to_owned()));
    assert_eq!(children[1], ("skill://pdf-processing/references".to_owned(), "inode/directory".to_owned()));
    assert!(root["result"]["nextCursor"].as_str().is_some(), "four children, two a page");
    let acme = client.request(&url, 303, "resources/directory/read", json!({ "uri": "skill://acme" })).await;
    assert_eq!(acme["result"]["resources"][0]["uri"], "skill://acme/billing");

    // Refusals: -32602 with a message that names what was wrong.
    for (method, params, says) in [
        ("skills/get", json!({ "uri": "skill://nope/SKILL.md" }), "no skill is served at skill://nope/SKILL.md"),
        ("skills/get", json!({}), "params.uri must be a string"),
        ("skills/list", json!({ "cursor": "not-ours" }), "the cursor is not one this server gave out"),
        ("skills/list", json!({ "cursor": 3 }), "params.cursor must be a string"),
        (
            "resources/directory/read",
            json!({ "uri": "skill://pdf-processing/SKILL.md" }),
            "skill://pdf-processing/SKILL.md is not a directory resource",
        ),
    ] {
        let r = client.request(&url, 400, method, params).await;
        assert_eq!(r["error"]["code"], -32602, "{method}: {r}");
        assert_eq!(r["error"]["message"], says, "{method}");
    }
    let missing = client.request(&url, 401, "resources/read", json!({ "uri": "skill://pdf-processing/none.md" })).await;
    assert!(missing.get("error").is_some(), "{missing}");

    // The 2026-07-28 generation: declared in server/discover; the list and the entry carry the caching hints.
    let stateless = StatelessClient::new();
    let (status, discover) = stateless.request(&url, 1, "server/discover", json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(
        discover["result"]["capabilities"]["extensions"]["io.modelcontextprotocol/skills"]["directoryRead"],
        true
    );
    let (_, list) = stateless.request(&url, 2, "skills/list", json!({})).await;
    assert_eq!(list["result"]["resultType"], "complete");
    assert!(list["result"]["ttlMs"].is_u64() && list["result"]["cacheScope"].is_string(), "{list}");
    let next = list["result"]["nextCursor"].as_str().expect("a second page").to_owned();
    let (_, second) = stateless.request(&url, 3, "skills/list", json!({ "cursor": next })).await;
    assert_eq!(
        second["result"]["skills"][0]["uri"], "skill://pdf-processing/SKILL.md",
        "the cursor means the same on any replica"
    );
    let (_, get) = stateless.request(&url, 4, "skills/get", json!({ "uri": "skill://git-workflow/SKILL.md" })).await;
    assert!(get["result"]["ttlMs"].is_u64() && get["result"]["cacheScope"].is_string(), "{get}");
    let (_, unknown) = stateless.request(&url, 5, "skills/get", json!({ "uri": "skill://x/SKILL.md" })).await;
    assert_eq!(unknown["error"]["code"], -32602);

    // Every replica agrees: nothing differs, and each serves three skills.
    for r in &fleet.replicas {
        let m = scrape(&r.admin()).await;
        assert_eq!(m["mcp_skills_served"], 3.0);
        assert_eq!(m["mcp_skills_fleet_differing_replicas"], 0.0);
    }
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_another_skill_set_is_reported_across_the_fleet() {
    let redis = RedisServer::start();
    let same = Fleet::builder().replicas(2).redis(redis.url()).args(args(&skills_dir())).start().await;
    let other = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(other.path().join("git-workflow")).expect("mkdir");
    // The same skill, one byte apart.
    let md = std::fs::read(skills_dir().join("git-workflow/SKILL.md")).expect("read");
    let mut changed = md.clone();
    changed.push(b'\n');
    std::fs::write(other.path().join("git-workflow/SKILL.md"), changed).expect("write");
    let odd = Fleet::builder().replicas(1).redis(redis.url()).args(args(other.path())).start().await;
    // Each replica compares every 10 s: within a round or two, everyone sees the difference.
    for (admin, want) in
        [(same.replicas[0].admin(), 1.0), (same.replicas[1].admin(), 1.0), (odd.replicas[0].admin(), 2.0)]
    {
        eventually(25, "the differing skill set to be reported", || {
            let admin = admin.clone();
            async move { scrape(&admin).await.get("mcp_skills_fleet_differing_replicas") == Some(&want) }
        })
        .await;
    }
    // The odd replica stops (SIGTERM: it withdraws its declaration; one that dies unannounced stops counting when its
    // declaration expires, 30 s on): the others agree again at their next comparison.
    let mut odd = odd;
    odd.replicas[0].terminate();
    assert_eq!(odd.replicas[0].wait_exit(15), Some(0));
    for r in &same.replicas {
        let admin = r.admin();
        eventually(25, "the fleet to agree again", || {
            let admin = admin.clone();
            async move { scrape(&admin).await.get("mcp_skills_fleet_differing_replicas") == Some(&0.0) }
        })
        .await;
    }
}

#[test]
fn a_skill_that_breaks_a_rule_or_a_digest_that_differs_refuses_the_start() {
    let bad = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(bad.path().join("billing")).expect("mkdir");
    std::fs::write(bad.path().join("billing/SKILL.md"), "---\nname: refunds\ndescription: d\n---\n").expect("write");
    let dir = skills_dir().to_string_lossy().into_owned();
    let zeros = format!("sha256:{}", "0".repeat(64));
    for (args, says) in [
        (vec!["--skills".to_owned(), bad.path().to_string_lossy().into_owned()], "must be equal"),
        (vec!["--skills".to_owned(), "/nonexistent".to_owned()], "not a directory"),
        (vec!["--skills".to_owned(), dir.clone(), "--skills-digest".to_owned(), zeros], "--skills-digest"),
        (vec!["--skills".to_owned(), dir, "--skills-digest".to_owned(), "md5:x".to_owned()], "64 lowercase hex"),
    ] {
        let err = mcpfleet_fleetkit::refused_start(&args);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
