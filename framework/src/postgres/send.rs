//! Sending: one statement inserts a batch of messages, stamps their sequence numbers and
//! fans a topic's messages out to its subscriptions, in the sending transaction; once it
//! commits, the transport's notifier wakes the receivers (`wake::Notifier`). Scheduled
//! messages wait in the same table (a topic's on the topic itself, fanned out when they
//! activate) until a receiver or browser of their entity activates them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};
use tokio::sync::Semaphore;

use super::Shared;
use super::entities::{EntityInfo, Kind};
use super::rows::{check_outgoing, props_json};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, SequenceNumber};
use crate::store::db_error;
use crate::transport::{SendError, Sender};

/// Inserts `messages` for entity `entity` (a queue, or a topic whose subscriptions each
/// get a copy; `queue` when it is known to be a queue) at `now`; returns their sequence
/// numbers in order, or `None` when the entity does not exist (or is not a queue, with
/// `queue`). Runs on any connection, inside the caller's transaction if it has one: the
/// messages become receivable when it commits. With `notify` and `queue`, the statement
/// notifies the queue's receivers itself, when it commits and a message of it is
/// receivable (a send in a transaction of its own: [`send_on_pool`]). Otherwise it
/// notifies no one: when a message is not scheduled, `entity` is added to `woken`, for
/// the caller to hand to [`Shared::wake_after_commit`] once the transaction committed.
///
/// One message goes in with a statement of its own ([`INSERT_ONE`], [`INSERT_INTO_QUEUE`])
/// and a batch to a queue with [`INSERT_BATCH_INTO_QUEUE`]: Postgres keeps one (generic)
/// plan for each, while it plans the batch statement with fan-out ([`insert_fanned_out`])
/// afresh at every execution (0.4-0.8 ms for 100 messages, about a third of the insert
/// itself; docs/measurements.md, "The send path").
pub(crate) async fn insert_messages(
    conn: &mut PgConnection,
    entity: i64,
    queue: bool,
    notify: bool,
    messages: &[Envelope],
    now: DateTime<Utc>,
    woken: &mut Vec<i64>,
) -> Result<Option<Vec<SequenceNumber>>> {
    let notify = notify && queue;
    let sent = if let [one] = messages {
        insert_one(conn, entity, queue, notify, one, now)
            .await?
            .map(|seq| vec![seq])
    } else {
        let n = messages.len();
        let mut cols = Columns::with_capacity(n);
        for m in messages {
            cols.push(m, now);
        }
        if queue {
            insert_batch_into_queue(conn, entity, notify, &cols, now).await?
        } else {
            insert_fanned_out(conn, entity, n, &cols, now).await?
        }
    };
    if !notify && sent.is_some() && messages.iter().any(|m| scheduled(m, now).is_none()) {
        woken.push(entity);
    }
    Ok(sent)
}

/// The insert of the messages `u` (unnested columns) into the entities `t`, each row
/// numbered by `$seq`, enqueued at the parameter `$now`: the state (scheduled, active, or
/// dead-lettered for a missing session id), the expiry and the dead-letter columns. The
/// statements below add where the rows come from.
macro_rules! insert_messages {
    ($seq:literal, $now:literal) => {
        concat!(
            "INSERT INTO courier.message (entity_id, seq, state, session_id, enqueued_at, scheduled_at, \
               expires_at, ttl_ms, message_id, correlation_id, causation_id, message_type, content_type, \
               reply_to, properties, dl_reason, dl_description, dl_source, body) \
             SELECT t.id, ",
            $seq,
            ", CASE WHEN u.sched IS NOT NULL THEN 1 \
                    WHEN t.requires_session AND u.session_id IS NULL THEN 3 ELSE 0 END, \
               u.session_id, ",
            $now,
            ", u.sched, CASE WHEN u.sched IS NULL THEN ",
            $now,
            " + LEAST(u.ttl_ms, t.default_ttl_ms) * interval '1 millisecond' END, \
               LEAST(u.ttl_ms, t.default_ttl_ms), \
               u.message_id, u.correlation_id, u.causation_id, u.message_type, u.content_type, u.reply_to, \
               u.props::jsonb, \
               CASE WHEN u.sched IS NULL AND t.requires_session AND u.session_id IS NULL \
                    THEN 'SessionIdMissing' END, \
               CASE WHEN u.sched IS NULL AND t.requires_session AND u.session_id IS NULL \
                    THEN 'the subscription requires sessions and the message has no session id' END, \
               CASE WHEN u.sched IS NULL AND t.requires_session AND u.session_id IS NULL THEN t.path END, \
               u.body "
        )
    };
}

