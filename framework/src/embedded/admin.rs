//! The operations API's writes on the embedded broker's file, through the engine's
//! connection (a lease, the way a handler's transaction gets it): moving a dead letter
//! back to its queue or subscription, deleting one, completing a saga instance. Each is ONE SQLite
//! transaction, so an interrupted resubmit leaves the message either in the dead-letter
//! sub-queue or back in its queue. The reads are in `crate::admin::embedded`.

use std::time::Duration;

use bytes::Bytes;
use sqlx::{Row, SqliteConnection};
use tokio::sync::oneshot;

use super::Embedded;
use super::engine::{Finish, Lease};
use crate::admin::{AdminError, AdminResult, CompletedSaga};
use crate::error::{Error, ErrorKind};
use crate::message::{Envelope, Properties, SequenceNumber};
use crate::recoverability::headers;

fn conn(lease: &mut Lease) -> AdminResult<&mut SqliteConnection> {
    lease
        .conn()
        .ok_or_else(|| AdminError::from(Error::new(ErrorKind::Closed)))
}

async fn begin(lease: &mut Lease, what: &'static str) -> AdminResult<()> {
    sqlx::query("BEGIN IMMEDIATE")
        .execute(conn(lease)?)
        .await
        .map_err(|e| AdminError::db(what, e))?;
    Ok(())
}

/// The id of the queue or subscription (`topic/subscriptions/name`) `name` whose dead
/// letters are changed.
async fn entity_id(conn: &mut SqliteConnection, name: &str) -> AdminResult<i64> {
    match name.split_once("/subscriptions/") {
        Some((topic, sub)) => sqlx::query_scalar(
            "SELECT s.id FROM courier_entity s JOIN courier_entity t ON t.id = s.parent \
             WHERE t.parent = 0 AND t.kind = 1 AND t.name = ?1 AND s.kind = 2 AND s.name = ?2",
        )
        .bind(topic)
        .bind(sub),
        None => sqlx::query_scalar("SELECT id FROM courier_entity WHERE parent = 0 AND kind = 0 AND name = ?1")
            .bind(name),
    }
    .fetch_optional(conn)
    .await
    .map_err(|e| AdminError::db("cannot look up a queue", e))?
    .ok_or_else(|| AdminError::not_found(format!("queue {name}")))
}

/// The headers a failed handling wrote: not carried back to the queue, so the resubmitted
/// message starts its retries again (the delayed retries counted too).
fn is_failure_header(name: &str) -> bool {
    name == headers::DELAYED_RETRIES || name.starts_with("courier.failure.")
}

impl Embedded {
    /// Moves dead letter `seq` of `queue` (a queue or `topic/subscriptions/name`) back to
    /// it in one transaction: the row leaves the dead-letter sub-queue and a message with
    /// the same id, body and headers (the failure headers removed) is enqueued, delivery
    /// count zero; a subscription's goes back to that subscription alone. `false`
    /// when it is not there (or a receiver of the dead-letter sub-queue holds it).
    pub(crate) async fn resubmit_dead_letter(&self, queue: &str, seq: SequenceNumber) -> AdminResult<bool> {
        let mut lease = self.lease().await.map_err(AdminError::from_error)?;
        begin(&mut lease, "cannot begin resubmitting a dead letter").await?;
        let entity = entity_id(conn(&mut lease)?, queue).await?;
        let now = super::engine::micros(self.shared.clock.now());
        // Dropping the lease before it is given back rolls this DELETE back.
        let row = sqlx::query(
            "DELETE FROM courier_message WHERE entity_id = ?1 AND seq = ?2 AND state = 3 \
             AND (locked_until IS NULL OR locked_until <= ?3) RETURNING message_id, correlation_id, causation_id, \
             message_type, content_type, reply_to, properties, session_id, ttl_ms, body",
        )
        .bind(entity)
        .bind(seq)
        .bind(now)
        .fetch_optional(conn(&mut lease)?)
        .await
        .map_err(|e| AdminError::db("cannot take a dead letter", e))?;
        let Some(row) = row else {
            return Ok(false);
        };
        let envelope = envelope_of(&row).map_err(|e| AdminError::db("cannot read a dead letter", e))?;
        let (reply, rx) = oneshot::channel();
        lease.give_back(Some(Finish {
            complete: None,
            sends: Vec::new(),
            put_back: Some((entity, vec![envelope])),
            max_message_size: self.shared.max_message_size,
            reply,
        }));
        rx.await
            .map_err(|_| AdminError::from(Error::new(ErrorKind::Closed)))?
            .map_err(AdminError::from_error)?;
        Ok(true)
    }

