//! The time-driven work of an entity, done by whoever reads it: the maintenance (before a
//! receive's claim, a browse or a count: activating due scheduled messages, ending the
//! locks of gone holders and forged locks, dead-lettering expired and exhausted messages)
//! and, at most every [`SWEEP_EVERY_MS`] per entity and process, the sweep of rows that
//! no claim ever takes (another program's: a session queue's row without a session id, a
//! row over the max delivery count that is not locked, a topic's row that is not
//! scheduled). Every dead-lettering it does is counted in `courier.messages.dead_lettered`
//! and logged through the transport's log limiter (`loglimit.rs`): a line per reason and
//! run with a count and the first message id for the first of a queue and reason, then a
//! summary line per window of the transport's clock while they go on.
//!
//! A failure of either statement never fails the receive, browse or count that ran it
//! (the claim's own filter never takes what the maintenance would have moved). When the
//! maintenance fails, the due scheduled rows are activated one at a time and each one
//! whose activation fails alone is dead-lettered with the database's error (`isolate`),
//! then the whole is tried again; what still fails is logged with the database's cause
//! and tried again after a backoff of the transport's clock (1 s, doubling, at most
//! 60 s). So one row that breaks a statement cannot stop a queue (issue 30).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use chrono::{DateTime, Duration, Utc};
use sqlx::Row;

use super::Shared;
use super::entities::{EntityInfo, Kind};
use crate::checks::{FAR_SCHEDULE, MAX_SCHEDULE_AHEAD, NO_SCHEDULED_TIME};
use crate::error::{ErrorKind, Result};
use crate::logtext::Escaped;
use crate::message::reasons;
use crate::store::db_error;

/// The most rows one run of the maintenance or the sweep moves per part.
const BATCH: i64 = 1000;
/// How often, by the transport's clock, an entity is swept (per process).
pub(crate) const SWEEP_EVERY_MS: i64 = 10_000;
/// How far past the entity's lock duration a lock may end before it is taken as forged
/// (another program's `locked_until`) and ended: room for the clocks of processes that
/// disagree.
const LOCK_SLACK_MS: i64 = 5 * 60 * 1000;
/// The first and the longest wait before a failed statement is tried again.
const FIRST_BACKOFF_MS: i64 = 1000;
const MAX_BACKOFF_MS: i64 = 60_000;
/// The dead-letter reason of a message that needs a session id and has none.
const SESSION_ID_MISSING: &str = "SessionIdMissing";