/// A batch of messages to queue `$1`, returning the sequence numbers and then `$notify`'s
/// columns: [`INSERT_BATCH_INTO_QUEUE`] and [`INSERT_BATCH_INTO_QUEUE_NOTIFYING`].
macro_rules! insert_batch_into_queue {
    ($notify:literal) => {
        concat!(
            "WITH ins AS (",
            insert_messages!("nextval('courier.message_seq')", "$13"),
            "FROM courier.entity t, \
               unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], \
                      $9::text[], $10::int8[], $11::timestamptz[], $12::bytea[]) WITH ORDINALITY \
               AS u(message_id, correlation_id, causation_id, message_type, content_type, reply_to, session_id, \
                    props, ttl_ms, sched, body, ord) \
             WHERE t.id = $1 AND t.kind = 0 \
             ORDER BY u.ord \
             RETURNING seq, state) \
           SELECT ARRAY(SELECT seq FROM ins ORDER BY seq)",
            $notify
        )
    };
}

/// A batch of messages to queue `$1`, their columns bound as arrays (`$2` to `$12`) and
/// unnested in order: each row draws its sequence number as it is inserted, so the batch is
/// numbered in the order given. No fan-out, so the queue's row is read by its key alone,
/// and the plan is the same for any batch size (Postgres keeps a generic one after five
/// executions: the statement with fan-out, its window and its join, never got one).
/// Returns the sequence numbers (none when the queue does not exist).
const INSERT_BATCH_INTO_QUEUE: &str = insert_batch_into_queue!("");

/// [`INSERT_BATCH_INTO_QUEUE`] that notifies the queue's receivers itself, once, when it
/// commits and a message of it is receivable: a `Sender::send_batch` to a queue
/// ([`send_on_pool`]).
const INSERT_BATCH_INTO_QUEUE_NOTIFYING: &str = insert_batch_into_queue!(
    ", (SELECT pg_notify('courier_transport', $1::text) WHERE EXISTS (SELECT 1 FROM ins WHERE state <> 1))"
);

/// [`insert_messages`] of a batch to a queue: [`INSERT_BATCH_INTO_QUEUE`], or with
/// `notify` [`INSERT_BATCH_INTO_QUEUE_NOTIFYING`].
async fn insert_batch_into_queue(
    conn: &mut PgConnection,
    entity: i64,
    notify: bool,
    cols: &Columns,
    now: DateTime<Utc>,
) -> Result<Option<Vec<SequenceNumber>>> {
    let statement = if notify {
        INSERT_BATCH_INTO_QUEUE_NOTIFYING
    } else {
        INSERT_BATCH_INTO_QUEUE
    };
    let row = cols
        .bind_to(sqlx::query(statement).bind(entity))
        .bind(now)
        .fetch_one(&mut *conn)
        .await
        .map_err(send_error)?;
    let seqs: Vec<i64> = row
        .try_get(0)
        .map_err(|e| db_error("cannot read the sequence numbers of a send", e))?;
    if seqs.is_empty() {
        // No row: the queue does not exist (any more).
        return Ok(None);
    }
    Ok(Some(seqs))
}

