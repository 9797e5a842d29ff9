//! Queues and dead letters of the Postgres transport ([`PostgresTransport`](crate::PostgresTransport)):
//! [`QueueAdmin`] on [`PostgresAdmin`], over the tables `courier.entity` and
//! `courier.message` of the same database as the store (one set of migrations, so every
//! migrated database has them; a database where the transport never ran has no queues).
//!
//! A dead letter of this transport is a row of `courier.message` in state 3 that keeps
//! its row; a resubmit is ONE `UPDATE` of that row (state 0, a new sequence number,
//! delivery count 0, the failure headers and dead-letter columns cleared, a new enqueued
//! time), so a message is never in both places nor in neither: the row is in one state
//! or the other. Many are moved a chunk of [`CHUNK`] rows per statement (each row moves
//! whole; a chunk commits or not), with one `pg_notify` per chunk for waiting receivers.
//! A subscription's dead letter stays the subscription's row: a resubmit puts it back in
//! that subscription, it is not published to the topic again.
//!
//! Reads do not do the transport's time-driven work (activating due scheduled messages,
//! expiring): they change nothing, so counts may show a due message as scheduled until
//! a receiver of the entity runs.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::model::{failure_chain, failure_text};
use super::postgres::{col, count};
use super::{
    AdminError, AdminResult, BatchOutcome, BodyView, DeadLetter, DeadLetterSummary, EntityKind, Page, PostgresAdmin,
    QueueAdmin, QueueSummary, page_size,
};
use crate::message::{Properties, SequenceNumber};
use crate::recoverability::headers;

/// How many dead letters one statement moves or deletes.
pub(crate) const CHUNK: usize = 1000;

/// The properties of a resubmitted message: those of the dead letter without the
/// failure headers the endpoint wrote and the delayed-retry count and its seal (so its
/// retries start again): the headers of `recoverability::headers::is_failure_header`
/// (`$4` is `FAILURE_HEADERS`); `NULL` when none are left.
const KEPT_PROPERTIES: &str = "(SELECT jsonb_object_agg(p.key, p.value) FROM jsonb_each( \
     CASE WHEN jsonb_typeof(m.properties) = 'object' THEN m.properties END) p \
     WHERE p.key <> ALL($4) AND p.key NOT LIKE 'courier.failure.%')";