/// Per entity: when it was last swept, and the backoff of a failing statement.
#[derive(Debug, Default)]
pub(crate) struct Upkeeps {
    entities: Mutex<HashMap<i64, EntityUpkeep>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct EntityUpkeep {
    swept: Option<DateTime<Utc>>,
    failures: u32,
    retry_at: Option<DateTime<Utc>>,
}

impl Upkeeps {
    fn with<T>(&self, entity: i64, f: impl FnOnce(&mut EntityUpkeep) -> T) -> T {
        let mut map = self.entities.lock().unwrap_or_else(PoisonError::into_inner);
        f(map.entry(entity).or_default())
    }
}

/// The maintenance of `entity` at `now` (and its sweep when due), as a receive, browse or
/// count runs it first. Fails only when the transport was closed; any other failure is
/// logged and backed off (see the module docs).
pub(crate) async fn run(shared: &Shared, entity: &EntityInfo, now: DateTime<Utc>) -> Result<()> {
    let state = shared.upkeeps.with(entity.id, |u| *u);
    if state.retry_at.is_some_and(|at| now < at) {
        return Ok(());
    }
    let sweep_due = state
        .swept
        .is_none_or(|at| now < at || now - at >= Duration::milliseconds(SWEEP_EVERY_MS));
    let mut result = maintain(shared, entity, now).await;
    if let Err(e) = &result
        && !matches!(e.kind(), ErrorKind::Closed)
    {
        // One row may be what fails: activate the due ones one by one, dead-letter those
        // that fail alone, and try the whole again.
        result = match isolate(shared, entity, now).await {
            Ok(0) => result,
            Ok(_) => maintain(shared, entity, now).await,
            Err(e) => Err(e),
        };
    }
    if result.is_ok() && sweep_due {
        result = sweep(shared, entity, now).await;
        if result.is_ok() {
            shared.upkeeps.with(entity.id, |u| u.swept = Some(now));
        }
    }
    match result {
        // The usual case, no failure before: nothing to reset.
        Ok(()) if state.failures == 0 => Ok(()),
        Ok(()) => {
            let failed = shared.upkeeps.with(entity.id, |u| {
                let failed = u.failures;
                u.failures = 0;
                u.retry_at = None;
                failed
            });
            if failed > 0 {
                tracing::info!(queue = %Escaped(&entity.path), after_failures = failed,
                    "the maintenance of the queue runs again");
            }
            Ok(())
        }
        Err(e) if matches!(e.kind(), ErrorKind::Closed) => Err(e),
        Err(e) => {
            let (failures, wait) = shared.upkeeps.with(entity.id, |u| {
                u.failures = u.failures.saturating_add(1);
                let wait = FIRST_BACKOFF_MS
                    .saturating_mul(1_i64 << u.failures.saturating_sub(1).min(10))
                    .min(MAX_BACKOFF_MS);
                u.retry_at = Some(now + Duration::milliseconds(wait));
                (u.failures, wait)
            });
            tracing::warn!(
                queue = %Escaped(&entity.path),
                error = %e,
                failures,
                retry_in_ms = wait,
                "the maintenance of the queue failed (activating scheduled messages, ending locks, dead-lettering \
                 expired ones); receives go on without it and it is tried again after the wait"
            );
            Ok(())
        }
    }
}

/// Counts `n` messages of `entity` that the transport dead-lettered itself with `reason`
/// in `courier.messages.dead_lettered` (labelled with the transport and the queue), and
/// tells whether to log them in full: `true` for the first of the queue and reason in a
/// while, `false` when they go into the next summary line (`first` and `last` are the
/// message ids of the first and the last of them; see `loglimit.rs`).
pub(crate) fn dead_lettered(
    shared: &Shared,
    entity: &EntityInfo,
    reason: &str,
    n: u64,
    first: &str,
    last: &str,
) -> bool {
    crate::endpoint::metrics::count_dead_lettered("postgres", &entity.path, reason, n);
    n > 0 && shared.dead_log.admit(&entity.path, reason, n, first, last)
}

/// Logs and counts what a run dead-lettered: one line per reason, for the first of a
/// flood; the rest in the limiter's summary lines.
fn report(shared: &Shared, entity: &EntityInfo, part: &str, rows: &[sqlx::postgres::PgRow]) {
    for row in rows {
        let (Ok(Some(reason)), Ok(count), Ok(first), Ok(last)) = (
            row.try_get::<Option<String>, _>(0),
            row.try_get::<i64, _>(1),
            row.try_get::<Option<String>, _>(2),
            row.try_get::<Option<String>, _>(3),
        ) else {
            continue;
        };
        if count <= 0 {
            continue;
        }
        let (first, last) = (first.unwrap_or_default(), last.unwrap_or_default());
        if dead_lettered(
            shared,
            entity,
            &reason,
            u64::try_from(count).unwrap_or(0),
            &first,
            &last,
        ) {
            tracing::warn!(
                queue = %Escaped(&entity.path),
                reason = %Escaped(&reason),
                count,
                first_message_id = %Escaped(&first),
                "the {part} dead-lettered messages of the queue"
            );
        }
    }
}

/// Activates `owner`'s due scheduled messages (fanned out when `owner` is a topic) and
/// `entity`'s own (a subscription's scheduled row, which only another program writes),
/// dead-letters `entity`'s expired messages and those whose lock expired at the max
/// delivery count (the work the clock makes due, done by whoever reads the entity), and
/// ends the locks of `entity`'s messages whose holder is gone (see `holder.rs`) or that
/// end further ahead than any lock Courier takes (forged): they are receivable at once,
/// their delivery count kept. (A message whose lock ends so at the max delivery count is
/// dead-lettered by the next run.)
///
/// It runs before a receive's claim (a busy receiver skips it for a while, see
/// `receive::Upkeep`), so each of its parts must cost what it finds, not what the entity
/// holds: each reads an index of its own. `exhausted` tests `state + 0 = 0`, so that
/// `message_active` (every waiting message) cannot serve it and `message_locked` (the
/// messages with a lock) does: without statistics (a table autovacuum never analysed)
/// Postgres chose `message_active` and read the whole backlog at every receive, 14 ms at
/// 18,000 waiting messages. `orphaned` reads `message_locked` in order with a limit: a
/// plain index scan, which marks the entries of deleted rows dead as it passes them,
/// where a bitmap scan visited every row locked within the last lock duration (completed
/// ones included) again at every receive.
///
/// The time-to-live of an activated message is bounded by the table's constraint (1 ms
/// to 100 years, `message_ttl_in_range`) and its scheduled time by 100 years ahead, so
/// the expiry computed never leaves Postgres' range ("interval out of range" stopped a
/// queue before the constraint).
/// The activation of due scheduled messages, as the CTEs `due` .. `act` (`act` returns
/// `entity_id, state, dl_reason, message_id` of each copy made): `$16` limits it to one
/// row (`NULL`: every due row, up to `$6`). A message that expired before it became due
/// is dead-lettered as it activates (`TTLExpiredException`): the same statement's
/// `expired` does not see the rows it inserts. SQL is built only from literals.
macro_rules! activation {
    () => {
        "due AS (DELETE FROM courier.message m WHERE m.id IN ( \
                 SELECT id FROM courier.message WHERE entity_id IN ($1, $3) AND state = 1 \
                 AND (scheduled_at <= $2 OR scheduled_at IS NULL OR scheduled_at > $9) \
                 AND ($16::int8 IS NULL OR id = $16) ORDER BY scheduled_at, id LIMIT $6 FOR UPDATE SKIP LOCKED) \
                 RETURNING m.*, (m.scheduled_at IS NULL OR m.scheduled_at > $9) AS impossible), \
         n AS MATERIALIZED (SELECT nextval('courier.message_seq') AS seq \
                 FROM generate_series(1, (SELECT count(*) FROM due))), \
         no AS (SELECT seq, row_number() OVER (ORDER BY seq) AS ord FROM n), \
         d AS (SELECT due.*, row_number() OVER (ORDER BY scheduled_at, id) AS ord FROM due), \
         t AS (SELECT id, path, default_ttl_ms, requires_session FROM courier.entity \
               WHERE (id = $1 AND kind = 0) OR (parent = $1 AND kind = 2)), \
         act AS (INSERT INTO courier.message (entity_id, seq, state, session_id, enqueued_at, scheduled_at, \
                   expires_at, ttl_ms, message_id, correlation_id, causation_id, message_type, content_type, \
                   reply_to, properties, dl_reason, dl_description, dl_source, body) \
                 SELECT t.id, no.seq, \
                   CASE WHEN d.impossible OR (t.requires_session AND d.session_id IS NULL) \
                     OR x.expires_at <= $2 THEN 3 ELSE 0 END, \
                   d.session_id, CASE WHEN d.impossible THEN $2 ELSE d.scheduled_at END, \
                   CASE WHEN d.impossible THEN NULL ELSE d.scheduled_at END, x.expires_at, \
                   LEAST(d.ttl_ms, t.default_ttl_ms), d.message_id, d.correlation_id, d.causation_id, \
                   d.message_type, d.content_type, d.reply_to, d.properties, \
                   CASE WHEN d.impossible THEN $10 \
                        WHEN t.requires_session AND d.session_id IS NULL THEN $15 \
                        WHEN x.expires_at <= $2 THEN $7 END, \
                   CASE WHEN d.scheduled_at IS NULL THEN $13 \
                        WHEN d.impossible THEN $11 || coalesce(to_char(d.scheduled_at AT TIME ZONE 'UTC', \
                          'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), d.scheduled_at::text) || $12 \
                        WHEN t.requires_session AND d.session_id IS NULL \
                        THEN 'the subscription requires sessions and the message has no session id' \
                        WHEN x.expires_at <= $2 THEN 'the message expired before it was received' END, \
                   CASE WHEN d.impossible OR (t.requires_session AND d.session_id IS NULL) \
                     OR x.expires_at <= $2 THEN t.path END, d.body \
                 FROM d JOIN no USING (ord) JOIN t ON (d.entity_id = $1 OR t.id = d.entity_id) \
                 CROSS JOIN LATERAL (SELECT CASE WHEN NOT d.impossible \
                     AND LEAST(d.ttl_ms, t.default_ttl_ms) IS NOT NULL \
                   THEN d.scheduled_at + LEAST(d.ttl_ms, t.default_ttl_ms, 3162240000000) \
                     * interval '1 millisecond' END AS expires_at) x \
                 RETURNING entity_id, state, dl_reason, message_id)"
    };
}

async fn maintain(shared: &Shared, entity: &EntityInfo, now: DateTime<Utc>) -> Result<()> {
    let rows = bind(
        sqlx::query(concat!(
            "WITH ",
            activation!(),
            ", \
         orphaned AS (UPDATE courier.message m SET locked_until = $2 WHERE m.id IN ( \
                   SELECT id FROM courier.message o WHERE o.entity_id = $3 AND o.locked_until > $2 \
                   AND (o.holder IS NULL OR o.locked_until > $14 OR NOT EXISTS (SELECT 1 FROM pg_locks l \
                     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
                     AND l.classid::bigint = o.holder >> 32 AND l.objid::bigint = o.holder & 2147483647)) \
                   ORDER BY o.locked_until LIMIT $6 FOR UPDATE SKIP LOCKED) RETURNING m.entity_id), \
         expired AS (SELECT id FROM courier.message WHERE entity_id = $3 AND state IN (0, 2) \
                   AND expires_at <= $2 AND (locked_until IS NULL OR locked_until <= $2) \
                   LIMIT $6 FOR UPDATE SKIP LOCKED), \
         exhausted AS (SELECT id FROM courier.message WHERE entity_id = $3 AND state + 0 = 0 \
                   AND locked_until <= $2 AND delivery_count >= $4 LIMIT $6 FOR UPDATE SKIP LOCKED), \
         dead AS (UPDATE courier.message m SET state = 3, locked_until = NULL, \
                   dl_reason = CASE WHEN m.expires_at <= $2 THEN $7 ELSE $8 END, \
                   dl_description = CASE WHEN m.expires_at <= $2 \
                       THEN 'the message expired before it was received' \
                       ELSE 'the message was delivered ' || m.delivery_count || ' times without being settled' END, \
                   dl_source = $5 \
                 WHERE m.id IN (SELECT id FROM expired UNION SELECT id FROM exhausted) \
                 RETURNING m.entity_id, m.dl_reason, m.message_id), \
         woke AS (SELECT count(pg_notify('courier_transport', x.entity_id::text)) AS n \
                 FROM (SELECT entity_id FROM act UNION SELECT entity_id FROM dead \
                       UNION SELECT entity_id FROM orphaned) x), \
         gone AS (SELECT dl_reason AS reason, count(*) AS n, min(message_id) AS first, max(message_id) AS last FROM \
                 (SELECT dl_reason, message_id FROM act WHERE state = 3 \
                  UNION ALL SELECT dl_reason, message_id FROM dead) g GROUP BY dl_reason) \
         SELECT gone.reason, gone.n, gone.first, gone.last, woke.n FROM woke LEFT JOIN gone ON true"
        )),
        entity,
        now,
        None,
    )
    .fetch_all(&shared.pool)
    .await
    .map_err(|e| shared.closed_or(db_error("cannot activate scheduled or expired messages", e)))?;
    report(shared, entity, "maintenance", &rows);
    Ok(())
}

