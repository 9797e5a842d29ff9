//! What the clock makes due: scheduled messages becoming active, locks expiring (a
//! message ready again, or dead-lettered past its max delivery count), messages whose
//! time to live ran out (dead-lettered), and session locks expiring.
//!
//! Holds: `maintenance`, run at the start of every batch, the steps it calls
//! (`activate`, `unlock_expired`, `sweep_expired`), and `refresh_due_times`, which reads
//! the next due times after a start or a rollback. The batch loop sleeps until the
//! earliest of them. Nothing here answers a command.

use std::sync::Arc;

use sqlx::Row;
use sqlx::sqlite::SqliteConnection;

use crate::checks::{Refusal, impossible_schedule, stored_refusal};
use crate::message::reasons;
use crate::message::reasons::INVALID_WIRE_FORMAT;

use super::commands::Kind;
use super::rows::{
    DeadMark, Fields, NewRow, ReadMessage, SESSION_ID_MISSING, SESSION_ID_MISSING_DESCRIPTION, Sql, after_ms,
    entity_of, lossy_text, micros, row_id,
};
use super::{DEAD, Engine, READY, State};

/// The most scheduled messages activated in one statement.
pub(super) const ACTIVATION_BATCH: i64 = 1000;

impl Engine {
    /// Gives back locks of receivers that went away, activates due scheduled messages,
    /// releases expired locks (dead-lettering messages past their max delivery count),
    /// dead-letters expired messages, and wakes waiters whose sessions may be free.
    pub(super) async fn maintenance(&mut self, now: i64) -> Sql {
        for (id, dc) in std::mem::take(&mut self.state.releases) {
            let r = sqlx::query(
                "UPDATE courier_message SET state = 0, locked_until = NULL, delivery_count = delivery_count - 1 \
                 WHERE id = ?1 AND delivery_count = ?2 AND state = 4",
            )
            .bind(id)
            .bind(dc)
            .execute(self.conn.get()?)
            .await?;
            if r.rows_affected() == 0 {
                // A deferred or dead-lettered message keeps its state; only unlock it.
                sqlx::query(
                    "UPDATE courier_message SET locked_until = NULL, delivery_count = delivery_count - 1 \
                     WHERE id = ?1 AND delivery_count = ?2 AND state IN (2, 3) AND locked_until IS NOT NULL",
                )
                .bind(id)
                .bind(dc)
                .execute(self.conn.get()?)
                .await?;
            }
            self.state.touched.insert(entity_of(id));
        }
        if self.state.next_scheduled.is_some_and(|t| t <= now) {
            self.activate(now).await?;
        }
        if self.state.next_unlock.is_some_and(|t| t <= now) {
            self.unlock_expired(now).await?;
        }
        if self.state.next_expiry.is_some_and(|t| t <= now) {
            self.sweep_expired(now).await?;
        }
        if self.state.next_session_unlock.is_some_and(|t| t <= now) {
            let waiting: Vec<i64> = self.state.waiters.keys().copied().collect();
            self.state.touched.extend(waiting);
            self.state.next_session_unlock = sqlx::query_scalar::<_, Option<i64>>(
                "SELECT MIN(locked_until) FROM courier_session WHERE locked_until > ?1",
            )
            .bind(now)
            .fetch_one(self.conn.get()?)
            .await?;
        }
        Ok(())
    }

