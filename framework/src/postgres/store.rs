//! The store on the transport's own database: `PostgresTransport::store()`. For a message
//! this transport delivered, ONE Postgres transaction records the inbox, holds the
//! handler's writes and the saga state, inserts the messages the handler sent straight
//! into their queues (no outbox) and completes the received message, fenced by its lock
//! token. Everything else (messages of other transports, timeouts, the inbox purge) is
//! the [`PostgresStore`]'s on the same pool.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgTransactionManager;
use sqlx::{AssertSqlSafe, PgConnection, Postgres, SqlSafeStr};
use sqlx_core::transaction::TransactionManager;

use super::PostgresTransport;
pub(crate) use super::rows::Lock;
use super::rows::read_token;
use super::send::insert_messages;
use crate::checks::check_envelope;
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, LockToken};
use crate::store::pg_group::{PgGroup, poisoned_if_aborted};
use crate::store::pg_saga::pg_unit_of_work;
use crate::store::postgres::{OutboxRow, claim_due, ensure_not_aborted, insert_outbox, outbox_of, postpone_reclaim};
use crate::store::{
    Begin, CommitGroup, Committed, DueTimeouts, OutboxDeadLetter, OutboxMessage, PostgresStore, Store, StoreBacklog,
    TimeoutClaim, UnitOfWorkScope, db_error,
};
use crate::transport::Transport;

/// An endpoint store in the Postgres transport's database (see
/// [`PostgresTransport::store`]).
///
/// With this transport as the endpoint's transport, the handling of a message is one
/// transaction: the inbox record, the handler's writes
/// ([`Context::transaction`](crate::Context::transaction) gives `sqlx::PgConnection`),
/// saga state and timeouts, the messages it sent (inserted into their queues, receivable
/// when the transaction commits) and the completion of the received message commit
/// together or not at all. The completion is fenced by the lock token: if the lock was
/// lost meanwhile (another process has the message), the transaction rolls back and the
/// endpoint is told `LockLost`. Messages received from another transport go through the
/// outbox, as with [`PostgresStore`].
#[derive(Debug, Clone)]
pub struct PgTransportStore {
    transport: PostgresTransport,
    inner: PostgresStore,
}

impl PostgresTransport {
    /// A store in this transport's database, on its pool (see [`PgTransportStore`]).
    /// Apply the migrations first (the transport's `open` does by default).
    pub fn store(&self) -> PgTransportStore {
        PgTransportStore {
            transport: self.clone(),
            inner: PostgresStore::from_pool(self.shared.pool.clone()),
        }
    }
}

/// A handling's transaction on a connection of the pool, opened by `begin`. Dropped while
/// open (a handler failed, or the handling was dropped), it is rolled back: the
/// `ROLLBACK` is sent with the connection's next use, its return to the pool.
struct TxWork {
    conn: PoolConnection<Postgres>,
    /// Whether the transaction is open (sqlx counts it in the connection's depth, so a
    /// handler's own `begin` on it is a savepoint).
    open: bool,
    transport: PostgresTransport,
    endpoint: String,
    source_id: String,
    /// The received message's lock, when this transport delivered it: completed in the
    /// transaction.
    lock: Option<Lock>,
    /// Messages to insert at commit (when the lock is ours).
    staged: Vec<(String, bool, Envelope)>,
    checked: bool,
}

impl TxWork {
    fn pg_conn(&mut self) -> Result<&mut PgConnection> {
        Ok(&mut self.conn)
    }
}

impl Drop for TxWork {
    fn drop(&mut self) {
        if self.open {
            PgTransactionManager::start_rollback(&mut self.conn);
        }
    }
}

/// Inserts `messages` for the queue or topic `destination`, checked as a send would be.
async fn send_in(
    conn: &mut PgConnection,
    transport: &PostgresTransport,
    destination: &str,
    is_topic: bool,
    messages: &[Envelope],
    now: DateTime<Utc>,
) -> Result<()> {
    let found: Option<(i64, bool)> =
        sqlx::query_as("SELECT id, requires_session FROM courier.entity WHERE parent = 0 AND name = $1 AND kind = $2")
            .bind(destination)
            .bind(if is_topic { 1_i16 } else { 0 })
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| db_error("cannot look up a destination", e))?;
    let Some((entity, requires_session)) = found else {
        return Err(Error::new(ErrorKind::EntityNotFound {
            path: destination.to_owned(),
        }));
    };
    for m in messages {
        check_envelope(transport.shared.max_message_size, m, destination, requires_session, now)?;
    }
    insert_messages(conn, entity, messages, now).await?.ok_or_else(|| {
        Error::new(ErrorKind::EntityNotFound {
            path: destination.to_owned(),
        })
    })?;
    Ok(())
}

