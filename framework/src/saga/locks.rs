//! The in-process lock of a saga instance ([`InstanceLocks`]): the messages of one
//! instance are handled one after another inside a process, and an owner that would wait
//! in a cycle gets a conflict instead. Split from `runtime.rs`, which takes a lock for each
//! handling.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::endpoint::sagas::LockOwner;
use crate::error::{Error, ErrorKind};

/// Serializes the handling of messages of one saga instance inside this process.
///
/// A lock belongs to an owner: one handling, or one commit group (whose members run one
/// after another in one transaction, so a member may take a lock its group holds). An
/// owner that would wait for an owner that, through others, waits for it gets a
/// `Conflict` at once (the cycle cannot end otherwise); with `bounded` waits, it gets one
/// after [`LOCK_WAIT_LIMIT`] too (a cycle through a database lock no one here sees).
#[derive(Debug, Default)]
pub(super) struct InstanceLocks {
    table: Mutex<LockTable>,
}

#[derive(Debug, Default)]
struct LockTable {
    held: HashMap<String, Held>,
    /// Owner -> the owner it waits for.
    waiting: HashMap<u64, u64>,
}

#[derive(Debug)]
struct Held {
    owner: u64,
    count: usize,
    released: Arc<tokio::sync::Notify>,
}

/// How long a handling of a grouping endpoint waits for an instance lock at most.
const LOCK_WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Takes an owner's entry out of the wait-for table when its wait ends, however it ends.
struct Waiting<'a> {
    locks: &'a InstanceLocks,
    owner: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.locks.table().waiting.remove(&self.owner);
    }
}

impl InstanceLocks {
    fn table(&self) -> std::sync::MutexGuard<'_, LockTable> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) async fn lock(self: &Arc<Self>, correlation: &str, owner: LockOwner) -> Result<InstanceGuard, Error> {
        let guard = || InstanceGuard {
            locks: self.clone(),
            key: correlation.to_owned(),
        };
        let deadline = tokio::time::Instant::now() + LOCK_WAIT_LIMIT;
        let mut waiting = None;
        loop {
            let released = {
                let mut table = self.table();
                let t = &mut *table;
                match t.held.get_mut(correlation) {
                    None => {
                        t.held.insert(
                            correlation.to_owned(),
                            Held {
                                owner: owner.id,
                                count: 1,
                                released: Arc::default(),
                            },
                        );
                        return Ok(guard());
                    }
                    Some(h) if h.owner == owner.id => {
                        h.count += 1;
                        return Ok(guard());
                    }
                    Some(h) => {
                        let mut next = h.owner;
                        let mut steps = 0;
                        while let Some(&after) = t.waiting.get(&next) {
                            if after == owner.id {
                                return Err(lock_cycle(correlation));
                            }
                            next = after;
                            steps += 1;
                            if steps > t.waiting.len() {
                                break;
                            }
                        }
                        t.waiting.insert(owner.id, h.owner);
                        let mut released = Box::pin(h.released.clone().notified_owned());
                        released.as_mut().enable();
                        released
                    }
                }
            };
            // Made once: a second one, dropped, would take the entry out.
            if waiting.is_none() {
                waiting = Some(Waiting {
                    locks: self,
                    owner: owner.id,
                });
            }
            if owner.bounded {
                if tokio::time::timeout_at(deadline, released).await.is_err() {
                    return Err(Error::new(ErrorKind::Conflict {
                        detail: format!(
                            "waited {} s for saga instance {correlation:?}, held by another transaction (a long \
                             one, or one that waits for this one through a database lock); this handling gives \
                             way and is retried",
                            LOCK_WAIT_LIMIT.as_secs()
                        ),
                    }));
                }
            } else {
                released.await;
            }
        }
    }
}

fn lock_cycle(correlation: &str) -> Error {
    Error::new(ErrorKind::Conflict {
        detail: format!(
            "saga instance {correlation:?} is held by another transaction that waits for this one; \
             this handling gives way and is retried"
        ),
    })
}

pub(super) struct InstanceGuard {
    locks: Arc<InstanceLocks>,
    key: String,
}

