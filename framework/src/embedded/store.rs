//! The store that lives in the embedded broker's own database: one SQLite transaction
//! settles the received message, records it in the inbox, holds the handler's writes and
//! enqueues the messages it sent.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;
use tokio::sync::oneshot;

use super::Embedded;
use super::engine::{Command, Finish, Lease, read_token};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, LockToken};
use crate::store::sqlite::{
    dead_letter_outbox_row, delete_inbox, delete_outbox, endpoint_secret, insert_outbox, left_over,
    outbox_dead_letters, outbox_older_than, record_batch, record_inbox,
};
use crate::store::{
    Begin, BeginBatch, Committed, DueTimeouts, EndpointSecret, OutboxDeadLetter, OutboxMessage, Store, StoredSaga,
    TimeoutClaim, UnitOfWorkScope, db_error, sqlite_saga,
};

/// An endpoint store in the embedded broker's database: `Embedded::store()`.
///
/// With the embedded broker as the endpoint's transport, the handling of a message is ONE
/// SQLite transaction: the inbox record, the handler's writes
/// ([`Context::transaction`](crate::Context::transaction) gives `sqlx::SqliteConnection`),
/// the messages it sent (enqueued directly, no outbox) and the completion of the received
/// message commit together or not at all. There is nothing to dispatch afterwards and no
/// window in which a completed message's effects are missing or a committed message is
/// still in its queue.
///
/// The price is SQLite's single writer: while a handler runs inside its transaction the
/// broker serves nothing else (sends, receives, lock renewals of other messages wait), so
/// handlers on this store should be short. With another transport the store works like
/// [`SqliteStore`](crate::SqliteStore): the outbox is dispatched after the commit.
///
/// The application's own tables can live in the same file: their migrations are applied
/// when the broker opens ([`EmbeddedBuilder::migrations`](crate::EmbeddedBuilder::migrations)),
/// handlers write them through `ctx.transaction::<courier::sqlx::Sqlite>()`, and
/// [`Embedded::read_pool`] reads them from outside handlers. Writes go through handlers
/// only: the engine is the file's single writer.
#[derive(Debug, Clone)]
pub struct EmbeddedStore {
    broker: Embedded,
}

impl Embedded {
    /// A store in this broker's database (see [`EmbeddedStore`]); its tables were created
    /// when the broker opened.
    pub fn store(&self) -> EmbeddedStore {
        EmbeddedStore { broker: self.clone() }
    }
}

impl EmbeddedStore {
    /// A saga instance as stored (for `courier::testing`).
    pub(crate) async fn saga_state(&self, saga_type: &str, correlation: &str) -> Result<Option<StoredSaga>> {
        let mut lease = self.lease().await?;
        sqlite_saga::load(conn(&mut lease)?, saga_type, correlation).await
    }

    async fn lease(&self) -> Result<Lease> {
        self.broker.lease().await
    }
}

impl Embedded {
    /// The engine's connection, lent until the lease is given back or dropped (the
    /// engine serves nothing else meanwhile: keep it short).
    pub(super) async fn lease(&self) -> Result<Lease> {
        self.shared.check_open()?;
        let (reply, rx) = oneshot::channel();
        self.shared
            .tx
            .send(Command::Lend { reply })
            .await
            .map_err(|_| Error::new(ErrorKind::Closed))?;
        rx.await.map_err(|_| Error::new(ErrorKind::Closed))?
    }
}

fn conn(lease: &mut Lease) -> Result<&mut SqliteConnection> {
    lease.conn().ok_or_else(|| Error::new(ErrorKind::Closed))
}

/// `work` in a write transaction of the lent connection: committed if it succeeds, rolled
/// back if not (dropping the lease before the COMMIT rolls it back too).
async fn in_transaction<T>(
    lease: &mut Lease,
    what: &'static str,
    work: impl AsyncFnOnce(&mut SqliteConnection) -> Result<T>,
) -> Result<T> {
    sqlx::query("BEGIN IMMEDIATE")
        .execute(conn(lease)?)
        .await
        .map_err(|e| db_error(what, e))?;
    match work(conn(lease)?).await {
        Ok(out) => {
            sqlx::query("COMMIT")
                .execute(conn(lease)?)
                .await
                .map_err(|e| db_error(what, e))?;
            Ok(out)
        }
        Err(e) => {
            let _ = sqlx::query("ROLLBACK").execute(conn(lease)?).await;
            Err(e)
        }
    }
}