/// Binds the parameters of the maintenance's statements (each uses some of them; sqlx
/// declares every type): `only` limits the activation to one row.
fn bind<'q>(
    q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    entity: &'q EntityInfo,
    now: DateTime<Utc>,
    only: Option<i64>,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    q.bind(entity.schedule_owner())
        .bind(now)
        .bind(entity.id)
        .bind(entity.max_delivery_count)
        .bind(&entity.path)
        .bind(BATCH)
        .bind(reasons::TTL_EXPIRED)
        .bind(reasons::MAX_DELIVERY_COUNT_EXCEEDED)
        // A scheduled row no sender could have written (another program's: more than 100
        // years ahead, or no time) is "due" at once, dead-lettered instead of activated.
        .bind(now + MAX_SCHEDULE_AHEAD)
        .bind(reasons::INVALID_WIRE_FORMAT)
        .bind(FAR_SCHEDULE[0])
        .bind(FAR_SCHEDULE[1])
        .bind(NO_SCHEDULED_TIME)
        .bind(now + Duration::milliseconds(entity.lock_ms.saturating_add(LOCK_SLACK_MS)))
        .bind(SESSION_ID_MISSING)
        .bind(only)
}

/// The most due scheduled rows [`isolate`] tries one by one after the maintenance failed.
const ISOLATE_ROWS: i64 = 20;