/// [`insert_messages`] of a batch to a queue or a topic, with fan-out.
async fn insert_fanned_out(
    conn: &mut PgConnection,
    entity: i64,
    n: usize,
    cols: &Columns,
    now: DateTime<Utc>,
) -> Result<Option<Vec<SequenceNumber>>> {
    // Sequence numbers are drawn first and paired with the messages in order, so a batch
    // is numbered in the order given; copies of a topic message share its number.
    let row = cols
        .bind_to(
            sqlx::query(concat!(
                "WITH e AS (SELECT id FROM courier.entity WHERE id = $1), \
         s AS MATERIALIZED (SELECT nextval('courier.message_seq') AS seq FROM generate_series(1, $2::int)), \
         so AS (SELECT seq, row_number() OVER (ORDER BY seq) AS ord FROM s), \
         u AS (SELECT * FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], \
               $9::text[], $10::text[], $11::int8[], $12::timestamptz[], $13::bytea[]) WITH ORDINALITY \
               AS u(message_id, correlation_id, causation_id, message_type, content_type, reply_to, session_id, \
                    props, ttl_ms, sched, body, ord)), \
         t AS (SELECT id, kind, path, default_ttl_ms, requires_session FROM courier.entity \
               WHERE (id = $1 AND kind <> 2) OR (parent = $1 AND kind = 2)), \
         ins AS (",
                insert_messages!("so.seq", "$14"),
                "FROM u JOIN so USING (ord) \
                 JOIN t ON (CASE WHEN u.sched IS NOT NULL THEN t.id = $1 ELSE t.kind <> 1 END) \
                 RETURNING entity_id, state) \
         SELECT (SELECT count(*) FROM e), ARRAY(SELECT seq FROM so ORDER BY ord)"
            ))
            .bind(entity)
            .bind(i32::try_from(n).unwrap_or(i32::MAX)),
        )
        .bind(now)
        .fetch_one(&mut *conn)
        .await
        .map_err(send_error)?;
    let get = |e| db_error("cannot read the sequence numbers of a send", e);
    let found: i64 = row.try_get(0).map_err(get)?;
    if found == 0 {
        return Ok(None);
    }
    let seqs: Vec<i64> = row.try_get(1).map_err(get)?;
    Ok(Some(seqs))
}

/// The insert of a single message, its columns bound as values (`$2` to `$13`), for the
/// entity rows `t` (with `t.kind` and `t.path`) and the sequence number `$seq`, returning
/// each row's entity and state: the rows of the batch statement of [`insert_messages`].
macro_rules! insert_one_row {
    ($seq:literal, $from:literal) => {
        concat!(
            "INSERT INTO courier.message (entity_id, seq, state, session_id, enqueued_at, scheduled_at, \
               expires_at, ttl_ms, message_id, correlation_id, causation_id, message_type, content_type, \
               reply_to, properties, dl_reason, dl_description, dl_source, body) \
             SELECT t.id, ",
            $seq,
            ", CASE WHEN $11::timestamptz IS NOT NULL THEN 1 \
                    WHEN t.requires_session AND $8::text IS NULL THEN 3 ELSE 0 END, \
               $8::text, $13::timestamptz, $11::timestamptz, \
               CASE WHEN $11::timestamptz IS NULL \
                    THEN $13::timestamptz + LEAST($10::int8, t.default_ttl_ms) * interval '1 millisecond' END, \
               LEAST($10::int8, t.default_ttl_ms), \
               $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, $9::text::jsonb, \
               CASE WHEN $11::timestamptz IS NULL AND t.requires_session AND $8::text IS NULL \
                    THEN 'SessionIdMissing' END, \
               CASE WHEN $11::timestamptz IS NULL AND t.requires_session AND $8::text IS NULL \
                    THEN 'the subscription requires sessions and the message has no session id' END, \
               CASE WHEN $11::timestamptz IS NULL AND t.requires_session AND $8::text IS NULL THEN t.path END, \
               $12::bytea \
             FROM ",
            $from,
            " RETURNING entity_id, seq, state"
        )
    };
}

