//! What the broker does with the rows it finds when it opens a file. Another program may
//! write rows into `courier_message` while no broker has the file open
//! (docs/embedded-broker.md, "Rows written by another program"): the table refuses what
//! no Courier sender writes (`migrations/sqlite/20261129000002_embedded_row_checks.sql`),
//! and what it admits is handled here row by row, so that no row stops a queue, breaks a
//! send, or sits where no receive looks.
//!
//! Holds: `open_file` (all of it, in one transaction, before the engine serves anything),
//! `release_locks` (locks are volatile; a row no lock may take again is dead-lettered),
//! `sync_sequences` and `sync_sequence` (rows numbered at or past their counter get its
//! next numbers: also run after a rollback and when an entity is created),
//! `sweep_sessions` (rows of an entity that requires sessions that no session receiver
//! can take) and `publish_topic_rows` (rows written to a topic itself).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use sqlx::Row;

use crate::checks::{MAX_MESSAGE_ID_LEN, quoted};
use crate::logtext::Escaped;
use crate::message::reasons::{INVALID_WIRE_FORMAT, MAX_DELIVERY_COUNT_EXCEEDED};

use super::commands::Kind;
use super::entities::load_entities;
use super::rows::{
    DeadMark, Fields, MAX_STORED_DELIVERY_COUNT, NewRow, ReadMessage, SEQ_BITS, SESSION_ID_MISSING,
    SESSION_ID_MISSING_DESCRIPTION, Sql, lossy_text, row_id,
};
use super::timers::{dead_letter_impossible_schedules, refresh_due_times};
use super::{DEAD, Engine, READY};

/// What a dead-lettering names as its source, in SQL, for the row's `entity_id`: the
/// entity's display name (`queue`, `topic/subscriptions/name`), as `EntityInfo::display`.
macro_rules! display_sql {
    () => {
        "(SELECT CASE WHEN e.kind = 2 THEN coalesce((SELECT t.name FROM courier_entity t WHERE t.id = e.parent), '') \
         || '/subscriptions/' || e.name ELSE e.name END FROM courier_entity e WHERE e.id = entity_id)"
    };
}

/// A row no lock may take again: locked (`state` 4) or ready at its entity's max delivery
/// count, or deferred at the largest count a row holds. `?1` is that count.
macro_rules! exhausted {
    () => {
        "((state IN (0, 4) AND delivery_count > 0 AND delivery_count >= coalesce((SELECT e.max_delivery_count \
         FROM courier_entity e WHERE e.id = entity_id), ?1 + 1)) OR (state = 2 AND delivery_count >= ?1))"
    };
}

/// Every ASCII character but NUL (which would end `ltrim`'s set), for `ltrim`.
static ASCII: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| (1_u8..=0x7f).map(char::from).collect());

/// Dead-letterings when the file opens, by queue and reason: how many, and the first
/// message id.
#[derive(Default)]
struct Tally(BTreeMap<(String, String), (u64, String)>);

impl Tally {
    /// Notes a row of `queue` (its path) dead-lettered with `reason`.
    fn add(&mut self, queue: &str, reason: &str, message_id: String) {
        let entry = self
            .0
            .entry((queue.to_owned(), reason.to_owned()))
            .or_insert((0, message_id));
        entry.0 += 1;
    }

    /// Counts them in `courier.messages.dead_lettered` (as every dead-lettering of the
    /// broker's own), and logs one line per queue and reason.
    fn log(self) {
        for ((queue, reason), (count, first)) in self.0 {
            crate::endpoint::metrics::count_dead_lettered("embedded", &queue, &reason, count);
            tracing::warn!(
                queue = %Escaped(&queue),
                reason = %reason,
                count,
                first_message_id = %Escaped(&first),
                "rows found in the broker's file that no receive would take were dead-lettered when it opened"
            );
        }
    }
}