/// The lock of a delivery of `transport`'s database (`None`: a delivery of another
/// transport, or none): the one its store completes in the handling's transaction.
pub(crate) fn own_lock(transport: &PostgresTransport, token: Option<LockToken>) -> Option<Lock> {
    token.and_then(|t| read_token(transport.shared.tag, t))
}

/// The end of a handling of a message `transport` delivered, on the handling's
/// transaction `conn`: inserts the messages the handlers sent (`staged`: destination,
/// whether a topic, message) into their queues and subscriptions, then deletes the
/// received message if `lock` is still its lock and unexpired (the fence).
///
/// # Errors
/// [`ErrorKind::LockLost`] when the lock is not the message's any more (nothing may
/// commit: the caller rolls back); a destination missing or refusing a message; a
/// storage error.
pub(crate) async fn send_and_complete(
    conn: &mut PgConnection,
    transport: &PostgresTransport,
    lock: Lock,
    staged: Vec<(String, bool, Envelope)>,
) -> Result<()> {
    send_staged(&mut *conn, transport, staged).await?;
    complete_in(conn, lock, transport.shared.clock.now()).await
}

/// Inserts the messages a handling sent (`staged`: destination, whether a topic, message)
/// into their queues and subscriptions, on the handling's transaction `conn`, one
/// statement per destination.
///
/// # Errors
/// A destination missing or refusing a message; a storage error.
async fn send_staged(
    conn: &mut PgConnection,
    transport: &PostgresTransport,
    staged: Vec<(String, bool, Envelope)>,
) -> Result<()> {
    let now = transport.shared.clock.now();
    let mut groups: Vec<(String, bool, Vec<Envelope>)> = Vec::new();
    for (destination, is_topic, envelope) in staged {
        match groups.iter_mut().find(|(d, t, _)| *d == destination && *t == is_topic) {
            Some((_, _, group)) => group.push(envelope),
            None => groups.push((destination, is_topic, vec![envelope])),
        }
    }
    for (destination, is_topic, messages) in &groups {
        send_in(&mut *conn, transport, destination, *is_topic, messages, now).await?;
    }
    Ok(())
}

/// SQLSTATE of `courier.complete_fenced` when the lock is not the message's any more.
const LOCK_LOST: &str = "CL001";

/// Completes the received message if `lock` is still its lock at `now`, and commits the
/// transaction `conn` holds, in ONE round trip ([`complete_then`]): then a `BEGIN`, whose
/// empty transaction sqlx rolls back with the connection's next use (its return to the
/// pool): sqlx counts the handling's transaction in the connection's depth, and only its
/// own commit or rollback may lower it.
///
/// # Errors
/// As [`complete_then`]'s.
async fn complete_and_commit(conn: &mut PgConnection, lock: Lock, now: DateTime<Utc>) -> Result<()> {
    complete_then(conn, lock, now, "COMMIT; BEGIN").await?;
    PgTransactionManager::start_rollback(conn);
    Ok(())
}

/// [`send_staged`], then [`complete_then`] with the transport's clock.
///
/// # Errors
/// As theirs.
pub(crate) async fn send_and_complete_then(
    conn: &mut PgConnection,
    transport: &PostgresTransport,
    lock: Lock,
    staged: Vec<(String, bool, Envelope)>,
    then: &str,
) -> Result<()> {
    if !staged.is_empty() {
        send_staged(&mut *conn, transport, staged).await?;
    }
    complete_then(conn, lock, transport.shared.clock.now(), then).await
}

