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
/// handed over while the last one ran, and at most one statement per `interval`
/// (`PgTransportBuilder::notify_interval`), so that a busy process sends few of them.
/// The first hand-over after a quiet interval is notified at once; one during the
/// interval waits for its end, with everything else handed over meanwhile.
///
/// The statement commits asynchronously (`synchronous_commit` off for it alone): a
/// notification is a hint, and waiting for its WAL flush would keep every other notifying
/// transaction of the server waiting too. A notification handed over is sent unless the
/// process stops first (then receivers find the message at their next poll, at most
/// `poll_interval` later); [`PostgresTransport::close`](super::PostgresTransport) sends
/// what is pending before it closes the pool.
#[derive(Debug)]
pub(crate) struct Notifier {
    queue: Arc<NotifyQueue>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    interval: Duration,
}

#[derive(Debug, Default)]
struct NotifyQueue {
    /// Entities (queues, topics) sent to whose notification is not sent yet.
    pending: Mutex<BTreeSet<i64>>,
    kick: tokio::sync::Notify,
}

impl NotifyQueue {
    /// Adds `entities` to what is pending and kicks the task; false when every one of them
    /// was pending already (the kick is not needed).
    fn hand_over(&self, entities: impl IntoIterator<Item = i64>) -> bool {
        let added = {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            let before = pending.len();
            pending.extend(entities);
            pending.len() > before
        };
        if added {
            self.kick.notify_one();
        }
        added
    }

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
    /// A notifier sending at most one statement per `interval`.
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            queue: Arc::default(),
            task: Mutex::new(None),
            interval,
        }
    }

    /// Hands `entities`, sent to by a transaction that committed, to the notifier of
    /// `pool`; starts its task at the first call.
    pub(crate) fn after_commit(&self, pool: &PgPool, entities: impl IntoIterator<Item = i64>) {
        if !self.queue.hand_over(entities) {
            return;
        }
        let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if task.is_none() {
            // Outside a runtime (never, for the transport's callers) the receivers' poll
            // finds the messages.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let pool = pool.clone();
                let send = move |entities: Vec<i64>| {
                    let pool = pool.clone();
                    async move { notify(&pool, &entities).await }
                };
                *task = Some(rt.spawn(run(send, self.queue.clone(), self.interval)));
            }
        }
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

/// The notifier's task: one statement (`send`) at a time, for everything handed over
/// meanwhile, the next one no sooner than `interval` after the start of the last.
async fn run<F, Fut>(send: F, queue: Arc<NotifyQueue>, interval: Duration)
where
    F: Fn(Vec<i64>) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<(), sqlx::Error>>,
{
    loop {
        queue.kick.notified().await;
        let entities = queue.take();
        if entities.is_empty() {
            continue;
        }
        let started = tokio::time::Instant::now();
        if let Err(e) = send(entities.clone()).await {
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
            continue;
        }
        // What was handed over meanwhile kept its kick (a stored permit): it goes at the
        // end of the interval, in one statement.
        tokio::time::sleep_until(started + interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Log = Arc<Mutex<Vec<(Duration, Vec<i64>)>>>;

    /// Runs the notifier's task over a `send` that logs when it ran and with what, failing
    /// its first `failures` calls.
    fn notifier(interval: Duration, failures: usize) -> (Arc<NotifyQueue>, Log) {
        let queue = Arc::new(NotifyQueue::default());
        let log: Log = Arc::default();
        let start = tokio::time::Instant::now();
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let sent = log.clone();
        let send = move |entities: Vec<i64>| {
            let sent = sent.clone();
            let call = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                sent.lock().unwrap().push((start.elapsed(), entities));
                if call < failures {
                    Err(sqlx::Error::Protocol("the server went away".into()))
                } else {
                    Ok(())
                }
            }
        };
        tokio::spawn(run(send, queue.clone(), interval));
        (queue, log)
    }

    /// Lets `ms` milliseconds pass (tokio's timer counts whole milliseconds).
    async fn after_ms(ms: u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_one_statement_per_interval_and_the_first_after_a_quiet_one_at_once() {
        let (queue, log) = notifier(ms(4), 0);
        queue.hand_over([1]);
        after_ms(1).await;
        queue.hand_over([2]);
        after_ms(1).await;
        queue.hand_over([3, 2]);
        after_ms(3).await;
        queue.hand_over([4]);
        after_ms(25).await;
        queue.hand_over([5]);
        after_ms(10).await;
        assert_eq!(
            *log.lock().unwrap(),
            vec![
                (ms(0), vec![1]),
                (ms(4), vec![2, 3]),
                (ms(8), vec![4]),
                (ms(30), vec![5])
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_interval_sends_each_hand_over_at_once() {
        let (queue, log) = notifier(Duration::ZERO, 0);
        queue.hand_over([7]);
        after_ms(1).await;
        queue.hand_over([8]);
        after_ms(1).await;
        assert_eq!(*log.lock().unwrap(), vec![(ms(0), vec![7]), (ms(1), vec![8])]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_statement_is_tried_again_a_second_later_with_what_came_meanwhile() {
        let (queue, log) = notifier(Duration::from_millis(2), 1);
        queue.hand_over([1]);
        after_ms(100).await;
        queue.hand_over([2]);
        after_ms(2000).await;
        assert_eq!(
            *log.lock().unwrap(),
            vec![(Duration::ZERO, vec![1]), (Duration::from_secs(1), vec![1, 2])]
        );
    }
}
