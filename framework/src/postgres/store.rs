//! The store on the transport's own database: `PostgresTransport::store()`. For a message
//! this transport delivered, ONE Postgres transaction records the inbox, holds the
//! handler's writes and the saga state, inserts the messages the handler sent straight
//! into their queues (no outbox) and completes the received message, fenced by its lock
//! token. Everything else (messages of other transports, timeouts, the inbox purge) is
//! the [`PostgresStore`]'s on the same pool.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Postgres, Transaction};

use super::PostgresTransport;
pub(crate) use super::rows::Lock;
use super::rows::{check_outgoing, read_token};
use super::send::{insert_into_queue_and_complete, insert_messages};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, LockToken};
use crate::store::pg_group::{AfterCommit, InTransaction, PgGroup, Resolved, Settlement, poisoned_if_aborted};
use crate::store::pg_outbox::{OutboxRow, ensure_not_aborted, insert_outbox, outbox_of, record_batch};
use crate::store::pg_saga::pg_unit_of_work;
use crate::store::postgres::{claim_due, postpone_reclaim};
use crate::store::{
    Begin, BeginBatch, CommitGroup, Committed, DueTimeouts, EndpointSecret, OutboxDeadLetter, OutboxMessage,
    PostgresStore, Store, StoreBacklog, TimeoutClaim, UnitOfWorkScope, db_error,
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

struct TxWork {
    tx: Transaction<'static, Postgres>,
    transport: PostgresTransport,
    endpoint: String,
    source_id: String,
    /// The received message's lock, when this transport delivered it: completed in the
    /// transaction.
    lock: Option<Lock>,
    /// The other received messages of a batch this transport delivered (`begin_batch`):
    /// completed in the transaction with `lock`.
    more_locks: Vec<Lock>,
    /// Messages to insert at commit (when the lock is ours).
    staged: Vec<(String, bool, Envelope)>,
    checked: bool,
}

impl TxWork {
    fn pg_conn(&mut self) -> Result<&mut PgConnection> {
        Ok(&mut self.tx)
    }
}

/// The most destinations [`Destinations`] remembers; past it, it starts again empty.
const MAX_DESTINATIONS: usize = 4096;

/// The id of each queue and topic (by name and whether a topic) the store sent to, and
/// whether it requires sessions, as a [`Sender`](crate::transport::Sender) keeps its
/// queue's: the handling's send then goes in with one statement instead of a lookup
/// first. An entity deleted since is noticed by the insert itself (it inserts nothing for
/// an id that is gone, and fails nothing), which then forgets it, looks the name up again
/// and sends to what has the name now, as the lookup on every send did.
#[derive(Debug, Default)]
pub(crate) struct Destinations {
    known: std::sync::Mutex<std::collections::HashMap<(String, bool), (i64, bool)>>,
}

impl Destinations {
    fn known(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<(String, bool), (i64, bool)>> {
        self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn get(&self, name: &str, is_topic: bool) -> Option<(i64, bool)> {
        self.known().get(&(name.to_owned(), is_topic)).copied()
    }

    fn keep(&self, name: &str, is_topic: bool, found: (i64, bool)) {
        let mut known = self.known();
        if known.len() >= MAX_DESTINATIONS {
            known.clear();
        }
        known.insert((name.to_owned(), is_topic), found);
    }

    /// Forgets `name` if it still has id `id`.
    fn forget(&self, name: &str, is_topic: bool, id: i64) {
        let mut known = self.known();
        let key = (name.to_owned(), is_topic);
        if known.get(&key).is_some_and(|(known_id, _)| *known_id == id) {
            known.remove(&key);
        }
    }
}

/// Inserts `messages` for the queue or topic `destination`, checked as a send would be.
/// A topic that does not exist yet is created first, in the caller's transaction, as a
/// publish on the transport's sender creates it (publishing before any subscriber
/// exists is not an error; a topic without subscriptions keeps no copy). A queue that
/// does not exist is an error. The destination's id is looked up once and kept
/// ([`Destinations`]); one deleted since is looked up again. The destination is added to
/// `woken` when its receivers are to be woken once the transaction commits.
///
/// With `completing` (the lock of the received message), one message to a queue whose id
/// is kept goes in with the fenced completion, in one statement; returns whether it did
/// (otherwise the caller completes the message itself).
///
/// # Errors
/// [`ErrorKind::EntityNotFound`] for a missing queue; the name of a missing topic taken
/// by a queue ([`ErrorKind::InvalidOperation`]) or invalid; a message the destination
/// refuses; [`ErrorKind::LockLost`] when `completing` is not the message's lock any more
/// (nothing may commit); a storage error.
#[allow(clippy::too_many_arguments)]
async fn send_in(
    conn: &mut PgConnection,
    transport: &PostgresTransport,
    destination: &str,
    is_topic: bool,
    messages: &[Envelope],
    now: DateTime<Utc>,
    woken: &mut Vec<i64>,
    completing: Option<Lock>,
) -> Result<bool> {
    let known = &transport.shared.destinations;
    let mut completed = false;
    if let Some((entity, requires_session)) = known.get(destination, is_topic) {
        let refused = messages
            .iter()
            .any(|m| check_outgoing(transport.shared.max_message_size, m, destination, requires_session, now).is_err());
        // A refusal is decided on the entity as it is now, below.
        if !refused {
            match (messages, completing) {
                ([one], Some(lock)) if !is_topic => {
                    let done = insert_into_queue_and_complete(&mut *conn, entity, one, lock, now, woken).await?;
                    if !done.completed {
                        // The caller rolls everything back; the message comes again.
                        return Err(Error::new(ErrorKind::LockLost));
                    }
                    completed = true;
                    if done.seq.is_some() {
                        return Ok(true);
                    }
                }
                _ => {
                    if insert_messages(&mut *conn, entity, !is_topic, false, messages, now, woken)
                        .await?
                        .is_some()
                    {
                        return Ok(false);
                    }
                }
            }
        }
        // Deleted since it was looked up (nothing was inserted): look the name up again.
        known.forget(destination, is_topic, entity);
    }
    let (entity, requires_session) = look_up(&mut *conn, transport, destination, is_topic, now).await?;
    for m in messages {
        check_outgoing(transport.shared.max_message_size, m, destination, requires_session, now)?;
    }
    insert_messages(conn, entity, !is_topic, false, messages, now, woken)
        .await?
        .ok_or_else(|| {
            Error::new(ErrorKind::EntityNotFound {
                path: destination.to_owned(),
            })
        })?;
    Ok(completed)
}

/// The id of the queue or topic `destination` and whether it requires sessions, read from
/// the database (and kept in [`Destinations`]); a topic that does not exist is created
/// in the caller's transaction (and not kept: that transaction may roll back).
///
/// # Errors
/// [`ErrorKind::EntityNotFound`] for a missing queue; the name of a missing topic taken
/// by a queue ([`ErrorKind::InvalidOperation`]) or invalid; a storage error.
async fn look_up(
    conn: &mut PgConnection,
    transport: &PostgresTransport,
    destination: &str,
    is_topic: bool,
    now: DateTime<Utc>,
) -> Result<(i64, bool)> {
    let found: Option<(i64, bool)> =
        sqlx::query_as("SELECT id, requires_session FROM courier.entity WHERE parent = 0 AND name = $1 AND kind = $2")
            .bind(destination)
            .bind(if is_topic { 1_i16 } else { 0 })
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| db_error("cannot look up a destination", e))?;
    match found {
        Some(found) => {
            transport.shared.destinations.keep(destination, is_topic, found);
            Ok(found)
        }
        None if is_topic => Ok((create_topic_in(&mut *conn, destination, now).await?, false)),
        None => Err(Error::new(ErrorKind::EntityNotFound {
            path: destination.to_owned(),
        })),
    }
}

/// The id of `destination` for a message `m` sent to it at `now`, checked as a send
/// would be: the kept id ([`Destinations`]) when the message passes the checks against
/// it, otherwise (none kept, or a refusal, which is decided on the entity as it is now)
/// the one read from the database ([`look_up`]).
///
/// # Errors
/// As [`look_up`]; a message the destination refuses.
async fn resolve(
    conn: &mut PgConnection,
    transport: &PostgresTransport,
    destination: &str,
    is_topic: bool,
    m: &Envelope,
    now: DateTime<Utc>,
) -> Result<i64> {
    let max = transport.shared.max_message_size;
    if let Some((entity, requires_session)) = transport.shared.destinations.get(destination, is_topic) {
        if check_outgoing(max, m, destination, requires_session, now).is_ok() {
            return Ok(entity);
        }
        transport.shared.destinations.forget(destination, is_topic, entity);
    }
    let (entity, requires_session) = look_up(conn, transport, destination, is_topic, now).await?;
    check_outgoing(max, m, destination, requires_session, now)?;
    Ok(entity)
}

/// Creates topic `name` with the default options (as `Transport::create_topic` with
/// `TopicOptions::default()` does) on `conn`, inside its transaction, unless it exists;
/// returns its id. A concurrent creator's row is waited for and then used: the insert
/// does nothing on the conflict and the lookup after it sees the committed row (READ
/// COMMITTED: each statement takes a new snapshot). If that creator rolls back, the
/// insert goes through instead.
///
/// # Errors
/// An invalid name; [`ErrorKind::InvalidOperation`] when a queue has the name; a storage
/// error.
async fn create_topic_in(conn: &mut PgConnection, name: &str, now: DateTime<Utc>) -> Result<i64> {
    crate::entity::validate_name(name)?;
    let options = crate::entity::QueueOptions {
        default_time_to_live: crate::entity::TopicOptions::default().default_time_to_live,
        ..crate::entity::QueueOptions::default()
    };
    options.validate()?;
    let (lock_ms, ttl_ms, max) = super::entities::stored_options(&options);
    let created: Option<i64> = sqlx::query_scalar(
        "INSERT INTO courier.entity (kind, parent, name, path, lock_duration_ms, max_delivery_count, \
         default_ttl_ms, requires_session, created_at) VALUES (1, 0, $1, $1, $2, $3, $4, $5, $6) \
         ON CONFLICT (parent, name) DO NOTHING RETURNING id",
    )
    .bind(name)
    .bind(lock_ms)
    .bind(max)
    .bind(ttl_ms)
    .bind(options.requires_session)
    .bind(now)
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| db_error("cannot create the topic published to", e))?;
    if let Some(id) = created {
        tracing::debug!(topic = name, "created the topic published to (it did not exist)");
        return Ok(id);
    }
    let existing: Option<(i64, i16)> =
        sqlx::query_as("SELECT id, kind FROM courier.entity WHERE parent = 0 AND name = $1")
            .bind(name)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| db_error("cannot look up a topic", e))?;
    match existing {
        Some((id, 1)) => Ok(id),
        Some(_) => Err(Error::new(ErrorKind::InvalidOperation {
            reason: format!("cannot publish to {name:?}: the name is taken by a queue"),
        })),
        // The conflicting row was deleted between the insert and the lookup (a topic
        // created and deleted at once): say so rather than loop.
        None => Err(Error::new(ErrorKind::EntityNotFound { path: name.to_owned() })),
    }
}

