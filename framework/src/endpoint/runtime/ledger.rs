//! Which outbox rows this process has taken to dispatch, so that no row is sent twice by
//! the paths that can find it: the handler that stored it, a redelivery that finds its
//! message in the inbox, and the sweeper of rows left behind.
//!
//! A row is *taken* before it is sent and stays taken until the cleaner has deleted it
//! (or its dispatch failed, which gives it back). The paths that read rows from the store
//! (a redelivery, the sweeper) read first and take afterwards, so a row can be read just
//! before the cleaner deletes it and be taken just after: to close that window, every
//! read holds a [`Read`] ticket from before its query, and the ids deleted while a ticket
//! older than the deletion is out are kept as tombstones that [`Ledger::take_read`]
//! refuses. Tombstones go as soon as no older ticket is out, so they stay few under a
//! steady load.
//!
//! This guards one process. Two processes of an endpoint sweeping the same outbox can
//! still both send a row left behind; the copies keep the row's message id and the
//! receivers' inboxes drop the second (see docs/architecture.md).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The outbox rows taken by this process; see the module docs.
#[derive(Default)]
pub(super) struct Ledger {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Rows being dispatched, or dispatched and waiting to be deleted.
    taken: HashSet<i64>,
    /// Rows dispatched, waiting for the cleaner (a subset of `taken`), in order.
    sent: Vec<i64>,
    /// Counts deletions: a ticket and a tombstone carry the generation they saw.
    generation: u64,
    /// Tickets out, by the generation they were issued at.
    reads: BTreeMap<u64, usize>,
    /// Rows deleted while an older ticket was out, with the generation of the deletion.
    tombstones: HashMap<i64, u64>,
}

/// Held from before a read of outbox rows until they are taken (or dropped).
pub(super) struct Read<'a> {
    ledger: &'a Ledger,
    generation: u64,
}

impl Drop for Read<'_> {
    fn drop(&mut self) {
        let mut inner = self.ledger.lock();
        if let Some(n) = inner.reads.get_mut(&self.generation) {
            *n -= 1;
            if *n == 0 {
                inner.reads.remove(&self.generation);
            }
        }
        inner.prune();
    }
}

impl Inner {
    /// Drops the tombstones no ticket out can need: those of deletions no older than the
    /// oldest ticket (its read began after they committed).
    fn prune(&mut self) {
        match self.reads.keys().next().copied() {
            None => self.tombstones.clear(),
            Some(oldest) => self.tombstones.retain(|_, deleted| *deleted > oldest),
        }
    }