/// One message to entity `$1`, a queue or a topic (a copy per subscription; a scheduled
/// message waits on the entity itself). Returns whether the entity exists and the
/// sequence number.
const INSERT_ONE: &str = concat!(
    "WITH t AS MATERIALIZED (SELECT id, kind, path, default_ttl_ms, requires_session \
     FROM courier.entity WHERE (id = $1 AND kind <> 2) OR (parent = $1 AND kind = 2)), \
     s AS MATERIALIZED (SELECT nextval('courier.message_seq') AS seq), \
     ins AS (",
    insert_one_row!(
        "s.seq",
        "t, s WHERE CASE WHEN $11::timestamptz IS NOT NULL THEN t.id = $1 ELSE t.kind <> 1 END"
    ),
    ") SELECT (SELECT count(*) FROM t WHERE id = $1), (SELECT seq FROM s)"
);

/// One message to queue `$1`, returning `seq` and then `$notify`'s columns.
macro_rules! insert_into_queue {
    ($notify:literal) => {
        concat!(
            "WITH ins AS (",
            insert_one_row!(
                "nextval('courier.message_seq')",
                "courier.entity t WHERE t.id = $1 AND t.kind = 0"
            ),
            ") SELECT seq",
            $notify,
            " FROM ins"
        )
    };
}

/// One message to queue `$1`: no fan-out, so the entity row is read by its key alone.
/// Returns the sequence number; no row when the queue does not exist (any more).
const INSERT_INTO_QUEUE: &str = insert_into_queue!("");

/// [`INSERT_INTO_QUEUE`] that notifies the queue's receivers itself, when it commits: a
/// lone send's ([`send_on_pool`]).
const INSERT_INTO_QUEUE_NOTIFYING: &str =
    insert_into_queue!(", CASE WHEN state <> 1 THEN pg_notify('courier_transport', $1::text) END");

/// [`INSERT_INTO_QUEUE`] with the fenced completion of a received message (`$14`: its
/// row, `$15`: its entity, `$16`: its lock's delivery count) in the same statement: the
/// usual end of a handling that sent one message, one round trip fewer. Returns whether
/// the received message was deleted (`1`: its lock held) and the sequence number (`NULL`:
/// the queue does not exist any more).
const INSERT_INTO_QUEUE_AND_COMPLETE: &str = concat!(
    "WITH done AS (DELETE FROM courier.message WHERE id = $14 AND entity_id = $15 \
       AND (delivery_count & 65535) = $16 AND locked_until > $13 AND state <> 1 RETURNING 1), \
     ins AS (",
    insert_one_row!(
        "nextval('courier.message_seq')",
        "courier.entity t WHERE t.id = $1 AND t.kind = 0"
    ),
    ") SELECT (SELECT count(*) FROM done), (SELECT seq FROM ins)"
);

/// What [`insert_into_queue_and_complete`] did.
pub(crate) struct SentAndCompleted {
    /// Whether the received message was deleted: its lock still held.
    pub(crate) completed: bool,
    /// The message's sequence number; `None` when the queue does not exist any more.
    pub(crate) seq: Option<SequenceNumber>,
}

