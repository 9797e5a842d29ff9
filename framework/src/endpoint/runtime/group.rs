//! Group commit on the endpoint's side: messages received together start as one commit
//! group of the store (one transaction for many handlings), each with its seat in it.
//!
//! Holds `start_group`, `GroupSeat` (a message's place in a group: it begins through the
//! group, or leaves it when dropped unused) and `next_owner` (owner ids of saga instance
//! locks). The store's side of a group is `store::CommitGroup`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::OwnedSemaphorePermit;

use crate::error::Result;
use crate::store::{Begin, CommitGroup};
use crate::transport::Delivery;

use super::handle::process;
use super::receive_loop::ReceiveLoop;

/// Starts `first` and up to `want - 1` more buffered messages (distinct ids) as one
/// commit group, one of the `want` permits each.
pub(super) fn start_group(
    l: &ReceiveLoop,
    first: Delivery,
    mut permit: OwnedSemaphorePermit,
    want: usize,
    buffered: &mut std::collections::VecDeque<Delivery>,
) {
    // A message without an id is never grouped: it is refused, or gets an id, alone.
    let alone = first.message().envelope.message_id.is_empty();
    let mut members = vec![first];
    while !alone && members.len() < want {
        let Some(next) = buffered.front() else { break };
        let id = &next.message().envelope.message_id;
        if id.is_empty() || members.iter().any(|d| &d.message().envelope.message_id == id) {
            break;
        }
        members.extend(buffered.pop_front());
    }
    let group = match &l.shared.store {
        Some(store) if members.len() > 1 => {
            let ids = members
                .iter()
                .map(|d| d.message().envelope.message_id.clone())
                .collect();
            store.commit_group(&l.shared.name, ids)
        }
        _ => None,
    };
    // One permit each; those taken for messages that were not there go back.
    let surplus = permit.num_permits().saturating_sub(members.len());
    if surplus > 0 {
        drop(permit.split(surplus));
    }
    let mut permits: Vec<OwnedSemaphorePermit> = (1..members.len()).filter_map(|_| permit.split(1)).collect();
    permits.push(permit);
    let owner = next_owner();
    for (index, (delivery, own)) in members.into_iter().zip(permits).enumerate() {
        let seat = group.clone().map(|group| GroupSeat {
            group,
            index,
            owner,
            used: false,
        });
        l.handlers.spawn(process(l.shared.clone(), delivery, own, seat));
    }
}

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
    pub(super) async fn begin(mut self, now: chrono::DateTime<chrono::Utc>) -> Result<Begin> {
        let begun = self.group.clone().begin(self.index, now).await;
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