impl Engine {
    /// Makes the file's rows ready to be served: in one transaction, releases the locks a
    /// previous process left, gives rows written without their own sequence number one,
    /// dead-letters what no receive would ever take, and publishes rows written to a
    /// topic itself; then reads the next due times.
    pub(super) async fn open_file(&mut self) -> Sql {
        sqlx::query("BEGIN IMMEDIATE").execute(self.conn.get()?).await?;
        let mut tally = Tally::default();
        let result: Sql = async {
            self.release_locks(&mut tally).await?;
            load_entities(self.conn.get()?, &mut self.state).await?;
            self.sync_sequences().await?;
            dead_letter_impossible_schedules(self.conn.get()?, &self.state).await?;
            self.sweep_sessions(&mut tally).await?;
            self.publish_topic_rows(&mut tally).await?;
            self.flush_sequences().await?;
            sqlx::query("COMMIT").execute(self.conn.get()?).await?;
            Ok(())
        }
        .await;
        if let Err(e) = result {
            self.state.dead.clear();
            if let Ok(c) = self.conn.get() {
                let _ = sqlx::query("ROLLBACK").execute(c).await;
            }
            return Err(e);
        }
        tally.log();
        self.report_dead();
        self.state.touched.clear();
        refresh_due_times(self.conn.get()?, &mut self.state).await
    }

    /// Locks are volatile (S2.7): whatever a previous process held is released, and its
    /// locked messages are ready again with their delivery count kept. A row that no lock
    /// may take again is dead-lettered (`MaxDeliveryCountExceeded`): a locked one whose
    /// lock was its last delivery (S2.6, as when a lock expires), a ready one at or over
    /// its max delivery count (another program's row: no receive takes it), a deferred
    /// one at the largest count a row holds. One statement, one pass over the table.
    async fn release_locks(&mut self, tally: &mut Tally) -> Sql {
        let rows = sqlx::query(concat!(
            "UPDATE courier_message SET locked_until = NULL, \
             state = CASE WHEN ",
            exhausted!(),
            " THEN 3 WHEN state = 4 THEN 0 ELSE state END, \
             dl_reason = CASE WHEN ",
            exhausted!(),
            " THEN ?2 ELSE dl_reason END, \
             dl_description = CASE WHEN NOT ",
            exhausted!(),
            " THEN dl_description \
               WHEN state = 4 THEN 'the message was delivered ' || delivery_count || ' times without being settled' \
               WHEN state = 2 THEN 'the deferred message has a delivery count of ' || delivery_count \
                 || ', the most a message counts: it cannot be received again' \
               ELSE 'the message has a delivery count of ' || delivery_count || ', at or over the max delivery \
                 count of its queue, without being locked: no receive takes it' END, \
             dl_source = CASE WHEN ",
            exhausted!(),
            " THEN ",
            display_sql!(),
            " ELSE dl_source END \
             WHERE state = 4 OR locked_until IS NOT NULL OR ",
            exhausted!(),
            " RETURNING state, dl_reason, message_id, dl_source"
        ))
        .bind(MAX_STORED_DELIVERY_COUNT)
        .bind(MAX_DELIVERY_COUNT_EXCEEDED)
        .fetch_all(self.conn.get()?)
        .await?;
        for row in rows {
            let state: i64 = row.try_get(0)?;
            // Read as bytes: another program's reason may not be UTF-8.
            let reason: Option<Vec<u8>> = row.try_get_unchecked(1)?;
            if state == DEAD && reason.as_deref() == Some(MAX_DELIVERY_COUNT_EXCEEDED.as_bytes()) {
                tally.add(&lossy_text(&row, 3)?, MAX_DELIVERY_COUNT_EXCEEDED, lossy_text(&row, 2)?);
            }
        }
        sqlx::query("UPDATE courier_session SET locked_until = NULL WHERE locked_until IS NOT NULL")
            .execute(self.conn.get()?)
            .await?;
        Ok(())
    }

    /// [`sync_sequence`](Self::sync_sequence) for every counter (queues and topics).
    pub(super) async fn sync_sequences(&mut self) -> Sql {
        let counters: Vec<i64> = self
            .state
            .entities
            .values()
            .filter(|e| e.kind != Kind::Subscription)
            .map(|e| e.id)
            .collect();
        for id in counters {
            self.sync_sequence(id).await?;
        }
        Ok(())
    }