impl Drop for InstanceGuard {
    fn drop(&mut self) {
        let mut table = self.locks.table();
        if let Some(h) = table.held.get_mut(&self.key) {
            h.count = h.count.saturating_sub(1);
            if h.count == 0
                && let Some(h) = table.held.remove(&self.key)
            {
                h.released.notify_waiters();
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn owner(id: u64) -> LockOwner {
        LockOwner { id, bounded: false }
    }

    #[tokio::test]
    async fn an_owner_takes_its_own_lock_again() {
        let locks = Arc::new(InstanceLocks::default());
        let first = locks.lock("x", owner(1)).await.unwrap();
        let again = locks.lock("x", owner(1)).await.unwrap();
        drop(first);
        // Still held by the second: another owner waits.
        let other = tokio::spawn({
            let locks = locks.clone();
            async move { locks.lock("x", owner(2)).await.map(drop) }
        });
        tokio::task::yield_now().await;
        assert!(!other.is_finished());
        drop(again);
        other.await.unwrap().unwrap();
        assert!(locks.table().held.is_empty());
    }

    #[tokio::test]
    async fn a_wait_that_closes_a_cycle_gives_way() {
        let locks = Arc::new(InstanceLocks::default());
        let x = locks.lock("x", owner(1)).await.unwrap();
        let y = locks.lock("y", owner(2)).await.unwrap();
        // Owner 1 waits for y, held by owner 2 ...
        let one = tokio::spawn({
            let locks = locks.clone();
            async move { locks.lock("y", owner(1)).await.map(drop) }
        });
        while !locks.table().waiting.contains_key(&1) {
            tokio::task::yield_now().await;
        }
        // ... so owner 2 waiting for x, held by owner 1, would never end.
        let err = locks.lock("x", owner(2)).await.err().expect("a conflict");
        assert!(matches!(err.kind(), ErrorKind::Conflict { .. }), "{err}");
        drop(y);
        one.await.unwrap().unwrap();
        drop(x);
        let t = locks.table();
        assert!(t.held.is_empty() && t.waiting.is_empty());
    }

    /// Regression: a waiter woken to find its lock taken by another owner waits again,
    /// and its edge in the wait-for table must survive that (it was dropped, so a cycle
    /// through it went unseen and two groups waited for each other until the limit).
    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_waits_again_keeps_its_edge() {
        let locks = Arc::new(InstanceLocks::default());
        let x = locks.lock("x", owner(1)).await.unwrap();
        let _y = locks.lock("y", owner(2)).await.unwrap();
        let two = tokio::spawn({
            let locks = locks.clone();
            async move { locks.lock("x", owner(2)).await.map(drop) }
        });
        while locks.table().waiting.get(&2) != Some(&1) {
            tokio::task::yield_now().await;
        }
        // Owner 3 takes x before owner 2 runs again: 2 now waits for 3.
        drop(x);
        let _x3 = locks.lock("x", owner(3)).await.unwrap();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(locks.table().waiting.get(&2), Some(&3));
        let closing = tokio::time::timeout(std::time::Duration::from_secs(60), locks.lock("y", owner(3))).await;
        let err = closing
            .expect("seen at once, not waited for")
            .err()
            .expect("a conflict");
        assert!(matches!(err.kind(), ErrorKind::Conflict { .. }), "{err}");
        two.abort();
    }

    #[tokio::test]
    async fn a_dropped_wait_leaves_no_trace() {
        let locks = Arc::new(InstanceLocks::default());
        let x = locks.lock("x", owner(1)).await.unwrap();
        let wait = tokio::spawn({
            let locks = locks.clone();
            async move { locks.lock("x", owner(2)).await.map(drop) }
        });
        while !locks.table().waiting.contains_key(&2) {
            tokio::task::yield_now().await;
        }
        wait.abort();
        let _ = wait.await;
        assert!(locks.table().waiting.is_empty(), "no stale edge to make a false cycle");
        drop(x);
    }

    #[tokio::test(start_paused = true)]
    async fn a_bounded_wait_gives_way_after_the_limit() {
        let locks = Arc::new(InstanceLocks::default());
        let _x = locks.lock("x", owner(1)).await.unwrap();
        let bounded = LockOwner { id: 2, bounded: true };
        let err = locks.lock("x", bounded).await.err().expect("a conflict");
        assert!(matches!(err.kind(), ErrorKind::Conflict { .. }), "{err}");
        assert!(locks.table().waiting.is_empty());
    }
}