/// Completes the received message if `lock` is still its lock at `now`, then runs `then`
/// (statements of Courier's own: a `COMMIT`, a savepoint), in ONE round trip: a simple
/// query of the fenced completion (`courier.complete_fenced`, which raises `CL001` when
/// the lock is lost, so that the statements after it are skipped) and `then`.
///
/// # Errors
/// [`ErrorKind::LockLost`] when the lock is lost (nothing of `then` ran; the transaction
/// is left aborted, for the caller to roll back); a storage error, SQLSTATE 25P02 when
/// the handler left the transaction aborted.
async fn complete_then(conn: &mut PgConnection, lock: Lock, now: DateTime<Utc>, then: &str) -> Result<()> {
    let sql = format!(
        "SELECT courier.complete_fenced({}, {}, {}, '{}'); {then}",
        lock.id,
        lock.entity,
        lock.delivery_count,
        now.to_rfc3339_opts(SecondsFormat::Micros, true)
    );
    match sqlx::raw_sql(AssertSqlSafe(sql).into_sql_str())
        .execute(&mut *conn)
        .await
    {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(d)) if d.code().as_deref() == Some(LOCK_LOST) => Err(Error::new(ErrorKind::LockLost)),
        Err(e) => Err(db_error("cannot complete the received message", e)),
    }
}

/// Deletes the received message on `conn` if `lock` is still its lock at `now`.
///
/// # Errors
/// [`ErrorKind::LockLost`] when it is not; a storage error.
async fn complete_in(conn: &mut PgConnection, lock: Lock, now: DateTime<Utc>) -> Result<()> {
    let completed = sqlx::query(
        "DELETE FROM courier.message WHERE id = $1 AND entity_id = $2 AND (delivery_count & 65535) = $3 \
         AND locked_until > $4 AND state <> 1",
    )
    .bind(lock.id)
    .bind(lock.entity)
    .bind(lock.delivery_count)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(|e| db_error("cannot complete the received message", e))?;
    if completed.rows_affected() != 1 {
        // The caller rolls everything back; the message comes again.
        return Err(Error::new(ErrorKind::LockLost));
    }
    Ok(())
}

impl PgTransportStore {
    /// The unit of work of a handling whose transaction `conn` holds open.
    fn work(&self, conn: PoolConnection<Postgres>, endpoint: &str, message_id: &str, lock: Option<Lock>) -> TxWork {
        TxWork {
            conn,
            open: true,
            transport: self.transport.clone(),
            endpoint: endpoint.to_owned(),
            source_id: message_id.to_owned(),
            lock,
            staged: Vec::new(),
            checked: false,
        }
    }
}

/// SQLSTATE of `courier.record_inbox` when the endpoint recorded the message before.
const RECORDED_BEFORE: &str = "CL002";

/// `BEGIN` and the inbox record (`courier.record_inbox`), as one simple query (no
/// parameters: the texts are sent as hexadecimal digits, which need no quoting, and
/// decoded by Postgres).
fn begin_and_record(endpoint: &str, message_id: &str, now: DateTime<Utc>) -> String {
    format!(
        "BEGIN; SELECT courier.record_inbox(convert_from(decode('{}', 'hex'), 'UTF8'), \
         convert_from(decode('{}', 'hex'), 'UTF8'), '{}')",
        hex(endpoint),
        hex(message_id),
        now.to_rfc3339_opts(SecondsFormat::Micros, true)
    )
}

