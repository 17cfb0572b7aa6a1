//! `mcpfleet revoke` (docs/POLICY.md, "Revocation"): a principal, or one of its tokens, refused by every replica
//! on its next request (the admission script reads the revocation in the same round trip), its open streams
//! closed by each replica on the announcement, its sessions refused on resumption; kept in Redis for `--for` (by
//! default the longest a token may live); audited with `--database-url`. `--lift` ends one, `--list` shows those in
//! force.

use crate::config::{EXIT_CONFIG, EXIT_UNAVAILABLE, Revoke, RevokeAction};
use mcpfleet_core::{time::epoch_ms, user_key};
use mcpfleet_db::audit::admin::{self, Change};
use mcpfleet_db::{Database, DbSettings};
use mcpfleet_state::{RedisStore, Revocation, RevocationStore as _};
use serde_json::{Value, json};
use std::time::{Duration, UNIX_EPOCH};

/// Runs `revoke`; its exit code.
pub(crate) async fn run(name: &str, r: &Revoke) -> i32 {
    let redis = match RedisStore::connect(r.redis.clone()).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{name}: revoke: the store does not answer: {e}");
            return EXIT_UNAVAILABLE;
        }
    };
    match &r.action {
        RevokeAction::List => list(name, &redis).await,
        RevokeAction::Revoke { iss, sub, jti, for_ } => {
            let user = user_key(iss, sub);
            let until = epoch_ms() + u64::try_from(for_.as_millis()).unwrap_or(u64::MAX / 2);
            let record = json!({
                "iss": iss, "sub": sub, "jti": jti, "until_ms": until, "by": r.by, "at_ms": epoch_ms(),
            });
            let rv =
                Revocation { user: user.clone(), token_id: jti.clone(), until_ms: until, record: record.to_string() };
            if let Err(e) = redis.revoke(&rv).await {
                eprintln!("{name}: revoke: cannot store it: {e}");
                return EXIT_UNAVAILABLE;
            }
            let what = described(user.as_str(), jti.as_deref());
            let line = format!("revoked {what} until {}", rfc3339_ms(until));
            println!("{line} (sub {sub} of {iss}) by {}", r.by);
            audit(name, r.database.as_ref(), &r.by, "revoked", &line).await
        }
        RevokeAction::Lift { iss, sub, jti } => {
            let user = user_key(iss, sub);
            match redis.lift(&user, jti.as_deref()).await {
                Ok(had) => {
                    let what = described(user.as_str(), jti.as_deref());
                    let line = format!("lifted the revocation of {what}");
                    if had {
                        println!("{line} (sub {sub} of {iss}) by {}", r.by);
                    } else {
                        println!("{what} (sub {sub} of {iss}) was not revoked");
                    }
                    audit(name, r.database.as_ref(), &r.by, "lifted", &line).await
                }
                Err(e) => {
                    eprintln!("{name}: revoke --lift: cannot store it: {e}");
                    EXIT_UNAVAILABLE
                }
            }
        }
    }
}

/// `principal <key>` or `token <jti> of principal <key>` (the key is the opaque hash the audit trail uses).
fn described(user: &str, jti: Option<&str>) -> String {
    match jti {
        Some(j) => format!("token {j} of principal {user}"),
        None => format!("principal {user}"),
    }
}

fn rfc3339_ms(ms: u64) -> String {
    mcpfleet_db::rfc3339(UNIX_EPOCH + Duration::from_millis(ms))
}

/// The revocations in force, one line each: until, the principal's key, sub and iss, the token, who.
async fn list(name: &str, redis: &RedisStore) -> i32 {
    let listed = match redis.revocations().await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{name}: revoke --list: {e}");
            return EXIT_UNAVAILABLE;
        }
    };
    let now = epoch_ms();
    let mut any = false;
    for l in listed {
        let r: Value = serde_json::from_str(&l.record).unwrap_or(Value::Null);
        let until = r["until_ms"].as_u64().unwrap_or(0);
        if until <= now {
            continue;
        }
        any = true;
        let text = |k: &str| r[k].as_str().unwrap_or("-").to_owned();
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}",
            rfc3339_ms(until),
            l.user,
            text("sub"),
            text("iss"),
            r["jti"].as_str().map_or_else(|| "*".to_owned(), str::to_owned),
            text("by")
        );
    }
    if !any {
        println!("no revocation in force");
    }
    0
}

/// The change's audit row, with a database; the change stands either way (exit 1 when it could not be audited).
async fn audit(name: &str, db: Option<&DbSettings>, by: &str, outcome: &'static str, detail: &str) -> i32 {
    let Some(settings) = db else { return 0 };
    let db = match Database::new(settings) {
        Ok(db) => db,
        Err(e) => {
            eprintln!("{name}: revoke: {e}");
            return EXIT_CONFIG;
        }
    };
    let change = Change {
        writer: "revoke-cli",
        kind: "revoke",
        by,
        outcome,
        digest: None,
        size: None,
        detail: detail.to_owned(),
    };
    match admin::append(&db, &change).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{name}: revoke: done, but its audit record could not be written: {e}");
            1
        }
    }
}