fn delivery_count(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

fn properties(json: Option<String>) -> Properties {
    json.and_then(|j| serde_json::from_str(&j).ok()).unwrap_or_default()
}

fn summary(r: &PgRow) -> AdminResult<DeadLetterSummary> {
    let headers = properties(col(r, 7)?);
    let description: Option<String> = col(r, 6)?;
    Ok(DeadLetterSummary {
        sequence_number: col(r, 0)?,
        message_id: col(r, 1)?,
        message_type: col(r, 2)?,
        enqueued_at: col(r, 3)?,
        delivery_count: delivery_count(col(r, 4)?),
        reason: col(r, 5)?,
        error: failure_text(&headers, description.as_deref()),
        resubmit_refused: None,
    })
}

impl PostgresAdmin {
    /// The id and kind of a queue, topic or subscription (`topic/subscriptions/name`) of
    /// the transport.
    async fn entity(&self, name: &str) -> AdminResult<(i64, EntityKind)> {
        let found: Option<(i64, i16)> = match name.split_once("/subscriptions/") {
            Some((topic, sub)) => sqlx::query_as(
                "SELECT s.id, s.kind FROM courier.entity s JOIN courier.entity t ON t.id = s.parent \
                 WHERE t.parent = 0 AND t.kind = 1 AND t.name = $1 AND s.name = $2 AND s.kind = 2",
            )
            .bind(topic)
            .bind(sub),
            None => sqlx::query_as("SELECT id, kind FROM courier.entity WHERE parent = 0 AND name = $1").bind(name),
        }
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| AdminError::db("cannot look up a queue of the Postgres transport", e))?;
        match found {
            Some((id, 0)) => Ok((id, EntityKind::Queue)),
            Some((id, 2)) => Ok((id, EntityKind::Subscription)),
            Some((_, _)) => Err(AdminError::refused(format!(
                "{name} is a topic: its messages are in its subscriptions (topic/subscriptions/name)"
            ))),
            None => Err(AdminError::not_found(format!("queue {name}"))),
        }
    }

    /// Moves the dead letters `seqs` (at most [`CHUNK`]) of entity `id` back to it in one
    /// statement; returns the sequence numbers moved. A dead letter locked by a receiver
    /// of the dead-letter sub-queue (or by another admin's statement) is left alone.
    async fn resubmit_chunk(&self, id: i64, seqs: &[SequenceNumber]) -> AdminResult<Vec<SequenceNumber>> {
        let now = self.clock.now();
        let sql = format!(
            "WITH picked AS (SELECT id, seq FROM courier.message WHERE entity_id = $1 AND state = 3 \
                 AND seq = ANY($2) AND (locked_until IS NULL OR locked_until <= $3) \
                 ORDER BY seq FOR UPDATE SKIP LOCKED), \
             numbered AS (SELECT id, seq, nextval('courier.message_seq') AS new_seq \
                 FROM (SELECT id, seq FROM picked ORDER BY seq) o), \
             moved AS (UPDATE courier.message m SET state = 0, seq = n.new_seq, delivery_count = 0, \
                 locked_until = NULL, holder = NULL, enqueued_at = $3, scheduled_at = NULL, \
                 expires_at = CASE WHEN m.ttl_ms IS NOT NULL THEN $3 + m.ttl_ms * interval '1 millisecond' END, \
                 properties = {KEPT_PROPERTIES}, dl_reason = NULL, dl_description = NULL, dl_source = NULL \
                 FROM numbered n WHERE m.id = n.id RETURNING n.seq) \
             SELECT moved.seq, pg_notify('courier_transport', $1::text) FROM moved ORDER BY moved.seq"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(seqs)
            .bind(now)
            .bind(headers::FAILURE_HEADERS.as_slice())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| AdminError::db("cannot resubmit dead letters", e))?;
        rows.iter()
            .map(|r| {
                r.try_get::<i64, _>(0)
                    .map_err(|e| AdminError::db("cannot read a resubmitted dead letter", e))
            })
            .collect()
    }

    /// Deletes the dead letters `seqs` (at most [`CHUNK`]) of entity `id` in one
    /// statement; returns the sequence numbers deleted.
    async fn delete_chunk(&self, id: i64, seqs: &[SequenceNumber]) -> AdminResult<Vec<SequenceNumber>> {
        let mut done: Vec<SequenceNumber> = sqlx::query_scalar(
            "DELETE FROM courier.message m WHERE m.id IN (SELECT id FROM courier.message WHERE entity_id = $1 \
             AND state = 3 AND seq = ANY($2) AND (locked_until IS NULL OR locked_until <= $3) \
             FOR UPDATE SKIP LOCKED) RETURNING m.seq",
        )
        .bind(id)
        .bind(seqs)
        .bind(self.clock.now())
        .fetch_all(&self.pool)
        .await
        .map_err(|e| AdminError::db("cannot delete dead letters", e))?;
        done.sort_unstable();
        Ok(done)
    }

    /// Runs `step` on `seqs` a chunk at a time and reports each sequence number.
    async fn in_chunks<'a, F, Fut>(&self, seqs: &'a [SequenceNumber], step: F) -> AdminResult<BatchOutcome>
    where
        F: Fn(&'a [SequenceNumber]) -> Fut,
        Fut: std::future::Future<Output = AdminResult<Vec<SequenceNumber>>>,
    {
        let mut outcome = BatchOutcome::default();
        for chunk in seqs.chunks(CHUNK) {
            match step(chunk).await {
                Ok(done) => {
                    outcome
                        .not_found
                        .extend(chunk.iter().filter(|s| done.binary_search(s).is_err()));
                    outcome.done.extend(done);
                }
                Err(e) if is_unreachable(&e) => return Err(e),
                Err(e) => {
                    let why = e.to_string();
                    outcome.failed.extend(chunk.iter().map(|s| (*s, why.clone())));
                }
            }
        }
        Ok(outcome)
    }
}

/// Whether an error means the database cannot be used at all (stop a batch there).
fn is_unreachable(e: &AdminError) -> bool {
    matches!(e, AdminError::Unavailable { .. } | AdminError::Refused { .. })
        || matches!(e, AdminError::Failed(inner) if inner.is_transient())
}

#[async_trait]
impl QueueAdmin for PostgresAdmin {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    async fn queues(&self) -> AdminResult<Vec<QueueSummary>> {
        let rows = sqlx::query(
            "SELECT e.kind, CASE WHEN e.kind = 2 THEN p.name || '/subscriptions/' || e.name ELSE e.name END, \
             count(*) FILTER (WHERE m.state = 0 AND (m.locked_until IS NULL OR m.locked_until <= $1)), \
             count(*) FILTER (WHERE m.state = 0 AND m.locked_until > $1), \
             count(*) FILTER (WHERE m.state = 1), count(*) FILTER (WHERE m.state = 2), \
             count(*) FILTER (WHERE m.state = 3), min(m.enqueued_at) FILTER (WHERE m.state = 0) \
             FROM courier.entity e LEFT JOIN courier.entity p ON e.kind = 2 AND p.id = e.parent \
             LEFT JOIN courier.message m ON m.entity_id = e.id GROUP BY e.id, e.kind, e.name, p.name ORDER BY 2",
        )
        .bind(self.clock.now())
        .fetch_all(&self.pool)
        .await
        .map_err(|e| AdminError::db("cannot list the queues of the Postgres transport", e))?;
        rows.iter()
            .map(|r| {
                Ok(QueueSummary {
                    kind: match col::<i16>(r, 0)? {
                        1 => EntityKind::Topic,
                        2 => EntityKind::Subscription,
                        _ => EntityKind::Queue,
                    },
                    name: col(r, 1)?,
                    active: count(col(r, 2)?),
                    locked: count(col(r, 3)?),
                    scheduled: count(col(r, 4)?),
                    deferred: count(col(r, 5)?),
                    dead_lettered: count(col(r, 6)?),
                    oldest_enqueued_at: col(r, 7)?,
                })
            })
            .collect()
    }