    /// Rows of `counter`'s entity (and of its subscriptions, which take a topic's numbers)
    /// numbered at or past its next number were written by another program that did not
    /// raise `next_seq`: a send would be given their number again and fail on the row id.
    /// They get the counter's next numbers instead, in the order of their own (copies of
    /// one topic message keep one number), and the counter moves past them. Reads one
    /// range of row ids per entity: nothing when there is no such row.
    pub(super) async fn sync_sequence(&mut self, counter: i64) -> Sql {
        let Some(info) = self.state.entities.get(&counter) else {
            return Ok(());
        };
        let next = info.next_seq;
        let shown = info.display.clone();
        let mut members = vec![counter];
        members.extend(self.state.subscriptions.get(&counter).into_iter().flatten().copied());
        let mut found: Vec<(i64, i64)> = Vec::new();
        for entity in members {
            let rows: Vec<(i64, i64)> =
                sqlx::query_as("SELECT entity_id, seq FROM courier_message WHERE id >= ?1 AND id < ?2 ORDER BY id")
                    .bind(row_id(entity, next.min(1 << SEQ_BITS)))
                    .bind(row_id(entity + 1, 0))
                    .fetch_all(self.conn.get()?)
                    .await?;
            found.extend(rows);
        }
        if found.is_empty() {
            return Ok(());
        }
        let mut seqs: Vec<i64> = found.iter().map(|(_, s)| *s).collect();
        seqs.sort_unstable();
        seqs.dedup();
        let count = i64::try_from(seqs.len()).unwrap_or(i64::MAX);
        let last = seqs.last().copied().unwrap_or(next);
        let new_next = if next.saturating_add(count) <= 1 << SEQ_BITS {
            // Ascending, each row moves to a number no higher than its own, which no row
            // holds any more: no two rows ever share an id.
            found.sort_by_key(|(_, s)| *s);
            for (entity, seq) in &found {
                let index = seqs.binary_search(seq).unwrap_or(0);
                let new_seq = next + i64::try_from(index).unwrap_or(0);
                if new_seq != *seq {
                    sqlx::query("UPDATE courier_message SET id = ?1, seq = ?2 WHERE id = ?3")
                        .bind(row_id(*entity, new_seq))
                        .bind(new_seq)
                        .bind(row_id(*entity, *seq))
                        .execute(self.conn.get()?)
                        .await?;
                }
            }
            next + count
        } else {
            // Not enough numbers left to give them: the counter moves past the last (its
            // entity has then used up its numbers).
            (last + 1).min(1 << SEQ_BITS)
        };
        tracing::warn!(
            entity = %shown,
            rows = found.len(),
            next_seq = new_next,
            "rows written without raising their entity's next_seq were given its next sequence numbers"
        );
        if let Some(info) = self.state.entities.get_mut(&counter) {
            info.next_seq = new_next;
            self.state.dirty_seq.insert(counter);
        }
        Ok(())
    }

