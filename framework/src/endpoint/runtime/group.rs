//! Group commit on the endpoint's side: messages received together start as one commit
//! group of the store (one transaction for many handlings; `receive_loop::start_group`
//! forms it), each with its seat in it.
//!
//! Holds `GroupSeat` (a message's place in a group: it begins through the group, or
//! leaves it when dropped unused) and `next_owner` (owner ids of saga instance locks).
//! The store's side of a group is `store::CommitGroup`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Result;
use crate::store::{Begin, CommitGroup};

/// A message's place in a commit group: it begins through the group, or leaves it when
/// dropped unused (its handling ended before the store), so the group does not wait.
pub(super) struct GroupSeat {
    pub(super) group: Arc<dyn CommitGroup>,
    pub(super) index: usize,
    /// The group's owner id for saga instance locks.
    pub(super) owner: u64,
    pub(super) used: bool,
}

/// A fresh owner id for saga instance locks: one per handling, or per commit group.
pub(super) fn next_owner() -> u64 {
    pub(super) static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl GroupSeat {
    pub(super) async fn begin(
        mut self,
        lock: Option<crate::message::LockToken>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Begin> {
        let begun = self.group.clone().begin(self.index, lock, now).await;
        // Only now: a begin stopped half-way (a hard stop) still leaves the group.
        self.used = true;
        begun
    }
}

impl Drop for GroupSeat {
    fn drop(&mut self) {
        if !self.used {
            self.group.leave(self.index);
        }
    }
}