struct EmbeddedWork {
    lease: Lease,
    endpoint: String,
    source_id: String,
    /// `(entity, row id, delivery count)` of the received messages this broker
    /// delivered (one; a batch's several): completed in the transaction.
    locks: Vec<(i64, i64, i64)>,
    /// Messages to enqueue at commit (when the lock is ours).
    staged: Vec<(String, bool, Envelope)>,
    max_message_size: usize,
    /// History events, written with the `COMMIT` (one trip to the file's thread, not two).
    history: Vec<crate::store::sqlite_history::Rendered>,
}

crate::store::sqlite_saga::sqlite_unit_of_work!(EmbeddedWork, {
    fn transaction(&mut self) -> Option<&mut (dyn std::any::Any + Send)> {
        self.lease.conn().map(|c| c as &mut (dyn std::any::Any + Send))
    }

    async fn store_outgoing(
        &mut self,
        messages: Vec<(String, bool, Envelope)>,
        now: DateTime<Utc>,
    ) -> Result<Vec<OutboxMessage>> {
        if !self.locks.is_empty() {
            self.staged.extend(messages);
            return Ok(Vec::new());
        }
        insert_outbox(conn(&mut self.lease)?, &self.endpoint, &self.source_id, messages, now).await
    }

    /// Kept for the commit, which writes it with the `COMMIT`.
    async fn record_history(&mut self, event: &crate::store::history::HistoryEvent) -> Result<()> {
        self.history.push(crate::store::sqlite_history::Rendered::new(event)?);
        Ok(())
    }

    async fn commit(self: Box<Self>) -> Result<Committed> {
        let EmbeddedWork {
            lease,
            locks,
            staged,
            max_message_size,
            history,
            ..
        } = *self;
        let settled = !locks.is_empty();
        let mut sends: Vec<(String, bool, Vec<Envelope>)> = Vec::new();
        for (destination, is_topic, envelope) in staged {
            match sends.iter_mut().find(|(d, t, _)| *d == destination && *t == is_topic) {
                Some((_, _, group)) => group.push(envelope),
                None => sends.push((destination, is_topic, vec![envelope])),
            }
        }
        let (reply, rx) = oneshot::channel();
        lease.give_back(Some(Finish {
            complete: locks,
            sends,
            put_back: None,
            max_message_size,
            history,
            reply,
        }));
        rx.await.map_err(|_| Error::new(ErrorKind::Closed))??;
        Ok(if settled {
            Committed::Settled
        } else {
            Committed::Pending
        })
    }
});

impl EmbeddedWork {
    fn sqlite_conn(&mut self) -> Result<&mut SqliteConnection> {
        conn(&mut self.lease)
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    fn name(&self) -> &'static str {
        "embedded"
    }

    /// Nothing to do: the broker applied Courier's SQLite migrations when it opened.
    async fn migrate(&self) -> Result<()> {
        Ok(())
    }

    /// Everything but delayed retries is one transaction of the broker's file when the
    /// endpoint receives from this broker (its deliveries' lock tokens carry its epoch).
    fn unit_of_work_scope(&self, transport: &dyn crate::transport::Transport) -> UnitOfWorkScope {
        match transport.as_any().and_then(|t| t.downcast_ref::<Embedded>()) {
            Some(broker) if broker.shared.epoch == self.broker.shared.epoch => UnitOfWorkScope::AllButDelayedRetries,
            _ => UnitOfWorkScope::Outbox,
        }
    }

