//! Waking waiting receivers: one `LISTEN` connection per transport turns notifications
//! (payload: an entity id) into wake-ups of the receivers of that entity in this process.
//! It is opened when the transport gets its first receiver (`Shared::listen`), not before:
//! a process that only sends reads no notifications.
//! Notifications are a hint only: they are lost while the listener reconnects (then every
//! waiter is woken to look again), and waiters also poll at a bounded interval.
//!
//! Sending them: [`Notifier`]. A send does not notify in its own transaction (except a
//! lone `Sender` send, `send::send_on_pool`). Postgres serialises the commits of notifying
//! transactions (a cluster-wide lock held from just before the commit to its end, WAL
//! flush included), so handlers that each sent a message could no longer share their WAL
//! flushes (docs/measurements-postgres.md, "Notifications after the commit"). Instead
//! the sender hands the entities it sent to, once its transaction committed, to the
//! transport's notifier, which notifies them from a statement of its own, many senders'
//! at once.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::Notify;

use super::rows::CHANNEL;
use crate::error::Result;
use crate::store::db_error;

/// The wake-up of each entity some receiver of this process waited on.
#[derive(Debug, Default)]
pub(crate) struct Wakers {
    entities: Mutex<HashMap<i64, Arc<Notify>>>,
    /// Fired when the `LISTEN` connection was lost: the lock holder's connection most
    /// likely went with it (a restart, backends terminated), so its keeper checks it now
    /// instead of at its next interval (see `holder.rs`).
    pub(crate) holder_check: Notify,
}

impl Wakers {
    /// The wake-up of `entity`.
    pub(crate) fn entity(&self, entity: i64) -> Arc<Notify> {
        self.entities
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(entity)
            .or_default()
            .clone()
    }

    fn wake(&self, entity: i64) {
        let n = self
            .entities
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&entity)
            .cloned();
        if let Some(n) = n {
            n.notify_waiters();
        }
    }

    pub(crate) fn wake_all(&self) {
        let all: Vec<Arc<Notify>> = self
            .entities
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        for n in all {
            n.notify_waiters();
        }
    }
}

/// Starts listening on `pool` (one of its connections, held while the transport lives);
/// returns once `LISTEN` is in place.
pub(crate) async fn listen(pool: &PgPool, wakers: Weak<Wakers>) -> Result<tokio::task::JoinHandle<()>> {
    let mut listener = PgListener::connect_with(pool)
        .await
        .map_err(|e| db_error("cannot open the LISTEN connection", e))?;
    listener
        .listen(CHANNEL)
        .await
        .map_err(|e| db_error("cannot LISTEN for new messages", e))?;
    Ok(tokio::spawn(async move {
        loop {
            let next = listener.try_recv().await;
            let Some(wakers) = wakers.upgrade() else { return };
            match next {
                Ok(Some(n)) => match n.payload().parse::<i64>() {
                    Ok(entity) => wakers.wake(entity),
                    Err(_) => wakers.wake_all(),
                },
                // The connection was lost (and is reopened by the next call): what was
                // notified meanwhile is lost, so everyone looks again.
                Ok(None) => {
                    wakers.holder_check.notify_one();
                    wakers.wake_all();
                }
                Err(e) => {
                    if pool_closed(&e) {
                        return;
                    }
                    let e = crate::store::db_error("the LISTEN connection failed", e);
                    tracing::warn!(error = %e, "the Postgres transport's LISTEN connection failed; retrying");
                    wakers.holder_check.notify_one();
                    wakers.wake_all();
                    drop(wakers);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }))
}

fn pool_closed(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::PoolClosed)
}

/// Notifies waiting receivers (of any process) of the entities senders of this process
/// sent to, after the senders' transactions committed: one statement for whatever was
/// handed over while the last one ran, so that a busy process sends few of them.
///
/// The statement commits asynchronously (`synchronous_commit` off for it alone): a
/// notification is a hint, and waiting for its WAL flush would keep every other notifying
/// transaction of the server waiting too. A notification handed over is sent unless the
/// process stops first (then receivers find the message at their next poll, at most
/// `poll_interval` later); [`PostgresTransport::close`](super::PostgresTransport) sends
/// what is pending before it closes the pool.
#[derive(Debug, Default)]
pub(crate) struct Notifier {
    queue: Arc<NotifyQueue>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug, Default)]
struct NotifyQueue {
    /// Entities (queues, topics) sent to whose notification is not sent yet.
    pending: Mutex<BTreeSet<i64>>,
    kick: tokio::sync::Notify,
}

impl NotifyQueue {
    fn take(&self) -> Vec<i64> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner))
            .into_iter()
            .collect()
    }
}

/// Notifies each entity of `$1` on [`CHANNEL`]: a queue itself, a topic through each of its
/// subscriptions (receivers wait on the subscription), with the statement's commit made
/// asynchronous.
const NOTIFY: &str = "SELECT count(pg_notify('courier_transport', e.id::text)) \
     FROM set_config('synchronous_commit', 'off', true) c, courier.entity e \
     WHERE (e.id = ANY($1) AND e.kind = 0) OR (e.parent = ANY($1) AND e.kind = 2)";

impl Notifier {
    /// Hands `entities`, sent to by a transaction that committed, to the notifier of
    /// `pool`; starts its task at the first call.
    pub(crate) fn after_commit(&self, pool: &PgPool, entities: impl IntoIterator<Item = i64>) {
        let added = {
            let mut pending = self.queue.pending.lock().unwrap_or_else(PoisonError::into_inner);
            let before = pending.len();
            pending.extend(entities);
            pending.len() > before
        };
        if !added {
            return;
        }
        let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if task.is_none() {
            // Outside a runtime (never, for the transport's callers) the receivers' poll
            // finds the messages.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                *task = Some(rt.spawn(run(pool.clone(), self.queue.clone())));
            }
        }
        drop(task);
        self.queue.kick.notify_one();
    }

    /// Sends what is pending now, on `pool` (at close, before the pool closes).
    pub(crate) async fn flush(&self, pool: &PgPool) {
        let entities = self.queue.take();
        if !entities.is_empty()
            && let Err(e) = notify(pool, &entities).await
        {
            tracing::debug!(error = %e, "the last notifications before close were not sent");
        }
    }

    /// Stops the task (what is pending is dropped: see [`Self::flush`]).
    pub(crate) fn stop(&self) {
        if let Some(task) = self.task.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
    }
}

async fn notify(pool: &PgPool, entities: &[i64]) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(NOTIFY).bind(entities).execute(pool).await.map(|_| ())
}

/// The notifier's task: one statement at a time, for everything handed over meanwhile.
async fn run(pool: PgPool, queue: Arc<NotifyQueue>) {
    loop {
        queue.kick.notified().await;
        let entities = queue.take();
        if entities.is_empty() {
            continue;
        }
        if let Err(e) = notify(&pool, &entities).await {
            if pool_closed(&e) {
                return;
            }
            let e = db_error("cannot notify receivers of new messages", e);
            tracing::warn!(
                error = %e,
                "the Postgres transport could not notify receivers of new messages; they find them at their \
                 next poll; retrying in a second"
            );
            queue
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(entities);
            tokio::time::sleep(Duration::from_secs(1)).await;
            queue.kick.notify_one();
        }
    }
}