/// The lock of a delivery of `transport`'s database (`None`: a delivery of another
/// transport, or none): the one its store completes in the handling's transaction.
pub(crate) fn own_lock(transport: &PostgresTransport, token: Option<LockToken>) -> Option<Lock> {
    token.and_then(|t| read_token(transport.shared.tag, t))
}

/// The transport's own store's group commit completes the transport's deliveries in the
/// group's transaction, and inserts what the members sent at its commit
/// (`store::pg_group`).
#[async_trait]
impl InTransaction for PostgresTransport {
    fn settlement(&self, token: Option<LockToken>) -> Option<Box<dyn Settlement>> {
        own_lock(self, token).map(|lock| {
            Box::new(OwnDelivery {
                transport: self.clone(),
                lock,
            }) as Box<dyn Settlement>
        })
    }

    async fn insert_sent(&self, conn: &mut PgConnection, sent: Vec<Resolved>) -> Result<AfterCommit> {
        let now = self.shared.clock.now();
        // One statement per destination, the messages in the members' order.
        let mut groups: Vec<(i64, String, bool, Vec<Envelope>)> = Vec::new();
        for r in sent {
            match groups
                .iter_mut()
                .find(|(e, _, t, _)| *e == r.entity && *t == r.is_topic)
            {
                Some((_, _, _, messages)) => messages.push(r.envelope),
                None => groups.push((r.entity, r.destination, r.is_topic, vec![r.envelope])),
            }
        }
        let mut woken = Vec::new();
        for (entity, destination, is_topic, messages) in groups {
            let inserted = insert_messages(&mut *conn, entity, !is_topic, false, &messages, now, &mut woken).await?;
            if inserted.is_none() {
                // Deleted since the member looked it up: nothing was inserted, and the
                // members' checks were against an entity that is gone. The group fails;
                // each member is retried and looks its destinations up again.
                self.shared.destinations.forget(&destination, is_topic, entity);
                return Err(Error::new(ErrorKind::Storage {
                    detail: format!(
                        "{} {} was deleted while the messages sent to it were being committed; the handlings will be retried",
                        if is_topic { "topic" } else { "queue" },
                        crate::logtext::Escaped(&destination)
                    ),
                    transient: true,
                }));
            }
        }
        let shared = self.shared.clone();
        Ok(Box::new(move || shared.wake_after_commit(woken)))
    }
}