    pub(super) async fn activate(&mut self, now: i64) -> Sql {
        loop {
            let rows = sqlx::query(concat!(
                "SELECT ",
                columns!(),
                " FROM courier_message WHERE state = 1 AND scheduled_at <= ?1 ORDER BY scheduled_at, id LIMIT ?2"
            ))
            .bind(now)
            .bind(ACTIVATION_BATCH)
            .fetch_all(self.conn.get()?)
            .await?;
            let n = rows.len();
            let mut new_rows = Vec::new();
            for row in rows {
                let old_id: i64 = row.try_get(0)?;
                let entity = entity_of(old_id);
                let Some(info) = self.state.entities.get(&entity).cloned() else {
                    // No queue, topic or subscription holds it (its entity was never
                    // created): nothing could ever receive it.
                    tracing::warn!(
                        entity,
                        "a scheduled message of an entity that does not exist was removed when due"
                    );
                    sqlx::query("DELETE FROM courier_message WHERE id = ?1")
                        .bind(old_id)
                        .execute(self.conn.get()?)
                        .await?;
                    continue;
                };
                let ReadMessage { message, unreadable } = match self.state.row_to_message(&row, now, false) {
                    Ok(m) => m,
                    Err(e) => {
                        // Not even lossily readable: it stays, dead-lettered where it is,
                        // for an operator to see (never dropped).
                        let why = e.to_string();
                        self.state
                            .dead_lettered(&info.display, INVALID_WIRE_FORMAT, 1, "", "", &why);
                        sqlx::query(
                            "UPDATE courier_message SET state = 3, scheduled_at = NULL, dl_reason = ?2, dl_description = ?3, dl_source = ?4 \
                             WHERE id = ?1",
                        )
                        .bind(old_id)
                        .bind(INVALID_WIRE_FORMAT)
                        .bind(why)
                        .bind(&info.display)
                        .execute(self.conn.get()?)
                        .await?;
                        self.state.touched.insert(entity);
                        continue;
                    }
                };
                // Enqueued as if sent now: a new sequence number (of its topic's counter, for
                // a subscription's row) and enqueued time (S5.4). With no number left, it
                // stays where it is, dead-lettered: never dropped.
                let seq = match self.state.alloc_seq(entity, 1) {
                    Ok(seq) => seq,
                    Err(e) => {
                        let why = format!("the scheduled message could not be activated: {e}");
                        let id = message.envelope.message_id.clone();
                        self.state
                            .dead_lettered(&info.display, INVALID_WIRE_FORMAT, 1, &id, &id, &why);
                        sqlx::query(
                            "UPDATE courier_message SET state = 3, dl_reason = ?2, dl_description = ?3, dl_source = ?4 \
                             WHERE id = ?1",
                        )
                        .bind(old_id)
                        .bind(INVALID_WIRE_FORMAT)
                        .bind(why)
                        .bind(&info.display)
                        .execute(self.conn.get()?)
                        .await?;
                        self.state.touched.insert(entity);
                        continue;
                    }
                };
                sqlx::query("DELETE FROM courier_message WHERE id = ?1")
                    .bind(old_id)
                    .execute(self.conn.get()?)
                    .await?;
                let refusal = stored_refusal(
                    unreadable,
                    &message.envelope,
                    self.state.max_message_size,
                    "EmbeddedBuilder::max_message_size",
                );
                let scheduled_at = message.envelope.scheduled_enqueue_time.map(micros);
                let ttl = message
                    .envelope
                    .time_to_live
                    .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                let fields = Arc::new(Fields::from_message(message));
                let first_new = new_rows.len();
                if info.kind == Kind::Topic {
                    self.state
                        .fan_out(entity, seq, ttl, scheduled_at, &fields, now, &mut new_rows);
                } else {
                    // Another program's row without a session id, in an entity that
                    // requires sessions: no session receiver would take it.
                    let dead = (info.requires_session && fields.session_id.is_none()).then(|| DeadMark {
                        reason: SESSION_ID_MISSING.into(),
                        description: Some(SESSION_ID_MISSING_DESCRIPTION.to_owned()),
                        source: info.display.clone(),
                    });
                    new_rows.push(NewRow {
                        id: row_id(entity, seq),
                        entity,
                        seq,
                        state: if dead.is_some() { DEAD } else { READY },
                        enqueued_at: now,
                        scheduled_at,
                        expires_at: if dead.is_some() {
                            None
                        } else {
                            ttl.map(|ms| after_ms(now, ms))
                        },
                        ttl_ms: ttl,
                        dead,
                        fields,
                    });
                }
                if let Some(Refusal {
                    reason,
                    description: why,
                }) = refusal
                {
                    // Text that is not UTF-8, properties that are not JSON, an id or a size
                    // no sender accepts: the copies go to the dead-letter sub-queue with the
                    // reason, not to receivers (counted and logged by `insert_rows`).
                    for r in &mut new_rows[first_new..] {
                        let source = self.state.entities.get(&r.entity).map(|e| e.display.clone());
                        r.state = DEAD;
                        r.expires_at = None;
                        r.dead = Some(DeadMark {
                            reason: reason.into(),
                            description: Some(why.clone()),
                            source: source.unwrap_or_else(|| info.display.clone()),
                        });
                    }
                }
            }
            self.insert_rows(&new_rows).await?;
            if (n as i64) < ACTIVATION_BATCH {
                break;
            }
        }
        self.state.next_scheduled =
            sqlx::query_scalar::<_, Option<i64>>("SELECT MIN(scheduled_at) FROM courier_message WHERE state = 1")
                .fetch_one(self.conn.get()?)
                .await?;
        Ok(())
    }