    /// In each entity that requires sessions, dead-letters the rows waiting to be
    /// received (ready or deferred) that no session receiver can take: without a session
    /// id (`SessionIdMissing`), or with one no receiver can name (empty, over 128 bytes,
    /// not UTF-8: `courier.InvalidWireFormat`, the session id named).
    async fn sweep_sessions(&mut self, tally: &mut Tally) -> Sql {
        let entities: Vec<(i64, String)> = self
            .state
            .entities
            .values()
            .filter(|e| e.requires_session)
            .map(|e| (e.id, e.display.clone()))
            .collect();
        for (entity, display) in entities {
            let (lo, hi) = (row_id(entity, 0), row_id(entity + 1, 0));
            let missing = sqlx::query(
                "UPDATE courier_message SET state = 3, dl_reason = ?3, dl_description = ?4, dl_source = ?5 \
                 WHERE id >= ?1 AND id < ?2 AND state IN (0, 2) AND session_id IS NULL RETURNING message_id",
            )
            .bind(lo)
            .bind(hi)
            .bind(SESSION_ID_MISSING)
            .bind(SESSION_ID_MISSING_DESCRIPTION)
            .bind(&display)
            .fetch_all(self.conn.get()?)
            .await?;
            for row in &missing {
                tally.add(&display, SESSION_ID_MISSING, lossy_text(row, 0)?);
            }
            let sized = sqlx::query(
                "UPDATE courier_message SET state = 3, dl_reason = ?3, dl_source = ?5, \
                 dl_description = 'no receiver can accept the message''s session: session_id has ' \
                   || length(CAST(session_id AS BLOB)) || ' bytes; Courier''s session ids have 1 to ' || ?4 \
                 WHERE id >= ?1 AND id < ?2 AND state IN (0, 2) AND session_id IS NOT NULL \
                 AND length(CAST(session_id AS BLOB)) NOT BETWEEN 1 AND ?4 RETURNING message_id",
            )
            .bind(lo)
            .bind(hi)
            .bind(INVALID_WIRE_FORMAT)
            .bind(i64::try_from(MAX_MESSAGE_ID_LEN).unwrap_or(i64::MAX))
            .bind(&display)
            .fetch_all(self.conn.get()?)
            .await?;
            for row in &sized {
                tally.add(&display, INVALID_WIRE_FORMAT, lossy_text(row, 0)?);
            }
            // Only a session id that is not all ASCII can fail to be UTF-8 (`ltrim` of
            // every ASCII character leaves something): those few are read and checked.
            let other: Vec<(i64, Vec<u8>, Vec<u8>)> = sqlx::query_as(
                "SELECT id, CAST(session_id AS BLOB), CAST(message_id AS BLOB) FROM courier_message \
                 WHERE id >= ?1 AND id < ?2 AND state IN (0, 2) AND session_id IS NOT NULL \
                 AND ltrim(session_id, ?3) <> ''",
            )
            .bind(lo)
            .bind(hi)
            .bind(ASCII.as_str())
            .fetch_all(self.conn.get()?)
            .await?;
            for (id, session, message_id) in other {
                if std::str::from_utf8(&session).is_ok() {
                    continue;
                }
                sqlx::query(
                    "UPDATE courier_message SET state = 3, dl_reason = ?2, dl_description = ?3, dl_source = ?4 \
                     WHERE id = ?1",
                )
                .bind(id)
                .bind(INVALID_WIRE_FORMAT)
                .bind(format!(
                    "no receiver can accept the message's session: session_id is not UTF-8: \"{}\"",
                    quoted(&session)
                ))
                .bind(&display)
                .execute(self.conn.get()?)
                .await?;
                tally.add(
                    &display,
                    INVALID_WIRE_FORMAT,
                    String::from_utf8_lossy(&message_id).into_owned(),
                );
            }
        }
        Ok(())
    }

    /// A topic holds only scheduled messages (fanned out when they are due). Another
    /// program's row written to the topic itself in another state is published as if sent
    /// now: a new sequence number of the topic, a copy for each subscription, ready (or
    /// dead-lettered with the row's reason and description, if it was written as a dead
    /// letter). With no subscription, no one keeps it, as for a message sent to the topic.
    async fn publish_topic_rows(&mut self, tally: &mut Tally) -> Sql {
        let topics: Vec<i64> = self
            .state
            .entities
            .values()
            .filter(|e| e.kind == Kind::Topic)
            .map(|e| e.id)
            .collect();
        let now = self.state.now();
        for topic in topics {
            let rows = sqlx::query(concat!(
                "SELECT ",
                columns!(),
                " FROM courier_message WHERE id >= ?1 AND id < ?2 AND state <> 1 ORDER BY id"
            ))
            .bind(row_id(topic, 0))
            .bind(row_id(topic + 1, 0))
            .fetch_all(self.conn.get()?)
            .await?;
            for row in rows {
                let id: i64 = row.try_get(0)?;
                let state: i64 = row.try_get(2)?;
                let ReadMessage { message, .. } = match self.state.row_to_message(&row, now, false) {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::error!(topic, error = %e, "a row written to a topic could not be read: it stays");
                        continue;
                    }
                };
                let seq = match self.state.alloc_seq(topic, 1) {
                    Ok(seq) => seq,
                    Err(e) => {
                        tracing::error!(topic, error = %e, "a row written to a topic could not be numbered: it stays");
                        continue;
                    }
                };
                let was_dead = state == DEAD;
                let broker = &message.broker;
                let mark = was_dead.then(|| {
                    (
                        broker
                            .dead_letter_reason
                            .clone()
                            .unwrap_or_else(|| INVALID_WIRE_FORMAT.to_owned()),
                        broker.dead_letter_description.clone(),
                        broker.dead_letter_source.clone(),
                    )
                });
                let ttl = message
                    .envelope
                    .time_to_live
                    .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                let message_id = message.envelope.message_id.clone();
                let fields = Arc::new(Fields::from_message(message));
                let mut copies: Vec<NewRow> = Vec::new();
                self.state.fan_out(topic, seq, ttl, None, &fields, now, &mut copies);
                if let Some((reason, description, source)) = &mark {
                    for c in &mut copies {
                        let display = self.state.entities.get(&c.entity).map(|e| e.display.clone());
                        c.state = DEAD;
                        c.expires_at = None;
                        c.dead = Some(DeadMark {
                            reason: Cow::Owned(reason.clone()),
                            description: description.clone(),
                            source: source.clone().or(display).unwrap_or_default(),
                        });
                    }
                }
                for c in copies.iter().filter(|c| !was_dead && c.state != READY) {
                    if let Some(d) = &c.dead {
                        tally.add(&self.state.display_of(c.entity), &d.reason, message_id.clone());
                    }
                }
                sqlx::query("DELETE FROM courier_message WHERE id = ?1")
                    .bind(id)
                    .execute(self.conn.get()?)
                    .await?;
                self.insert_rows(&copies).await?;
                tracing::warn!(
                    topic,
                    sequence_number = seq,
                    copies = copies.len(),
                    message_id = %Escaped(&message_id),
                    "a row written to a topic itself was published to its subscriptions"
                );
            }
        }
        Ok(())
    }
}