/// After the maintenance failed: activates `entity`'s due scheduled rows one at a time,
/// and dead-letters (`courier.InvalidWireFormat`, the database's error as the
/// description) each one whose activation fails on its own, so that one row Postgres
/// refuses to activate (an index entry too large, a trigger of the application's) does
/// not hold back the activation of the others. Returns how many it dead-lettered.
async fn isolate(shared: &Shared, entity: &EntityInfo, now: DateTime<Utc>) -> Result<u64> {
    let due: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM courier.message WHERE entity_id IN ($1, $2) AND state = 1 \
         AND (scheduled_at <= $3 OR scheduled_at > $4) ORDER BY scheduled_at, id LIMIT $5",
    )
    .bind(entity.schedule_owner())
    .bind(entity.id)
    .bind(now)
    .bind(now + MAX_SCHEDULE_AHEAD)
    .bind(ISOLATE_ROWS)
    .fetch_all(&shared.pool)
    .await
    .map_err(|e| shared.closed_or(db_error("cannot look for the due scheduled messages", e)))?;
    let mut refused = 0;
    for id in due {
        let one = bind(
            sqlx::query(concat!(
                "WITH ",
                activation!(),
                ", woke AS (SELECT count(pg_notify('courier_transport', x.entity_id::text)) AS n \
                   FROM (SELECT DISTINCT entity_id FROM act) x) SELECT n FROM woke"
            )),
            entity,
            now,
            Some(id),
        )
        .execute(&shared.pool)
        .await;
        let Err(e) = one else { continue };
        let e = shared.closed_or(db_error("cannot activate the scheduled message", e));
        if matches!(e.kind(), ErrorKind::Closed) {
            return Err(e);
        }
        let why = format!("the scheduled message could not be activated: {e}");
        let done: Option<String> = sqlx::query_scalar(
            "UPDATE courier.message SET state = 3, dl_reason = $2, dl_description = $3, dl_source = $4 \
             WHERE id = $1 AND state = 1 RETURNING message_id",
        )
        .bind(id)
        .bind(reasons::INVALID_WIRE_FORMAT)
        .bind(&why)
        .bind(&entity.path)
        .fetch_optional(&shared.pool)
        .await
        .map_err(|e| shared.closed_or(db_error("cannot dead-letter a message that cannot be activated", e)))?;
        if let Some(message_id) = done {
            refused += 1;
            if dead_lettered(
                shared,
                entity,
                reasons::INVALID_WIRE_FORMAT,
                1,
                &message_id,
                &message_id,
            ) {
                tracing::warn!(
                queue = %Escaped(&entity.path),
                    message_id = %Escaped(&message_id),
                    description = %Escaped(&why),
                    "a scheduled message could not be activated: it was dead-lettered"
                );
            }
        }
    }
    Ok(refused)
}