/// A delivery of this transport, completed in a group's transaction.
struct OwnDelivery {
    transport: PostgresTransport,
    lock: Lock,
}

#[async_trait]
impl Settlement for OwnDelivery {
    async fn settle(
        self: Box<Self>,
        conn: &mut PgConnection,
        staged: Vec<(String, bool, Envelope)>,
    ) -> Result<Vec<Resolved>> {
        let now = self.transport.shared.clock.now();
        let mut sent = Vec::with_capacity(staged.len());
        for (destination, is_topic, envelope) in staged {
            let entity = resolve(&mut *conn, &self.transport, &destination, is_topic, &envelope, now).await?;
            sent.push(Resolved {
                destination,
                is_topic,
                entity,
                envelope,
            });
        }
        complete_in(conn, self.lock, now).await?;
        Ok(sent)
    }
}

/// The end of a handling of a message `transport` delivered, on the handling's
/// transaction `conn`: inserts the messages the handlers sent (`staged`: destination,
/// whether a topic, message) into their queues and subscriptions, then deletes the
/// received message if `lock` is still its lock and unexpired (the fence). Returns the
/// entities whose receivers to wake once the transaction committed
/// (`Shared::wake_after_commit`).
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
) -> Result<Vec<i64>> {
    let now = transport.shared.clock.now();
    let mut groups: Vec<(String, bool, Vec<Envelope>)> = Vec::new();
    for (destination, is_topic, envelope) in staged {
        match groups.iter_mut().find(|(d, t, _)| *d == destination && *t == is_topic) {
            Some((_, _, group)) => group.push(envelope),
            None => groups.push((destination, is_topic, vec![envelope])),
        }
    }
    let mut woken = Vec::new();
    let last = groups.len().saturating_sub(1);
    let mut completed = false;
    for (i, (destination, is_topic, messages)) in groups.iter().enumerate() {
        // The last send may carry the completion (`send_in`).
        let completing = (i == last).then_some(lock);
        completed = send_in(
            &mut *conn,
            transport,
            destination,
            *is_topic,
            messages,
            now,
            &mut woken,
            completing,
        )
        .await?;
    }
    if !completed {
        complete_in(conn, lock, now).await?;
    }
    Ok(woken)
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

/// Deletes the received messages of a batch on `conn` if each `lock` is still its
/// message's lock at `now`, in one statement.
///
/// # Errors
/// [`ErrorKind::LockLost`] when one is not (the caller rolls everything back); a storage
/// error.
async fn complete_many_in(conn: &mut PgConnection, locks: &[Lock], now: DateTime<Utc>) -> Result<()> {
    let ids: Vec<i64> = locks.iter().map(|l| l.id).collect();
    let entities: Vec<i64> = locks.iter().map(|l| l.entity).collect();
    let counts: Vec<i32> = locks.iter().map(|l| l.delivery_count).collect();
    let completed = sqlx::query(
        "DELETE FROM courier.message m USING unnest($1::bigint[], $2::bigint[], $3::int[]) AS l(id, entity, dc) \
         WHERE m.id = l.id AND m.entity_id = l.entity AND (m.delivery_count & 65535) = l.dc \
         AND m.locked_until > $4 AND m.state <> 1",
    )
    .bind(&ids)
    .bind(&entities)
    .bind(&counts)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(|e| db_error("cannot complete the batch's received messages", e))?;
    if completed.rows_affected() != locks.len() as u64 {
        return Err(Error::new(ErrorKind::LockLost));
    }
    Ok(())
}

pg_unit_of_work!(TxWork, {
    fn transaction(&mut self) -> Option<&mut (dyn std::any::Any + Send)> {
        Some(&mut *self.tx)
    }

    /// Written at once; the statement runs after the handler's, so it is the check that
    /// the handler did not leave the transaction aborted (the commit's `SELECT 1` saved).
    async fn record_history(&mut self, event: &crate::store::history::HistoryEvent) -> Result<()> {
        crate::store::pg_history::record_after_handler(&mut self.tx, event).await?;
        self.checked = true;
        Ok(())
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
        let stored = insert_outbox(&mut self.tx, &self.endpoint, rows, now).await?;
        self.checked |= !stored.is_empty();
        Ok(stored)
    }

    async fn commit(mut self: Box<Self>) -> Result<Committed> {
        let Some(lock) = self.lock else {
            if !self.checked {
                ensure_not_aborted(&mut self.tx).await?;
            }
            self.tx
                .commit()
                .await
                .map_err(|e| db_error("cannot commit the handler's transaction", e))?;
            return Ok(Committed::Pending);
        };
        // The completion's statements are sent before the COMMIT: one of them finds a
        // transaction the handler left aborted (SQLSTATE 25P02), as `ensure_not_aborted`
        // would, one round trip fewer.
        let staged = std::mem::take(&mut self.staged);
        let now = self.transport.shared.clock.now();
        let woken = if staged.is_empty() && !self.more_locks.is_empty() {
            // A batch that sent nothing: every completion in one statement.
            self.more_locks.push(lock);
            complete_many_in(&mut self.tx, &self.more_locks, now)
                .await
                .map_err(poisoned_if_aborted)?;
            Vec::new()
        } else {
            let woken = send_and_complete(&mut self.tx, &self.transport, lock, staged)
                .await
                .map_err(poisoned_if_aborted)?;
            if !self.more_locks.is_empty() {
                complete_many_in(&mut self.tx, &self.more_locks, now)
                    .await
                    .map_err(poisoned_if_aborted)?;
            }
            woken
        };
        self.tx
            .commit()
            .await
            .map_err(|e| db_error("cannot commit the handler's transaction", e))?;
        self.transport.shared.wake_after_commit(woken);
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
        let mut tx = self
            .transport
            .shared
            .pool
            .begin()
            .await
            .map_err(|e| db_error("cannot begin the handler's transaction", e))?;
        let recorded = sqlx::query(
            "INSERT INTO courier.inbox (endpoint, message_id, processed_at) VALUES ($1, $2, $3) \
             ON CONFLICT DO NOTHING",
        )
        .bind(endpoint)
        .bind(message_id)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(|e| db_error("cannot record the message in the inbox", e))?
        .rows_affected();
        if recorded == 1 {
            return Ok(Begin::Fresh(Box::new(TxWork {
                tx,
                transport: self.transport.clone(),
                endpoint: endpoint.to_owned(),
                source_id: message_id.to_owned(),
                lock,
                more_locks: Vec::new(),
                staged: Vec::new(),
                checked: false,
            })));
        }
        let left = outbox_of(&mut *tx, endpoint, message_id).await?;
        drop(tx);
        Ok(Begin::Duplicate(left))
    }

    /// One transaction: the batch's inbox records, the handler's writes, what it sent
    /// (into its queues) and the completion of every fresh member this transport
    /// delivered, fenced by their locks.
    async fn begin_batch(
        &self,
        endpoint: &str,
        members: Vec<(String, Option<LockToken>)>,
        now: DateTime<Utc>,
    ) -> Result<BeginBatch> {
        if members.is_empty() {
            return Ok(BeginBatch::empty());
        }
        self.transport.shared.check_open()?;
        let ids: Vec<String> = members.iter().map(|(id, _)| id.clone()).collect();
        let mut tx = self
            .transport
            .shared
            .pool
            .begin()
            .await
            .map_err(|e| db_error("cannot begin the batch's transaction", e))?;
        let duplicates = record_batch(&mut tx, endpoint, &ids, now).await?;
        let Some(first) = BeginBatch::first_fresh(&ids, &duplicates) else {
            return Ok(BeginBatch { work: None, duplicates });
        };
        let mut locks = members
            .into_iter()
            .zip(&duplicates)
            .filter(|(_, d)| d.is_none())
            .filter_map(|((_, lock), _)| own_lock(&self.transport, lock));
        let lock = locks.next();
        let work = TxWork {
            tx,
            transport: self.transport.clone(),
            endpoint: endpoint.to_owned(),
            source_id: first,
            lock,
            more_locks: locks.collect(),
            staged: Vec::new(),
            checked: false,
        };
        Ok(BeginBatch {
            work: Some(Box::new(work)),
            duplicates,
        })
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
        let woken = send_and_complete(&mut tx, &self.transport, lock, vec![(endpoint.to_owned(), false, copy)]).await?;
        tx.commit()
            .await
            .map_err(|e| db_error("cannot commit the delayed retry", e))?;
        self.transport.shared.wake_after_commit(woken);
        Ok(true)
    }

    fn commit_group(&self, endpoint: &str, message_ids: Vec<String>) -> Option<Arc<dyn CommitGroup>> {
        Some(Arc::new(PgGroup::new(
            self.transport.shared.pool.clone(),
            endpoint,
            message_ids,
            Some(Arc::new(self.transport.clone())),
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

    fn keeps_history(&self) -> bool {
        true
    }

    async fn record_history(&self, event: &crate::store::history::HistoryEvent) -> Result<()> {
        self.inner.record_history(event).await
    }

    async fn purge_history(&self, endpoint: &str, before: DateTime<Utc>, limit: i64) -> Result<u64> {
        self.inner.purge_history(endpoint, before, limit).await
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
        let crate::store::Claimed {
            due,
            dead_lettered,
            taken,
        } = claim_due(&mut tx, endpoint, claim, claim.now).await?;
        let mut woken = Vec::new();
        if !due.is_empty() {
            send_in(
                &mut tx,
                &self.transport,
                endpoint,
                false,
                &due,
                claim.now,
                &mut woken,
                None,
            )
            .await?;
        }
        if claim.history {
            for t in &taken {
                crate::store::pg_history::record(
                    &mut tx,
                    &crate::store::history::timeout_event(endpoint, t, claim.now),
                )
                .await?;
            }
        }
        tx.commit()
            .await
            .map_err(|e| db_error("cannot commit the claimed saga timeouts", e))?;
        self.transport.shared.wake_after_commit(woken);
        Ok(DueTimeouts {
            claimed: due.len(),
            to_send: Vec::new(),
            dead_lettered,
            recorded: claim.history,
            taken,
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

    async fn endpoint_secret(&self, endpoint: &str, now: DateTime<Utc>) -> Result<Option<EndpointSecret>> {
        self.inner.endpoint_secret(endpoint, now).await
    }
}