    async fn dead_letters(
        &self,
        queue: &str,
        after: SequenceNumber,
        limit: u32,
    ) -> AdminResult<Page<DeadLetterSummary>> {
        let (entity, _) = self.entity(queue).await?;
        let limit = page_size(limit);
        let rows = sqlx::query(
            "SELECT seq, message_id, message_type, enqueued_at, delivery_count, dl_reason, dl_description, \
             properties::text FROM courier.message WHERE entity_id = $1 AND state = 3 AND seq > $2 \
             ORDER BY seq LIMIT $3",
        )
        .bind(entity)
        .bind(after)
        .bind(limit + 1)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| AdminError::db("cannot list dead letters", e))?;
        let total: i64 = sqlx::query_scalar("SELECT count(*) FROM courier.message WHERE entity_id = $1 AND state = 3")
            .bind(entity)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| AdminError::db("cannot count dead letters", e))?;
        let items = rows.iter().map(summary).collect::<AdminResult<Vec<_>>>()?;
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        Ok(Page::of(items, limit, count(total)))
    }

    async fn dead_letter(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<DeadLetter> {
        let (entity, _) = self.entity(queue).await?;
        let r = sqlx::query(
            "SELECT seq, message_id, message_type, correlation_id, causation_id, content_type, session_id, \
             enqueued_at, delivery_count, dl_reason, dl_description, dl_source, properties::text, body \
             FROM courier.message WHERE entity_id = $1 AND seq = $2 AND state = 3 LIMIT 1",
        )
        .bind(entity)
        .bind(sequence_number)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| AdminError::db("cannot read a dead letter", e))?
        .ok_or_else(|| AdminError::not_found(format!("dead letter {sequence_number} of {queue}")))?;
        let headers_ = properties(col(&r, 12)?);
        let description: Option<String> = col(&r, 10)?;
        let body: Vec<u8> = col(&r, 13)?;
        Ok(DeadLetter {
            queue: queue.to_owned(),
            sequence_number: col(&r, 0)?,
            message_id: col(&r, 1)?,
            message_type: col(&r, 2)?,
            correlation_id: col(&r, 3)?,
            causation_id: col(&r, 4)?,
            content_type: col(&r, 5)?,
            session_id: col(&r, 6)?,
            enqueued_at: col(&r, 7)?,
            delivery_count: delivery_count(col(&r, 8)?),
            reason: col(&r, 9)?,
            error: failure_text(&headers_, description.as_deref()),
            error_chain: failure_chain(&headers_, description.as_deref()),
            description,
            source: col(&r, 11)?,
            headers: crate::admin::model::without_seals(headers_),
            body_size: body.len(),
            body: BodyView::decode(&body),
            resubmit_refused: None,
        })
    }

    async fn resubmit(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()> {
        let (entity, _) = self.entity(queue).await?;
        if self.resubmit_chunk(entity, &[sequence_number]).await?.is_empty() {
            return Err(AdminError::not_found(format!(
                "dead letter {sequence_number} of {queue}"
            )));
        }
        Ok(())
    }

    async fn delete_dead_letter(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()> {
        let (entity, _) = self.entity(queue).await?;
        if self.delete_chunk(entity, &[sequence_number]).await?.is_empty() {
            return Err(AdminError::not_found(format!(
                "dead letter {sequence_number} of {queue}"
            )));
        }
        Ok(())
    }

    /// Moves up to 1000 dead letters per statement (each moves whole).
    async fn resubmit_many(&self, queue: &str, sequence_numbers: &[SequenceNumber]) -> AdminResult<BatchOutcome> {
        let (entity, _) = self.entity(queue).await?;
        self.in_chunks(sequence_numbers, |chunk| self.resubmit_chunk(entity, chunk))
            .await
    }

    /// Deletes up to 1000 dead letters per statement.
    async fn delete_many(&self, queue: &str, sequence_numbers: &[SequenceNumber]) -> AdminResult<BatchOutcome> {
        let (entity, _) = self.entity(queue).await?;
        self.in_chunks(sequence_numbers, |chunk| self.delete_chunk(entity, chunk))
            .await
    }

    /// One query, not a page at a time.
    async fn all_dead_letters(&self, queue: &str) -> AdminResult<Vec<SequenceNumber>> {
        let (entity, _) = self.entity(queue).await?;
        sqlx::query_scalar("SELECT seq FROM courier.message WHERE entity_id = $1 AND state = 3 ORDER BY seq")
            .bind(entity)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| AdminError::db("cannot list dead letters", e))
    }
}