fn hex(text: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(text.len() * 2);
    for b in text.bytes() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

pg_unit_of_work!(TxWork, {
    fn transaction(&mut self) -> Option<&mut (dyn std::any::Any + Send)> {
        Some(&mut *self.conn)
    }

    async fn store_outgoing(
        &mut self,
        messages: Vec<(String, bool, Envelope)>,
        now: DateTime<Utc>,
    ) -> Result<Vec<OutboxMessage>> {
        if self.lock.is_some() {
            self.staged.extend(messages);
            return Ok(Vec::new());
        }
        let rows = messages
            .into_iter()
            .map(|(destination, is_topic, envelope)| OutboxRow {
                source_id: self.source_id.clone(),
                destination,
                is_topic,
                envelope,
            })
            .collect();
        let stored = insert_outbox(&mut self.conn, &self.endpoint, rows, now).await?;
        self.checked = !stored.is_empty();
        Ok(stored)
    }

    async fn commit(mut self: Box<Self>) -> Result<Committed> {
        let Some(lock) = self.lock else {
            if !self.checked {
                ensure_not_aborted(&mut self.conn).await?;
            }
            PgTransactionManager::commit(&mut self.conn)
                .await
                .map_err(|e| db_error("cannot commit the handler's transaction", e))?;
            self.open = false;
            return Ok(Committed::Pending);
        };
        // The completion's statements are sent before the COMMIT: one of them finds a
        // transaction the handler left aborted (SQLSTATE 25P02), as `ensure_not_aborted`
        // would, one round trip fewer.
        let staged = std::mem::take(&mut self.staged);
        if !staged.is_empty() {
            send_staged(&mut self.conn, &self.transport, staged)
                .await
                .map_err(poisoned_if_aborted)?;
        }
        complete_and_commit(&mut self.conn, lock, self.transport.shared.clock.now())
            .await
            .map_err(poisoned_if_aborted)?;
        self.open = false;
        Ok(Committed::Settled)
    }
});

#[async_trait]
impl Store for PgTransportStore {
    fn name(&self) -> &'static str {
        "postgres-transport"
    }

    async fn migrate(&self) -> Result<()> {
        self.inner.migrate().await
    }

    async fn begin(
        &self,
        endpoint: &str,
        message_id: &str,
        lock: Option<LockToken>,
        now: DateTime<Utc>,
    ) -> Result<Begin> {
        self.transport.shared.check_open()?;
        let lock = lock.and_then(|t| read_token(self.transport.shared.tag, t));
        let mut conn = self
            .transport
            .shared
            .pool
            .acquire()
            .await
            .map_err(|e| db_error("cannot begin the handler's transaction", e))?;
        // BEGIN and the inbox record in one round trip (a simple query). A message handled
        // before makes the record fail (CL002: the only way a status tells it, since sqlx
        // keeps no result of a BEGIN); the transaction is then rolled back and the record
        // tried again the usual way, which tells a duplicate apart (and finds its outbox).
        let first = begin_and_record(endpoint, message_id, now);
        match PgTransactionManager::begin(&mut conn, Some(AssertSqlSafe(first).into_sql_str())).await {
            Ok(()) => return Ok(Begin::Fresh(Box::new(self.work(conn, endpoint, message_id, lock)))),
            Err(sqlx::Error::Database(d)) if d.code().as_deref() == Some(RECORDED_BEFORE) => {}
            Err(e) => {
                // Aborted (or gone): never back to the pool inside a transaction.
                let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
                return Err(db_error("cannot record the message in the inbox", e));
            }
        }
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut *conn)
            .await
            .map_err(|e| db_error("cannot roll back the handler's transaction", e))?;
        PgTransactionManager::begin(&mut conn, None)
            .await
            .map_err(|e| db_error("cannot begin the handler's transaction", e))?;
        let mut work = self.work(conn, endpoint, message_id, lock);
        let recorded = sqlx::query(
            "INSERT INTO courier.inbox (endpoint, message_id, processed_at) VALUES ($1, $2, $3) \
             ON CONFLICT DO NOTHING",
        )
        .bind(endpoint)
        .bind(message_id)
        .bind(now)
        .execute(&mut *work.conn)
        .await
        .map_err(|e| db_error("cannot record the message in the inbox", e))?
        .rows_affected();
        if recorded == 1 {
            return Ok(Begin::Fresh(Box::new(work)));
        }
        let left = outbox_of(&mut *work.conn, endpoint, message_id).await?;
        drop(work);
        Ok(Begin::Duplicate(left))
    }

    /// Everything is one transaction when the endpoint receives from a Postgres transport
    /// on this database (its lock tokens carry the database's tag).
    fn unit_of_work_scope(&self, transport: &dyn Transport) -> UnitOfWorkScope {
        match transport.as_any().and_then(|t| t.downcast_ref::<PostgresTransport>()) {
            Some(other) if other.shared.tag == self.transport.shared.tag => UnitOfWorkScope::All,
            _ => UnitOfWorkScope::Outbox,
        }
    }

    /// For a message of this database: ONE transaction inserts the scheduled copy into
    /// the endpoint's queue, postpones the timeout's reclaim and completes the received
    /// message, fenced by its lock.
    async fn schedule_retry(
        &self,
        endpoint: &str,
        lock: LockToken,
        copy: Envelope,
        timeout: Option<&str>,
        due: DateTime<Utc>,
    ) -> Result<bool> {
        self.transport.shared.check_open()?;
        let Some(lock) = own_lock(&self.transport, Some(lock)) else {
            return Ok(false);
        };
        let mut tx = self
            .transport
            .shared
            .pool
            .begin()
            .await
            .map_err(|e| db_error("cannot begin scheduling a delayed retry", e))?;
        if let Some(id) = timeout {
            postpone_reclaim(&mut tx, endpoint, id, due).await?;
        }
        send_and_complete(&mut tx, &self.transport, lock, vec![(endpoint.to_owned(), false, copy)]).await?;
        tx.commit()
            .await
            .map_err(|e| db_error("cannot commit the delayed retry", e))?;
        Ok(true)
    }

    fn commit_group(&self, endpoint: &str, message_ids: Vec<String>) -> Option<Arc<dyn CommitGroup>> {
        Some(Arc::new(PgGroup::new(
            self.transport.shared.pool.clone(),
            endpoint,
            message_ids,
            Some(self.transport.clone()),
        )))
    }

    async fn mark_dispatched(&self, ids: &[i64]) -> Result<()> {
        self.inner.mark_dispatched(ids).await
    }

    async fn undispatched(&self, endpoint: &str, older_than: DateTime<Utc>, limit: i64) -> Result<Vec<OutboxMessage>> {
        self.inner.undispatched(endpoint, older_than, limit).await
    }

    async fn purge_inbox(&self, endpoint: &str, before: DateTime<Utc>, limit: i64) -> Result<u64> {
        self.inner.purge_inbox(endpoint, before, limit).await
    }

    /// When the endpoint receives from this database (`claim.enqueue`): ONE transaction
    /// claims the due timeouts and inserts their messages into the endpoint's queue
    /// (scheduled for their due time), so nothing is left to send and a claim is never
    /// lost between the two. Otherwise as [`PostgresStore`]'s: the messages are handed
    /// back to be sent.
    async fn claim_due_timeouts(&self, endpoint: &str, claim: TimeoutClaim) -> Result<DueTimeouts> {
        if !claim.enqueue {
            return self.inner.claim_due_timeouts(endpoint, claim).await;
        }
        self.transport.shared.check_open()?;
        let mut tx = self
            .transport
            .shared
            .pool
            .begin()
            .await
            .map_err(|e| db_error("cannot begin claiming saga timeouts", e))?;
        // Enqueued in this transaction: marked sent at the claim, reclaimed only after
        // the whole reclaim wait.
        let (due, dead_lettered) = claim_due(&mut tx, endpoint, claim, claim.now).await?;
        if !due.is_empty() {
            send_in(&mut tx, &self.transport, endpoint, false, &due, claim.now).await?;
        }
        tx.commit()
            .await
            .map_err(|e| db_error("cannot commit the claimed saga timeouts", e))?;
        Ok(DueTimeouts {
            claimed: due.len(),
            to_send: Vec::new(),
            dead_lettered,
        })
    }

    async fn next_timeout_due(&self, endpoint: &str) -> Result<Option<DateTime<Utc>>> {
        self.inner.next_timeout_due(endpoint).await
    }

    async fn timeouts_sent(&self, ids: &[String], at: DateTime<Utc>) -> Result<()> {
        self.inner.timeouts_sent(ids, at).await
    }

    async fn unclaim_timeouts(&self, ids: &[String]) -> Result<()> {
        self.inner.unclaim_timeouts(ids).await
    }

    async fn dead_letter_timeout(&self, endpoint: &str, id: &str, reason: &str, now: DateTime<Utc>) -> Result<bool> {
        self.inner.dead_letter_timeout(endpoint, id, reason, now).await
    }

    async fn postpone_timeout_reclaim(&self, endpoint: &str, id: &str, until: DateTime<Utc>) -> Result<()> {
        self.inner.postpone_timeout_reclaim(endpoint, id, until).await
    }

    async fn dead_letter_outbox(&self, id: i64, reason: &str, description: &str, now: DateTime<Utc>) -> Result<bool> {
        self.inner.dead_letter_outbox(id, reason, description, now).await
    }

    async fn backlog(&self, endpoint: &str) -> Result<Option<StoreBacklog>> {
        self.inner.backlog(endpoint).await
    }

    async fn dead_lettered_outbox(&self, endpoint: &str, limit: i64) -> Result<Vec<OutboxDeadLetter>> {
        self.inner.dead_lettered_outbox(endpoint, limit).await
    }
}