/// Inserts `m` into queue `entity` and deletes the received message of `lock` if the lock
/// still holds at `now`, in one statement ([`INSERT_INTO_QUEUE_AND_COMPLETE`]). When `m`
/// is not scheduled and went in, `entity` is added to `woken` (see [`insert_messages`]).
pub(crate) async fn insert_into_queue_and_complete(
    conn: &mut PgConnection,
    entity: i64,
    m: &Envelope,
    lock: super::rows::Lock,
    now: DateTime<Utc>,
    woken: &mut Vec<i64>,
) -> Result<SentAndCompleted> {
    let row = bind_one(sqlx::query(INSERT_INTO_QUEUE_AND_COMPLETE), entity, m, now)
        .bind(lock.id)
        .bind(lock.entity)
        .bind(lock.delivery_count)
        .fetch_one(&mut *conn)
        .await
        .map_err(send_error)?;
    let get = |e| db_error("cannot read the result of a send with its completion", e);
    let done: i64 = row.try_get(0).map_err(get)?;
    let seq: Option<i64> = row.try_get(1).map_err(get)?;
    if seq.is_some() && scheduled(m, now).is_none() {
        woken.push(entity);
    }
    Ok(SentAndCompleted {
        completed: done == 1,
        seq,
    })
}

/// Binds `$1` (the entity) to `$13` (the time) of [`insert_one_row`]'s statements.
fn bind_one<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    entity: i64,
    m: &'q Envelope,
    now: DateTime<Utc>,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    query
        .bind(entity)
        .bind(&m.message_id)
        .bind(&m.correlation_id)
        .bind(&m.causation_id)
        .bind(&m.message_type)
        .bind(&m.content_type)
        .bind(&m.reply_to)
        .bind(&m.session_id)
        .bind(props_json(&m.properties))
        .bind(ttl_ms(m))
        .bind(scheduled(m, now))
        .bind(m.body.as_ref())
        .bind(now)
}

/// [`insert_messages`] for one message; `queue` when the entity is known to be a queue,
/// and then `notify`: the statement notifies the queue's receivers itself
/// ([`INSERT_INTO_QUEUE_NOTIFYING`]).
async fn insert_one(
    conn: &mut PgConnection,
    entity: i64,
    queue: bool,
    notify: bool,
    m: &Envelope,
    now: DateTime<Utc>,
) -> Result<Option<SequenceNumber>> {
    let statement = match (queue, notify) {
        (true, true) => INSERT_INTO_QUEUE_NOTIFYING,
        (true, false) => INSERT_INTO_QUEUE,
        (false, _) => INSERT_ONE,
    };
    let row = bind_one(sqlx::query(statement), entity, m, now)
        .fetch_optional(&mut *conn)
        .await
        .map_err(send_error)?;
    let get = |e| db_error("cannot read the sequence number of a send", e);
    match row {
        None => Ok(None),
        Some(row) if queue => Ok(Some(row.try_get(0).map_err(get)?)),
        Some(row) => {
            let found: i64 = row.try_get(0).map_err(get)?;
            if found == 0 {
                return Ok(None);
            }
            Ok(Some(row.try_get(1).map_err(get)?))
        }
    }
}