    async fn begin(
        &self,
        endpoint: &str,
        message_id: &str,
        lock: Option<LockToken>,
        now: DateTime<Utc>,
    ) -> Result<Begin> {
        let mut lease = self.lease().await?;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(conn(&mut lease)?)
            .await
            .map_err(|e| db_error("cannot begin the handler's transaction", e))?;
        if record_inbox(conn(&mut lease)?, endpoint, message_id, now).await? {
            return Ok(Begin::Fresh(Box::new(EmbeddedWork {
                locks: lock
                    .and_then(|t| read_token(self.broker.shared.epoch, t))
                    .into_iter()
                    .collect(),
                lease,
                endpoint: endpoint.to_owned(),
                source_id: message_id.to_owned(),
                staged: Vec::new(),
                max_message_size: self.broker.shared.max_message_size,
                history: Vec::new(),
            })));
        }
        let left = left_over(conn(&mut lease)?, endpoint, message_id).await?;
        // Dropping the lease rolls the transaction back.
        drop(lease);
        Ok(Begin::Duplicate(left))
    }

    /// One transaction of the broker's file: the batch's inbox records, the handler's
    /// writes, what it sent and the completion of every fresh member this broker
    /// delivered.
    async fn begin_batch(
        &self,
        endpoint: &str,
        members: Vec<(String, Option<LockToken>)>,
        now: DateTime<Utc>,
    ) -> Result<BeginBatch> {
        if members.is_empty() {
            return Ok(BeginBatch::empty());
        }
        let ids: Vec<String> = members.iter().map(|(id, _)| id.clone()).collect();
        let mut lease = self.lease().await?;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(conn(&mut lease)?)
            .await
            .map_err(|e| db_error("cannot begin the batch's transaction", e))?;
        let duplicates = record_batch(conn(&mut lease)?, endpoint, &ids, now).await?;
        let Some(first) = BeginBatch::first_fresh(&ids, &duplicates) else {
            // Dropping the lease rolls the transaction back.
            drop(lease);
            return Ok(BeginBatch { work: None, duplicates });
        };
        let epoch = self.broker.shared.epoch;
        let locks = members
            .into_iter()
            .zip(&duplicates)
            .filter(|(_, d)| d.is_none())
            .filter_map(|((_, lock), _)| lock.and_then(|t| read_token(epoch, t)))
            .collect();
        let work = EmbeddedWork {
            locks,
            lease,
            endpoint: endpoint.to_owned(),
            source_id: first,
            staged: Vec::new(),
            max_message_size: self.broker.shared.max_message_size,
            history: Vec::new(),
        };
        Ok(BeginBatch {
            work: Some(Box::new(work)),
            duplicates,
        })
    }

    async fn mark_dispatched(&self, ids: &[i64]) -> Result<()> {
        let mut lease = self.lease().await?;
        delete_outbox(conn(&mut lease)?, ids).await
    }

    async fn undispatched(&self, endpoint: &str, older_than: DateTime<Utc>, limit: i64) -> Result<Vec<OutboxMessage>> {
        let mut lease = self.lease().await?;
        outbox_older_than(conn(&mut lease)?, endpoint, older_than, limit).await
    }

    async fn backlog(&self, endpoint: &str) -> Result<Option<crate::store::StoreBacklog>> {
        let mut lease = self.lease().await?;
        crate::store::sqlite::count_backlog(conn(&mut lease)?, endpoint)
            .await
            .map(Some)
    }

    async fn purge_inbox(&self, endpoint: &str, before: DateTime<Utc>, limit: i64) -> Result<u64> {
        let mut lease = self.lease().await?;
        delete_inbox(conn(&mut lease)?, endpoint, before, limit).await
    }