/// Dead-letters `entity`'s rows that no claim takes and the maintenance does not look
/// for (each part reads more than what it finds, so it runs at most every
/// [`SWEEP_EVERY_MS`]): waiting rows without a session id in an entity that requires
/// sessions (`SessionIdMissing`), waiting rows over the max delivery count that are not
/// locked (`MaxDeliveryCountExceeded`), and, for a subscription, its topic's rows that
/// are not scheduled (a topic holds only scheduled messages: another program's row is
/// fanned out to the subscriptions as published, or as a dead letter if it was one).
async fn sweep(shared: &Shared, entity: &EntityInfo, now: DateTime<Utc>) -> Result<()> {
    let rows = sqlx::query(
        "WITH nosession AS (UPDATE courier.message m SET state = 3, locked_until = NULL, dl_reason = $6, \
                   dl_description = 'the queue requires sessions and the message has no session id', dl_source = $5 \
                 WHERE m.id IN (SELECT id FROM courier.message WHERE $7 AND entity_id = $1 AND state IN (0, 2) \
                   AND session_id IS NULL AND (locked_until IS NULL OR locked_until <= $2) \
                   LIMIT $4 FOR UPDATE SKIP LOCKED) RETURNING m.dl_reason, m.message_id), \
         idle AS (UPDATE courier.message m SET state = 3, dl_reason = $8, \
                   dl_description = 'the message has a delivery count of ' || m.delivery_count \
                     || ', at or over the max delivery count, without being locked', dl_source = $5 \
                 WHERE m.id IN (SELECT id FROM courier.message WHERE entity_id = $1 AND state = 0 \
                   AND locked_until IS NULL AND delivery_count >= $3 LIMIT $4 FOR UPDATE SKIP LOCKED) \
                 RETURNING m.dl_reason, m.message_id), \
         stray AS (DELETE FROM courier.message m WHERE m.id IN (SELECT id FROM courier.message \
                   WHERE $9 AND entity_id = $10 AND state <> 1 ORDER BY seq LIMIT $4 FOR UPDATE SKIP LOCKED) \
                 RETURNING m.*), \
         t AS (SELECT id, path, default_ttl_ms, requires_session FROM courier.entity WHERE $9 AND parent = $10 \
               AND kind = 2), \
         fanned AS (INSERT INTO courier.message (entity_id, seq, state, session_id, enqueued_at, expires_at, \
                   ttl_ms, message_id, correlation_id, causation_id, message_type, content_type, reply_to, \
                   properties, dl_reason, dl_description, dl_source, body) \
                 SELECT t.id, s.seq, \
                   CASE WHEN s.state = 3 OR (t.requires_session AND s.session_id IS NULL) THEN 3 ELSE 0 END, \
                   s.session_id, s.enqueued_at, s.expires_at, s.ttl_ms, s.message_id, s.correlation_id, \
                   s.causation_id, s.message_type, s.content_type, s.reply_to, s.properties, \
                   CASE WHEN s.state = 3 THEN coalesce(s.dl_reason, $11) \
                        WHEN t.requires_session AND s.session_id IS NULL THEN $6 END, \
                   CASE WHEN s.state = 3 THEN coalesce(s.dl_description, \
                          'a dead-lettered row was written to the topic itself') \
                        WHEN t.requires_session AND s.session_id IS NULL \
                        THEN 'the subscription requires sessions and the message has no session id' END, \
                   CASE WHEN s.state = 3 THEN coalesce(s.dl_source, t.path) \
                        WHEN t.requires_session AND s.session_id IS NULL THEN t.path END, s.body \
                 FROM stray s CROSS JOIN t RETURNING entity_id, state, dl_reason, message_id), \
         woke AS (SELECT count(pg_notify('courier_transport', x.entity_id::text)) AS n \
                 FROM (SELECT $1 AS entity_id FROM (SELECT 1 FROM nosession UNION ALL SELECT 1 FROM idle) y \
                       UNION SELECT entity_id FROM fanned) x), \
         gone AS (SELECT dl_reason AS reason, count(*) AS n, min(message_id) AS first, max(message_id) AS last FROM \
                 (SELECT dl_reason, message_id FROM nosession UNION ALL SELECT dl_reason, message_id FROM idle \
                  UNION ALL SELECT dl_reason, message_id FROM fanned WHERE state = 3) g GROUP BY dl_reason) \
         SELECT gone.reason, gone.n, gone.first, gone.last, woke.n FROM woke LEFT JOIN gone ON true",
    )
    .bind(entity.id)
    .bind(now)
    .bind(entity.max_delivery_count)
    .bind(BATCH)
    .bind(&entity.path)
    .bind(SESSION_ID_MISSING)
    .bind(entity.requires_session)
    .bind(reasons::MAX_DELIVERY_COUNT_EXCEEDED)
    .bind(entity.kind == Kind::Subscription)
    .bind(entity.parent)
    .bind(reasons::INVALID_WIRE_FORMAT)
    .fetch_all(&shared.pool)
    .await
    .map_err(|e| shared.closed_or(db_error("cannot sweep the queue for rows no receive takes", e)))?;
    report(shared, entity, "sweep", &rows);
    Ok(())
}