/// A message's time-to-live in milliseconds, as stored.
fn ttl_ms(m: &Envelope) -> Option<i64> {
    m.time_to_live.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// When a message is due, if it is scheduled: a time already reached is sent at once.
fn scheduled(m: &Envelope, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    m.scheduled_enqueue_time.filter(|t| *t > now)
}

/// A foreign-key violation means the entity was deleted during the send.
fn send_error(e: sqlx::Error) -> Error {
    if let sqlx::Error::Database(d) = &e
        && d.code().as_deref() == Some("23503")
    {
        return Error::new(ErrorKind::EntityNotFound {
            path: "the destination (deleted during the send)".into(),
        });
    }
    db_error("cannot store the sent messages", e)
}

/// The messages of a send, column by column (bound as arrays and unnested).
struct Columns {
    message_id: Vec<String>,
    correlation_id: Vec<Option<String>>,
    causation_id: Vec<Option<String>>,
    message_type: Vec<Option<String>>,
    content_type: Vec<Option<String>>,
    reply_to: Vec<Option<String>>,
    session_id: Vec<Option<String>>,
    props: Vec<Option<String>>,
    ttl_ms: Vec<Option<i64>>,
    sched: Vec<Option<DateTime<Utc>>>,
    body: Vec<Vec<u8>>,
}

impl Columns {
    /// Binds the columns, in their order, after what `query` binds already.
    fn bind_to<'q>(
        &'q self,
        query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        query
            .bind(&self.message_id)
            .bind(&self.correlation_id)
            .bind(&self.causation_id)
            .bind(&self.message_type)
            .bind(&self.content_type)
            .bind(&self.reply_to)
            .bind(&self.session_id)
            .bind(&self.props)
            .bind(&self.ttl_ms)
            .bind(&self.sched)
            .bind(&self.body)
    }

    fn with_capacity(n: usize) -> Self {
        Self {
            message_id: Vec::with_capacity(n),
            correlation_id: Vec::with_capacity(n),
            causation_id: Vec::with_capacity(n),
            message_type: Vec::with_capacity(n),
            content_type: Vec::with_capacity(n),
            reply_to: Vec::with_capacity(n),
            session_id: Vec::with_capacity(n),
            props: Vec::with_capacity(n),
            ttl_ms: Vec::with_capacity(n),
            sched: Vec::with_capacity(n),
            body: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, m: &Envelope, now: DateTime<Utc>) {
        self.message_id.push(m.message_id.clone());
        self.correlation_id.push(m.correlation_id.clone());
        self.causation_id.push(m.causation_id.clone());
        self.message_type.push(m.message_type.clone());
        self.content_type.push(m.content_type.clone());
        self.reply_to.push(m.reply_to.clone());
        self.session_id.push(m.session_id.clone());
        self.props.push(props_json(&m.properties));
        self.ttl_ms.push(ttl_ms(m));
        self.sched.push(scheduled(m, now));
        self.body.push(m.body.to_vec());
    }
}

/// Deletes scheduled message `seq` of `entity`.
pub(crate) async fn cancel(shared: &Shared, entity: i64, seq: SequenceNumber) -> Result<()> {
    shared.check_open()?;
    let done = sqlx::query("DELETE FROM courier.message WHERE entity_id = $1 AND seq = $2 AND state = 1")
        .bind(entity)
        .bind(seq)
        .execute(&shared.pool)
        .await
        .map_err(|e| db_error("cannot cancel the scheduled message", e))?;
    if done.rows_affected() == 0 {
        return Err(Error::new(ErrorKind::MessageNotFound {
            sequence_number: seq,
            expected: "scheduled",
        }));
    }
    Ok(())
}

/// A sender to one queue or topic.
pub(crate) struct PgSender {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: String,
    pub(crate) entity: EntityInfo,
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) max_in_flight: usize,
    pub(crate) allow_presettled: bool,
}

impl PgSender {
    fn check(&self, m: &Envelope, now: DateTime<Utc>) -> Result<()> {
        check_outgoing(
            self.shared.max_message_size,
            m,
            &self.name,
            self.entity.requires_session,
            now,
        )
    }

    async fn submit(&self, messages: Vec<Envelope>) -> Result<Vec<SequenceNumber>, SendError> {
        if let Err(e) = self.shared.check_open() {
            return Err(SendError::new(e, messages));
        }
        let now = self.shared.clock.now();
        if let Some(e) = messages.iter().find_map(|m| self.check(m, now).err()) {
            return Err(SendError::new(e, messages));
        }
        let n = u32::try_from(messages.len().clamp(1, self.max_in_flight)).unwrap_or(u32::MAX);
        let Ok(_permits) = self.permits.acquire_many(n).await else {
            return Err(SendError::new(Error::new(ErrorKind::Closed), messages));
        };
        match send_on_pool(&self.shared, &self.entity, &self.name, &messages, now).await {
            Ok(seqs) => Ok(seqs),
            Err(e) => Err(SendError::new(e, messages)),
        }
    }
}

/// Counts the transport's sends in flight while it lives.
struct InFlight<'a> {
    count: &'a AtomicUsize,
    /// No other send was in flight when this one began.
    alone: bool,
}