/// The migration that made the tables STRICT (`20261129000002_embedded_row_checks.sql`) on
/// a file another program wrote before it: the broker opens (before, a text in a time
/// column failed the opening), rows that break a rule are dead-lettered with the column
/// named, a row whose id did not say its entity and number gets one, and only what no
/// queue holds is deleted.
#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::sync::Arc;
    use std::time::Duration;

    use sqlx::sqlite::SqliteConnectOptions;
    use sqlx::{ConnectOptions, Connection};

    use crate::Embedded;
    use crate::clock::{Clock, VirtualClock};
    use crate::entity::EntityPath;
    use crate::message::reasons::INVALID_WIRE_FORMAT;
    use crate::transport::Transport;

    /// The first migration with the rules.
    const RULES: i64 = 20261129000002;

    #[tokio::test]
    async fn a_file_written_before_the_rules_opens_and_its_rows_are_mended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let mut conn = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .connect()
            .await
            .unwrap();
        let mut before = crate::store::sqlite::migrator();
        before.migrations = Cow::Owned(
            before
                .migrations
                .iter()
                .filter(|m| m.version < RULES)
                .cloned()
                .collect(),
        );
        before.run(&mut conn).await.unwrap();
        let clock = VirtualClock::starting_now();
        let now = clock.now().timestamp_micros();
        // A queue (1, counter at 3), a topic (2) with a subscription (3), and an entity of a
        // kind no broker knows (4).
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "INSERT INTO courier_entity (id, kind, parent, name, lock_duration_ms, max_delivery_count, next_seq, \
             created_at) VALUES (1, 0, 0, 'q', 60000, 10, 3, {now}), (2, 1, 0, 't', 60000, 10, 1, {now}), \
             (3, 2, 2, 's', 60000, 10, 1, {now}), (4, 7, 0, 'odd', 60000, 10, 1, {now})"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        let q = 1_i64 << 40;
        let rows: &[(i64, i64, i64, &str, &str)] = &[
            // (id, entity_id, seq, message_id, the other columns as `name = value` pairs)
            (q | 1, 1, 1, "good", ""),
            (q | 2, 1, 2, "text-schedule", "state = 1, scheduled_at = 'abc'"),
            (12345, 1, 7, "bad-id", ""),
            (q | 4, 1, 4, "negative-count", "delivery_count = -5"),
            (q | 5, 1, 5, "dead-no-reason", "state = 3"),
            (99 << 40 | 1, 99, 1, "orphan", ""),
            (777, 99, 3, "bad-id-orphan", ""),
            (q | 8, 1, 8, "ttl-zero", "ttl_ms = 0"),
            (q | 9, 1, 9, "blob-texts", "correlation_id = x'6869', body = '{}'"),
            (q | 10, 1, 10, "real-expiry", "expires_at = 1.5"),
            (q | 11, 1, 11, "deferred-never-delivered", "state = 2"),
            (q | 12, 1, 12, "unknown-state", "state = 9"),
        ];
        for (id, entity, seq, message_id, other) in rows {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "INSERT INTO courier_message (id, entity_id, seq, state, enqueued_at, message_id, body) \
                 VALUES ({id}, {entity}, {seq}, 0, {now}, '{message_id}', x'7b7d')"
            )))
            .execute(&mut conn)
            .await
            .unwrap();
            if !other.is_empty() {
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "UPDATE courier_message SET {other} WHERE id = {id}"
                )))
                .execute(&mut conn)
                .await
                .unwrap();
            }
        }
        conn.close().await.unwrap();

        let broker = Embedded::builder()
            .path(&path)
            .clock(Arc::new(clock.clone()))
            .open()
            .await
            .unwrap();
        let queue = EntityPath::queue("q");
        let receiver = broker.receiver(&queue).await.unwrap();
        let got = receiver.receive(100, Duration::ZERO).await.unwrap();
        let received: Vec<(&str, i64)> = got
            .iter()
            .map(|d| (d.message().message_id(), d.message().sequence_number()))
            .collect();
        // The bad id was numbered after every number in use (12), in the queue.
        assert_eq!(received, [("good", 1), ("blob-texts", 9), ("bad-id", 13)]);
        let blob = &got[1].message().envelope;
        assert_eq!(blob.correlation_id.as_deref(), Some("hi"));
        assert_eq!(&blob.body[..], b"{}");
        let dead = broker.peek(&queue.clone().dead_letter(), 0, 100).await.unwrap();
        let dead: Vec<(&str, &str, &str)> = dead
            .iter()
            .map(|m| {
                (
                    m.message_id(),
                    m.broker.dead_letter_reason.as_deref().unwrap_or_default(),
                    m.broker.dead_letter_description.as_deref().unwrap_or_default(),
                )
            })
            .collect();
        let named = [
            ("text-schedule", "scheduled_at was 'abc'"),
            ("negative-count", "delivery_count was -5"),
            ("dead-no-reason", "without a description"),
            ("ttl-zero", "ttl_ms was 0"),
            ("real-expiry", "expires_at was 1.5"),
            ("deferred-never-delivered", "never delivered"),
            ("unknown-state", "state was 9"),
        ];
        assert_eq!(dead.len(), named.len(), "{dead:?}");
        for ((id, reason, description), (want_id, want)) in dead.iter().zip(named) {
            assert_eq!(*id, want_id);
            assert_eq!(*reason, INVALID_WIRE_FORMAT, "{id}");
            assert!(description.contains(want), "{id}: {description}");
        }
        // The orphan whose id said its (missing) entity is kept as it was; the one whose id
        // did not is deleted; so is the entity of an unknown kind.
        let left: Vec<String> = sqlx::query_scalar("SELECT message_id FROM courier_message WHERE entity_id = 99")
            .fetch_all(broker.read_pool())
            .await
            .unwrap();
        assert_eq!(left, ["orphan"]);
        let kinds: Vec<i64> = sqlx::query_scalar("SELECT kind FROM courier_entity ORDER BY id")
            .fetch_all(broker.read_pool())
            .await
            .unwrap();
        assert_eq!(kinds, [0, 1, 2]);
        let strict: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pragma_table_list WHERE name IN ('courier_message', 'courier_entity') AND strict",
        )
        .fetch_one(broker.read_pool())
        .await
        .unwrap();
        assert_eq!(strict, 2);
        // A send takes the number after them.
        let sender = broker.sender("q", crate::SenderOptions::default()).await.unwrap();
        sender
            .send_batch(vec![crate::Envelope::new("{}").with_message_id("new")])
            .await
            .unwrap();
        for d in got {
            d.complete().await.unwrap();
        }
        let new = receiver.receive(100, Duration::ZERO).await.unwrap();
        assert_eq!(new.len(), 1);
        assert_eq!(new[0].message().sequence_number(), 14);
        broker.close().await;
    }
}