    /// Moves the dead letters `seqs` of queue `queue` back to the queue in ONE transaction
    /// (each of them moves or none does), in sequence order; returns the sequence numbers
    /// moved (those not there are left out).
    pub(crate) async fn resubmit_dead_letters(
        &self,
        queue: &str,
        seqs: &[SequenceNumber],
    ) -> AdminResult<Vec<SequenceNumber>> {
        let mut lease = self.lease().await.map_err(AdminError::from_error)?;
        begin(&mut lease, "cannot begin resubmitting dead letters").await?;
        let entity = entity_id(conn(&mut lease)?, queue).await?;
        let now = super::engine::micros(self.shared.clock.now());
        let wanted = serde_json::to_string(seqs).unwrap_or_else(|_| "[]".into());
        // Dropping the lease before it is given back rolls this DELETE back.
        let rows = sqlx::query(
            "DELETE FROM courier_message WHERE entity_id = ?1 AND state = 3 \
             AND (locked_until IS NULL OR locked_until <= ?2) AND seq IN (SELECT value FROM json_each(?3)) \
             RETURNING message_id, correlation_id, causation_id, message_type, content_type, reply_to, properties, \
             session_id, ttl_ms, body, seq",
        )
        .bind(entity)
        .bind(now)
        .bind(wanted)
        .fetch_all(conn(&mut lease)?)
        .await
        .map_err(|e| AdminError::db("cannot take dead letters", e))?;
        let mut taken = Vec::with_capacity(rows.len());
        for row in &rows {
            let seq: SequenceNumber = row
                .try_get(10)
                .map_err(|e| AdminError::db("cannot read a dead letter", e))?;
            let envelope = envelope_of(row).map_err(|e| AdminError::db("cannot read a dead letter", e))?;
            taken.push((seq, envelope));
        }
        if taken.is_empty() {
            return Ok(Vec::new());
        }
        taken.sort_by_key(|(seq, _)| *seq);
        let moved: Vec<SequenceNumber> = taken.iter().map(|(seq, _)| *seq).collect();
        let (reply, rx) = oneshot::channel();
        lease.give_back(Some(Finish {
            complete: None,
            sends: Vec::new(),
            put_back: Some((entity, taken.into_iter().map(|(_, e)| e).collect())),
            max_message_size: self.shared.max_message_size,
            reply,
        }));
        rx.await
            .map_err(|_| AdminError::from(Error::new(ErrorKind::Closed)))?
            .map_err(AdminError::from_error)?;
        Ok(moved)
    }

    /// Deletes the dead letters `seqs` of queue `queue` in one transaction; returns those
    /// deleted.
    pub(crate) async fn delete_dead_letters(
        &self,
        queue: &str,
        seqs: &[SequenceNumber],
    ) -> AdminResult<Vec<SequenceNumber>> {
        let mut lease = self.lease().await.map_err(AdminError::from_error)?;
        begin(&mut lease, "cannot begin deleting dead letters").await?;
        let entity = entity_id(conn(&mut lease)?, queue).await?;
        let now = super::engine::micros(self.shared.clock.now());
        let wanted = serde_json::to_string(seqs).unwrap_or_else(|_| "[]".into());
        let mut deleted: Vec<SequenceNumber> = sqlx::query_scalar(
            "DELETE FROM courier_message WHERE entity_id = ?1 AND state = 3 \
             AND (locked_until IS NULL OR locked_until <= ?2) AND seq IN (SELECT value FROM json_each(?3)) \
             RETURNING seq",
        )
        .bind(entity)
        .bind(now)
        .bind(wanted)
        .fetch_all(conn(&mut lease)?)
        .await
        .map_err(|e| AdminError::db("cannot delete dead letters", e))?;
        commit(&mut lease, "cannot commit deleting dead letters").await?;
        deleted.sort_unstable();
        Ok(deleted)
    }

    /// Deletes dead letter `seq` of queue `queue`; `false` when it is not there.
    pub(crate) async fn delete_dead_letter(&self, queue: &str, seq: SequenceNumber) -> AdminResult<bool> {
        let mut lease = self.lease().await.map_err(AdminError::from_error)?;
        begin(&mut lease, "cannot begin deleting a dead letter").await?;
        let entity = entity_id(conn(&mut lease)?, queue).await?;
        let now = super::engine::micros(self.shared.clock.now());
        let deleted = sqlx::query(
            "DELETE FROM courier_message WHERE entity_id = ?1 AND seq = ?2 AND state = 3 \
             AND (locked_until IS NULL OR locked_until <= ?3)",
        )
        .bind(entity)
        .bind(seq)
        .bind(now)
        .execute(conn(&mut lease)?)
        .await
        .map_err(|e| AdminError::db("cannot delete a dead letter", e))?
        .rows_affected();
        commit(&mut lease, "cannot commit deleting a dead letter").await?;
        Ok(deleted == 1)
    }

    /// Completes (deletes) a saga instance with its timeouts and properties.
    pub(crate) async fn complete_saga_by_hand(&self, saga_type: &str, correlation: &str) -> AdminResult<CompletedSaga> {
        let mut lease = self.lease().await.map_err(AdminError::from_error)?;
        begin(&mut lease, "cannot begin completing a saga instance").await?;
        // An error drops the lease, which rolls back.
        let done = crate::admin::sqlite_complete(conn(&mut lease)?, saga_type, correlation).await?;
        commit(&mut lease, "cannot commit completing a saga instance").await?;
        Ok(done)
    }
}

/// Commits the lease's transaction; the lease then goes back with nothing to finish (the
/// engine's rollback finds no transaction).
async fn commit(lease: &mut Lease, what: &'static str) -> AdminResult<()> {
    sqlx::query("COMMIT")
        .execute(conn(lease)?)
        .await
        .map_err(|e| AdminError::db(what, e))?;
    Ok(())
}

fn envelope_of(row: &sqlx::sqlite::SqliteRow) -> std::result::Result<Envelope, sqlx::Error> {
    let properties: Properties = match row.try_get::<Option<String>, _>(6)? {
        Some(json) => serde_json::from_str(&json).map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        None => Properties::new(),
    };
    let ttl_ms: Option<i64> = row.try_get(8)?;
    let body: Vec<u8> = row.try_get(9)?;
    Ok(Envelope {
        message_id: row.try_get(0)?,
        correlation_id: row.try_get(1)?,
        causation_id: row.try_get(2)?,
        message_type: row.try_get(3)?,
        content_type: row.try_get(4)?,
        reply_to: row.try_get(5)?,
        properties: properties
            .into_iter()
            .filter(|(name, _)| !is_failure_header(name))
            .collect(),
        session_id: row.try_get(7)?,
        time_to_live: ttl_ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        scheduled_enqueue_time: None,
        body: Bytes::from(body),
    })
}
