//! What the transport's own store (`store.rs`) does in a handling's transaction with the
//! messages a handler sent and the message it handled: the destinations' ids it keeps
//! ([`Destinations`]), the sends inserted into their queues, and the received message
//! completed, fenced by its lock token; alone ([`send_and_complete`]) and in a commit
//! group, where a member resolves and checks its sends at its turn and the group inserts
//! them all at its commit (`InTransaction`, `store::pg_group`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::PostgresTransport;
use super::rows::{Lock, check_outgoing, read_token};
use super::send::{insert_into_queue_and_complete, insert_messages};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, LockToken};
use crate::store::db_error;
use crate::store::pg_group::{AfterCommit, InTransaction, Resolved, Settlement};

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
pub(super) async fn send_in(
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
pub(super) async fn complete_many_in(conn: &mut PgConnection, locks: &[Lock], now: DateTime<Utc>) -> Result<()> {
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