    /// Expired locks: a locked message is ready again (S2.5), or dead-lettered if it has
    /// been delivered as often as its queue allows (S2.6); a deferred or dead-lettered one
    /// stays where it is, unlocked. Waiters of those entities are served.
    pub(super) async fn unlock_expired(&mut self, now: i64) -> Sql {
        // Those the update below dead-letters, to count and log them.
        let dying = sqlx::query(
            "SELECT m.message_id, m.entity_id, m.delivery_count FROM courier_message m JOIN courier_entity e \
             ON e.id = m.entity_id WHERE m.locked_until IS NOT NULL AND m.locked_until <= ?1 AND m.state = 4 \
             AND m.delivery_count >= e.max_delivery_count",
        )
        .bind(now)
        .fetch_all(self.conn.get()?)
        .await?;
        for row in &dying {
            let id = lossy_text(row, 0)?;
            let queue = self.state.display_of(row.try_get(1)?);
            let count: i64 = row.try_get_unchecked(2)?;
            let why = format!("the message was delivered {count} times without being settled");
            self.state
                .dead_lettered(&queue, reasons::MAX_DELIVERY_COUNT_EXCEEDED, 1, &id, &id, &why);
        }
        let rows = sqlx::query(
            "WITH e AS (SELECT id, name, max_delivery_count AS max FROM courier_entity) \
             UPDATE courier_message SET locked_until = NULL, \
             state = CASE WHEN state <> 4 THEN state \
                 WHEN delivery_count >= (SELECT max FROM e WHERE e.id = entity_id) THEN 3 ELSE 0 END, \
             dl_reason = CASE WHEN state = 4 AND delivery_count >= (SELECT max FROM e WHERE e.id = entity_id) \
                 THEN ?2 ELSE dl_reason END, \
             dl_description = CASE WHEN state = 4 AND delivery_count >= (SELECT max FROM e WHERE e.id = entity_id) \
                 THEN 'the message was delivered ' || delivery_count || ' times without being settled' \
                 ELSE dl_description END, \
             dl_source = CASE WHEN state = 4 AND delivery_count >= (SELECT max FROM e WHERE e.id = entity_id) \
                 THEN (SELECT name FROM e WHERE e.id = entity_id) ELSE dl_source END \
             WHERE locked_until IS NOT NULL AND locked_until <= ?1 RETURNING entity_id",
        )
        .bind(now)
        .bind(reasons::MAX_DELIVERY_COUNT_EXCEEDED)
        .fetch_all(self.conn.get()?)
        .await?;
        for row in rows {
            self.state.touched.insert(row.try_get(0)?);
        }
        self.state.next_unlock = sqlx::query_scalar::<_, Option<i64>>(
            "SELECT MIN(locked_until) FROM courier_message WHERE locked_until IS NOT NULL",
        )
        .fetch_one(self.conn.get()?)
        .await?;
        Ok(())
    }