    fn take(&mut self, ids: impl IntoIterator<Item = i64>, since: Option<u64>) -> HashSet<i64> {
        let mut won = HashSet::new();
        for id in ids {
            let deleted_since_read = since.is_some_and(|g| self.tombstones.get(&id).is_some_and(|d| *d > g));
            if !deleted_since_read && self.taken.insert(id) {
                won.insert(id);
            }
        }
        won
    }
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A ticket for a read of outbox rows about to begin.
    pub(super) fn read(&self) -> Read<'_> {
        let mut inner = self.lock();
        let generation = inner.generation;
        *inner.reads.entry(generation).or_insert(0) += 1;
        Read {
            ledger: self,
            generation,
        }
    }

    /// Takes the rows `read` found that nobody in this process has taken and the cleaner
    /// has not deleted since the read began; returns those, in their order.
    pub(super) fn take_read<T>(&self, read: Read<'_>, rows: Vec<T>, id: impl Fn(&T) -> i64) -> Vec<T> {
        let won = self.lock().take(rows.iter().map(&id), Some(read.generation));
        drop(read);
        rows.into_iter().filter(|r| won.contains(&id(r))).collect()
    }

    /// Takes rows just stored by a handling (no read from the store came first); returns
    /// those nobody took meanwhile (a sweeper can, when the clock jumped).
    pub(super) fn take_stored<T>(&self, rows: Vec<T>, id: impl Fn(&T) -> i64) -> Vec<T> {
        let won = self.lock().take(rows.iter().map(&id), None);
        rows.into_iter().filter(|r| won.contains(&id(r))).collect()
    }

    /// Notes taken rows as dispatched; returns how many wait for the cleaner.
    pub(super) fn sent(&self, ids: impl IntoIterator<Item = i64>) -> usize {
        let mut inner = self.lock();
        inner.sent.extend(ids);
        inner.sent.len()
    }

    /// Gives back those of `ids` that were taken and not dispatched (their dispatch
    /// failed, or they were moved to the outbox's dead letters): a redelivery or the
    /// sweeper takes them again if they are still in the outbox.
    pub(super) fn give_back_unsent(&self, ids: &[i64]) {
        let mut inner = self.lock();
        let sent: HashSet<i64> = inner.sent.iter().copied().collect();
        for id in ids {
            if !sent.contains(id) {
                inner.taken.remove(id);
            }
        }
    }

    /// At most `limit` dispatched rows for the cleaner to delete, oldest first.
    pub(super) fn to_delete(&self, limit: usize) -> Vec<i64> {
        self.lock().sent.iter().take(limit).copied().collect()
    }

    /// The cleaner deleted `ids` (the deletion committed): they are no longer taken, and
    /// a read that began before is refused them.
    pub(super) fn deleted(&self, ids: &[i64]) {
        let mut inner = self.lock();
        inner.generation += 1;
        let generation = inner.generation;
        let done: HashSet<i64> = ids.iter().copied().collect();
        inner.sent.retain(|id| !done.contains(id));
        let reading = !inner.reads.is_empty();
        for id in ids {
            inner.taken.remove(id);
            if reading {
                inner.tombstones.insert(*id, generation);
            }
        }
    }

    /// Rows waiting for the cleaner.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.lock().sent.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: &i64) -> i64 {
        *n
    }

    /// The race that dispatched every row of a commit group twice (CI, crash test): the
    /// sweeper read rows, the cleaner deleted them (they had been dispatched by a
    /// redelivery), then the sweeper took them as nobody's.
    #[test]
    fn a_row_deleted_during_a_read_is_not_taken_by_it() {
        let ledger = Ledger::default();
        assert_eq!(ledger.take_stored(vec![1, 2], id), vec![1, 2]);
        ledger.sent([1, 2]);
        let read = ledger.read();
        // The read returns rows 1 and 2 (not yet deleted); then the cleaner deletes them.
        let batch = ledger.to_delete(10);
        ledger.deleted(&batch);
        assert!(ledger.take_read(read, vec![1, 2], id).is_empty());
        assert_eq!(ledger.lock().tombstones.len(), 0, "no read out: no tombstone kept");
    }

    #[test]
    fn a_row_taken_is_not_taken_again_until_given_back() {
        let ledger = Ledger::default();
        assert_eq!(ledger.take_stored(vec![1, 2], id), vec![1, 2]);
        let read = ledger.read();
        assert_eq!(ledger.take_read(read, vec![1, 2, 3], id), vec![3]);
        ledger.sent([1]);
        ledger.give_back_unsent(&[1, 2]);
        let read = ledger.read();
        assert_eq!(ledger.take_read(read, vec![1, 2], id), vec![2]);
    }

    #[test]
    fn a_read_that_begins_after_a_deletion_may_take_the_id() {
        let ledger = Ledger::default();
        let early = ledger.read();
        ledger.take_stored(vec![5], id);
        ledger.sent([5]);
        ledger.deleted(&[5]);
        // A read begun after the deletion committed cannot find row 5; an id is never
        // reused by the store, but the ledger does not refuse what it need not.
        let late = ledger.read();
        assert!(ledger.take_read(early, vec![5], id).is_empty());
        assert_eq!(ledger.take_read(late, vec![5], id), vec![5]);
        assert_eq!(ledger.lock().tombstones.len(), 0);
    }

    #[test]
    fn tombstones_go_once_older_reads_end_under_a_steady_load() {
        let ledger = Ledger::default();
        let mut open = ledger.read();
        for n in 0..100 {
            ledger.take_stored(vec![n], id);
            ledger.sent([n]);
            ledger.deleted(&[n]);
            // Reads overlap: a new one begins before the previous one ends.
            let next = ledger.read();
            drop(open);
            open = next;
            assert!(ledger.lock().tombstones.len() <= 1);
        }
        drop(open);
        assert_eq!(ledger.waiting(), 0);
        assert!(ledger.lock().tombstones.is_empty());
        assert!(ledger.lock().reads.is_empty());
    }
}
