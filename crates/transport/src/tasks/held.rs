//! A run this replica holds ([`Held`]), and why it may stop before its tool ends ([`Handoff`]): what the replica's
//! [`Tasks`](super::Tasks) keeps of each run, and what the run's [`TaskLink`](super::TaskLink) watches.

use std::sync::{Mutex, PoisonError};
use tokio_util::sync::CancellationToken;

/// Why a run held here stops before its tool ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Handoff {
    /// The replica is shutting down: a re-runnable task goes back to the queue at once.
    HandedBack,
    /// The run's lease was taken by a sweeper (this replica could not renew it in time): another run owns it now.
    LeaseLost,
}

/// One run this replica holds.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) shard: u16,
    pub(crate) generation: u64,
    pub(crate) rerunnable: bool,
    /// Taken from the queue (counts against `--task-workers`), rather than a call that became a task here.
    pub(crate) worker: bool,
    pub(crate) interrupt: CancellationToken,
    pub(crate) reason: Mutex<Option<Handoff>>,
}

impl Held {
    pub(crate) fn hand_off(&self, why: Handoff) {
        *self.reason.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
        self.interrupt.cancel();
    }

    pub(crate) fn reason(&self) -> Option<Handoff> {
        *self.reason.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
