//! The Lua scripts of the store, loaded once per store: [`Scripts`] for sessions, events, routing, limits and
//! idempotency records, [`TaskScripts`] for durable tasks and their queue. A script that rings a channel rings it the
//! way the topology needs ([`PubSubKind`]).

use redis::Script;

/// The scripts of sessions, event logs, routing, limits and idempotency records.
pub(super) struct Scripts {
    pub(super) admit: Script,
    pub(super) slot: Script,
    pub(super) refund: Script,
    pub(super) open: Script,
    pub(super) append: Script,
    pub(super) renew: Script,
    pub(super) state: Script,
    pub(super) abandon: Script,
    pub(super) replay: Script,
    pub(super) delete: Script,
    pub(super) deliver: Script,
    pub(super) take: Script,
    pub(super) forget: Script,
    pub(super) cancel: Script,
    pub(super) cancelled: Script,
    pub(super) set_level: Script,
    pub(super) idem: Script,
    pub(super) members: Script,
    pub(super) layouts: Script,
    pub(super) declare: Script,
    pub(super) policy: Script,
    pub(super) revoke: Script,
    pub(super) revoked: Script,
    pub(super) lease: Script,
    pub(super) grant: Script,
}

/// The command a script rings a channel with: sharded on a cluster, where a classic `PUBLISH` would be broadcast to
/// every node.
#[derive(Clone, Copy)]
pub(super) enum PubSubKind {
    Classic,
    Sharded,
}

/// A script, ringing its channels the way `kind` says.
pub(super) fn script(source: &str, kind: PubSubKind) -> Script {
    match kind {
        PubSubKind::Classic => Script::new(source),
        PubSubKind::Sharded => Script::new(&source.replace("redis.call('PUBLISH',", "redis.call('SPUBLISH',")),
    }
}

impl Scripts {
    pub(super) fn new(kind: PubSubKind) -> Self {
        let script = |source| script(source, kind);
        Self {
            admit: Script::new(include_str!("admit.lua")),
            slot: Script::new(include_str!("slot.lua")),
            refund: Script::new(include_str!("refund.lua")),
            open: script(include_str!("open.lua")),
            append: script(include_str!("append.lua")),
            renew: Script::new(include_str!("renew.lua")),
            state: Script::new(include_str!("state.lua")),
            abandon: script(include_str!("abandon.lua")),
            replay: Script::new(include_str!("replay.lua")),
            delete: script(include_str!("delete.lua")),
            deliver: script(include_str!("deliver.lua")),
            take: Script::new(include_str!("take.lua")),
            forget: Script::new(include_str!("forget.lua")),
            members: Script::new(include_str!("members.lua")),
            layouts: Script::new(include_str!("layouts.lua")),
            declare: Script::new(include_str!("declare.lua")),
            policy: script(include_str!("policy.lua")),
            revoke: Script::new(include_str!("revoke.lua")),
            revoked: script(include_str!("revoked.lua")),
            lease: Script::new(include_str!("lease.lua")),
            grant: Script::new(include_str!("grant.lua")),
            cancel: script(include_str!("cancel.lua")),
            cancelled: Script::new(include_str!("cancelled.lua")),
            set_level: Script::new(include_str!("set_level.lua")),
            idem: Script::new(include_str!("idem.lua")),
        }
    }
}

/// The scripts of durable tasks and their queue (see `super::tasks`).
pub(super) struct TaskScripts {
    pub(super) create: Script,
    pub(super) update: Script,
    pub(super) cancel: Script,
    pub(super) start: Script,
    pub(super) ask: Script,
    pub(super) finish: Script,
    pub(super) requeue: Script,
    pub(super) enqueue: Script,
    pub(super) dequeue: Script,
    pub(super) settle: Script,
    pub(super) renew: Script,
    pub(super) expired: Script,
    pub(super) stats: Script,
    pub(super) tidy: Script,
}

impl TaskScripts {
    pub(super) fn new(kind: PubSubKind) -> Self {
        Self {
            create: Script::new(include_str!("tasks/create.lua")),
            update: Script::new(include_str!("tasks/update.lua")),
            cancel: Script::new(include_str!("tasks/cancel.lua")),
            start: Script::new(include_str!("tasks/start.lua")),
            ask: Script::new(include_str!("tasks/ask.lua")),
            finish: Script::new(include_str!("tasks/finish.lua")),
            requeue: Script::new(include_str!("tasks/requeue.lua")),
            enqueue: script(include_str!("tasks/enqueue.lua"), kind),
            dequeue: Script::new(include_str!("tasks/dequeue.lua")),
            settle: Script::new(include_str!("tasks/settle.lua")),
            renew: Script::new(include_str!("tasks/renew.lua")),
            expired: Script::new(include_str!("tasks/expired.lua")),
            stats: Script::new(include_str!("tasks/stats.lua")),
            tidy: Script::new(include_str!("tasks/tidy.lua")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{PubSubKind, script};

    #[test]
    fn sharded_scripts_ring_sharded_channels() {
        let sources = [
            include_str!("open.lua"),
            include_str!("append.lua"),
            include_str!("abandon.lua"),
            include_str!("delete.lua"),
            include_str!("deliver.lua"),
            include_str!("cancel.lua"),
            include_str!("tasks/enqueue.lua"),
        ];
        for source in sources {
            assert!(source.contains("redis.call('PUBLISH',"), "{source}");
            let sharded = source.replace("redis.call('PUBLISH',", "redis.call('SPUBLISH',");
            assert_eq!(script(source, PubSubKind::Sharded).get_hash(), redis::Script::new(&sharded).get_hash());
            assert!(!sharded.contains("'PUBLISH'"));
        }
    }
}