impl<'a> InFlight<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        let alone = count.fetch_add(1, Ordering::AcqRel) == 0;
        Self { count, alone }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Sends `messages` to `entity` (looked up when the sender was made) on a connection of
/// the pool, in a transaction of their own. The notifier wakes the receivers after the
/// commit, unless this is a batch to a queue, or one message to a queue while no other
/// send of the transport is in flight: that statement notifies itself.
async fn send_on_pool(
    shared: &Shared,
    entity: &EntityInfo,
    name: &str,
    messages: &[Envelope],
    now: DateTime<Utc>,
) -> Result<Vec<SequenceNumber>> {
    let in_flight = InFlight::enter(&shared.sends_in_flight);
    let mut conn = shared
        .pool
        .acquire()
        .await
        .map_err(|e| db_error("cannot get a connection to send", e))?;
    let queue = entity.kind == Kind::Queue;
    // To a queue, the statement notifies itself when nothing would share its commit (no
    // other send of this process is in flight), or when its one commit carries a batch:
    // then notifying in the statement costs less than the notifier's statement after it
    // (one more transaction a send, or a batch).
    let notify = queue && (messages.len() > 1 || in_flight.alone);
    let mut woken = Vec::new();
    let sent = insert_messages(&mut conn, entity.id, queue, notify, messages, now, &mut woken)
        .await
        .map_err(|e| shared.closed_or(e))?
        .ok_or_else(|| Error::new(ErrorKind::EntityNotFound { path: name.to_owned() }))?;
    // The statement committed on its own (no transaction around it).
    drop(conn);
    shared.wake_after_commit(woken);
    Ok(sent)
}

#[async_trait]
impl Sender for PgSender {
    fn entity(&self) -> &str {
        &self.name
    }

    fn in_flight(&self) -> usize {
        self.max_in_flight - self.permits.available_permits()
    }

    async fn send(&self, message: Envelope) -> Result<(), SendError> {
        self.submit(vec![message]).await.map(|_| ())
    }

    async fn send_batch(&self, messages: Vec<Envelope>) -> Result<(), SendError> {
        if messages.is_empty() {
            return Ok(());
        }
        self.submit(messages).await.map(|_| ())
    }

    async fn schedule(&self, mut message: Envelope, at: DateTime<Utc>) -> Result<SequenceNumber, SendError> {
        message.scheduled_enqueue_time = Some(at);
        let seqs = self.submit(vec![message]).await?;
        seqs.first().copied().ok_or_else(|| {
            SendError::new(
                Error::new(ErrorKind::Corrupt {
                    detail: "the database returned no sequence number".into(),
                }),
                Vec::new(),
            )
        })
    }

    async fn cancel_scheduled(&self, sequence_number: SequenceNumber) -> Result<()> {
        cancel(&self.shared, self.entity.id, sequence_number).await
    }

    async fn send_presettled(&self, message: Envelope) -> Result<(), SendError> {
        if !self.allow_presettled {
            return Err(SendError::new(
                Error::new(ErrorKind::InvalidOperation {
                    reason: "pre-settled sends are off: enable SenderOptions::allow_presettled".into(),
                }),
                vec![message],
            ));
        }
        let now = self.shared.clock.now();
        if let Err(e) = self.shared.check_open().and_then(|()| self.check(&message, now)) {
            return Err(SendError::new(e, vec![message]));
        }
        // The insert runs on its own; its outcome is only logged (S1.5).
        let (shared, entity, name) = (self.shared.clone(), self.entity.clone(), self.name.clone());
        tokio::spawn(async move {
            if let Err(e) = send_on_pool(&shared, &entity, &name, &[message], now).await {
                tracing::warn!(error = %e, entity = %name, "a pre-settled send failed; its sender is not told (S1.5)");
            }
        });
        Ok(())
    }
}