    /// Claims the due timeouts and enqueues their messages in the endpoint's queue in
    /// ONE transaction of the broker's database: nothing is left to send.
    async fn claim_due_timeouts(&self, endpoint: &str, claim: TimeoutClaim) -> Result<DueTimeouts> {
        let mut lease = self.lease().await?;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(conn(&mut lease)?)
            .await
            .map_err(|e| db_error("cannot begin claiming timeouts", e))?;
        // Enqueued in this transaction: nothing to confirm, the rows are marked `now`.
        let crate::store::Claimed {
            due,
            dead_lettered,
            taken,
        } = sqlite_saga::claim_due(conn(&mut lease)?, endpoint, claim, claim.now).await?;
        // Written with the COMMIT.
        let history = if claim.history {
            taken
                .iter()
                .map(|t| {
                    crate::store::sqlite_history::Rendered::new(&crate::store::history::timeout_event(
                        endpoint, t, claim.now,
                    ))
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let claimed = due.len();
        let (reply, rx) = oneshot::channel();
        lease.give_back(Some(Finish {
            complete: Vec::new(),
            sends: if due.is_empty() {
                Vec::new()
            } else {
                vec![(endpoint.to_owned(), false, due)]
            },
            put_back: None,
            max_message_size: self.broker.shared.max_message_size,
            history,
            reply,
        }));
        rx.await.map_err(|_| Error::new(ErrorKind::Closed))??;
        Ok(DueTimeouts {
            claimed,
            to_send: Vec::new(),
            dead_lettered,
            recorded: claim.history,
            taken,
        })
    }

    async fn next_timeout_due(&self, endpoint: &str) -> Result<Option<DateTime<Utc>>> {
        let mut lease = self.lease().await?;
        sqlite_saga::next_due(conn(&mut lease)?, endpoint).await
    }

    async fn unclaim_timeouts(&self, ids: &[String]) -> Result<()> {
        let mut lease = self.lease().await?;
        sqlite_saga::unclaim(conn(&mut lease)?, ids).await
    }

    async fn dead_letter_timeout(&self, endpoint: &str, id: &str, reason: &str, now: DateTime<Utc>) -> Result<bool> {
        let mut lease = self.lease().await?;
        sqlite_saga::dead_letter(conn(&mut lease)?, endpoint, id, reason, now).await
    }

    async fn postpone_timeout_reclaim(&self, endpoint: &str, id: &str, until: DateTime<Utc>) -> Result<()> {
        let mut lease = self.lease().await?;
        sqlite_saga::postpone_reclaim(conn(&mut lease)?, endpoint, id, until).await
    }

    async fn dead_letter_outbox(&self, id: i64, reason: &str, description: &str, now: DateTime<Utc>) -> Result<bool> {
        let mut lease = self.lease().await?;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(conn(&mut lease)?)
            .await
            .map_err(|e| db_error("cannot begin moving an outbox message to the dead letters", e))?;
        // Dropping the lease before the COMMIT rolls the transaction back.
        let moved = dead_letter_outbox_row(conn(&mut lease)?, id, reason, description, now).await?;
        sqlx::query("COMMIT")
            .execute(conn(&mut lease)?)
            .await
            .map_err(|e| db_error("cannot move an outbox message to the dead letters", e))?;
        Ok(moved)
    }

    async fn dead_lettered_outbox(&self, endpoint: &str, limit: i64) -> Result<Vec<OutboxDeadLetter>> {
        let mut lease = self.lease().await?;
        outbox_dead_letters(conn(&mut lease)?, endpoint, limit).await
    }

    fn keeps_history(&self) -> bool {
        true
    }

    async fn record_history(&self, event: &crate::store::history::HistoryEvent) -> Result<()> {
        let mut lease = self.lease().await?;
        let due = in_transaction(&mut lease, "recording the history of a message", async |c| {
            crate::store::sqlite_history::record(c, event).await
        })
        .await?;
        if due {
            crate::store::sqlite_history::move_recent(conn(&mut lease)?).await;
        }
        Ok(())
    }

    async fn purge_history(&self, endpoint: &str, before: DateTime<Utc>, limit: i64) -> Result<u64> {
        let mut lease = self.lease().await?;
        in_transaction(&mut lease, "purging the history", async |c| {
            crate::store::sqlite_history::purge(c, endpoint, before, limit).await
        })
        .await
    }

    /// In the broker's own file, as [`SqliteStore`](crate::SqliteStore) keeps it.
    async fn endpoint_secret(&self, endpoint: &str, now: DateTime<Utc>) -> Result<Option<EndpointSecret>> {
        let mut lease = self.lease().await?;
        endpoint_secret(conn(&mut lease)?, endpoint, now).await.map(Some)
    }
}