    pub(super) async fn sweep_expired(&mut self, now: i64) -> Sql {
        let moved = sqlx::query(
            "UPDATE courier_message SET state = 3, locked_until = NULL, dl_reason = ?2, \
             dl_description = 'the message expired before it was received', \
             dl_source = (SELECT name FROM courier_entity e WHERE e.id = entity_id) \
             WHERE state IN (0, 2) AND expires_at IS NOT NULL AND expires_at <= ?1 \
             AND (locked_until IS NULL OR locked_until <= ?1) RETURNING entity_id, message_id",
        )
        .bind(now)
        .bind(reasons::TTL_EXPIRED)
        .fetch_all(self.conn.get()?)
        .await?;
        for row in &moved {
            let id = lossy_text(row, 1)?;
            let queue = self.state.display_of(row.try_get(0)?);
            self.state.dead_lettered(
                &queue,
                reasons::TTL_EXPIRED,
                1,
                &id,
                &id,
                "the message expired before it was received",
            );
        }
        for row in moved {
            // Receivers of the dead-letter sub-queue may be waiting.
            self.state.touched.insert(row.try_get(0)?);
        }
        self.state.next_expiry = sqlx::query_scalar::<_, Option<i64>>(
            "SELECT MIN(expires_at) FROM courier_message WHERE expires_at IS NOT NULL AND expires_at > ?1 \
             AND state IN (0, 2)",
        )
        .bind(now)
        .fetch_one(self.conn.get()?)
        .await?;
        Ok(())
    }
}

/// Dead-letters the scheduled rows no Courier sender could have written (another
/// program's): due more than 100 years after `now`, or without a scheduled time. They
/// would never become due; in the dead-letter sub-queue an operator sees them, with a
/// description naming the time (the row's own time is cleared: it is no time). Run when the broker opens (another program writes the
/// file while no broker has it open).
pub(super) async fn dead_letter_impossible_schedules(conn: &mut SqliteConnection, state: &State) -> Sql<usize> {
    let now = state.clock.now();
    let horizon = micros(now + crate::checks::MAX_SCHEDULE_AHEAD);
    let rows: Vec<(i64, i64, Option<i64>)> = sqlx::query_as(
        "SELECT id, entity_id, scheduled_at FROM courier_message WHERE state = 1 \
         AND (scheduled_at IS NULL OR scheduled_at > ?1)",
    )
    .bind(horizon)
    .fetch_all(&mut *conn)
    .await?;
    for (id, entity, at) in &rows {
        let at = at.map(super::rows::from_micros);
        let Some(why) = impossible_schedule(at, now) else {
            continue;
        };
        let source = state.entities.get(entity).map(|e| e.display.clone());
        crate::endpoint::metrics::count_dead_lettered("embedded", &state.display_of(*entity), INVALID_WIRE_FORMAT, 1);
        tracing::warn!(entity = ?source, reason = INVALID_WIRE_FORMAT, description = %why,
            "a scheduled message no sender could have scheduled: it was dead-lettered");
        sqlx::query(
            "UPDATE courier_message SET state = 3, scheduled_at = NULL, dl_reason = ?2, dl_description = ?3, \
             dl_source = ?4 WHERE id = ?1",
        )
        .bind(id)
        .bind(INVALID_WIRE_FORMAT)
        .bind(&why)
        .bind(source)
        .execute(&mut *conn)
        .await?;
    }
    Ok(rows.len())
}

pub(super) async fn refresh_due_times(conn: &mut SqliteConnection, state: &mut State) -> Sql {
    let one = |sql: &'static str| sqlx::query_scalar::<_, Option<i64>>(sql);
    state.next_scheduled = one("SELECT MIN(scheduled_at) FROM courier_message WHERE state = 1")
        .fetch_one(&mut *conn)
        .await?;
    state.next_unlock = one("SELECT MIN(locked_until) FROM courier_message WHERE locked_until IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    state.next_expiry =
        one("SELECT MIN(expires_at) FROM courier_message WHERE expires_at IS NOT NULL AND state IN (0, 2)")
            .fetch_one(&mut *conn)
            .await?;
    state.next_session_unlock = one("SELECT MIN(locked_until) FROM courier_session WHERE locked_until IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    Ok(())
}
