//! The operations API's writes on the embedded broker's file, through the engine's
//! connection (a lease, the way a handler's transaction gets it): moving a dead letter
//! back to its queue or subscription, deleting one, completing a saga instance. Each is ONE SQLite
//! transaction, so an interrupted resubmit leaves the message either in the dead-letter
//! sub-queue or back in its queue. The reads are in `crate::admin::embedded`.

use sqlx::SqliteConnection;
use tokio::sync::oneshot;

use super::Embedded;
use super::engine::{Finish, Lease};
use crate::admin::{AdminError, AdminResult, CompletedSaga};
use crate::error::{Error, ErrorKind};
use crate::message::SequenceNumber;

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
        None => {
            sqlx::query_scalar("SELECT id FROM courier_entity WHERE parent = 0 AND kind = 0 AND name = ?1").bind(name)
        }
    }
    .fetch_optional(conn)
    .await
    .map_err(|e| AdminError::db("cannot look up a queue", e))?
    .ok_or_else(|| AdminError::not_found(format!("queue {name}")))
}

/// What a batch of changes did: the sequence numbers changed (in order), and those
/// refused with the reason (still in the dead-letter sub-queue).
#[derive(Debug, Default)]
pub(crate) struct Moved {
    pub(crate) done: Vec<SequenceNumber>,
    pub(crate) refused: Vec<(SequenceNumber, String)>,
}

impl Embedded {
    /// Moves the dead letters `seqs` of `queue` (a queue or `topic/subscriptions/name`)
    /// back to it in ONE transaction (each of them moves or none does), in place
    /// (`engine/put_back.rs`): the same message id, body, headers (the failure headers
    /// removed) and sequence number, delivery count zero; a subscription's go back to that
    /// subscription alone.
    /// Those not there (or held by a receiver of the dead-letter sub-queue) are left out;
    /// those the entity would refuse (no session id where sessions are required) stay
    /// where they are and are returned with the reason.
    pub(crate) async fn resubmit_dead_letters(&self, queue: &str, seqs: &[SequenceNumber]) -> AdminResult<Moved> {
        let mut lease = self.lease().await.map_err(AdminError::from_error)?;
        begin(&mut lease, "cannot begin resubmitting dead letters").await?;
        let entity = entity_id(conn(&mut lease)?, queue).await?;
        let now = super::engine::micros(self.shared.clock.now());
        let wanted = serde_json::to_string(seqs).unwrap_or_else(|_| "[]".into());
        // Dropping the lease before it is given back rolls this transaction back.
        // Two JSON arrays in one row, not a row a message (each row crosses the driver's
        // channel, which cost more than the move itself).
        let (movable, refused): (String, String) = sqlx::query_as(
            "SELECT json_group_array(seq) FILTER (WHERE NOT refused), json_group_array(seq) FILTER (WHERE refused) \
             FROM (SELECT m.seq, m.session_id IS NULL AND e.requires_session <> 0 AS refused FROM courier_message m \
             JOIN courier_entity e ON e.id = m.entity_id WHERE m.entity_id = ?1 AND m.state = 3 \
             AND (m.locked_until IS NULL OR m.locked_until <= ?2) AND m.seq IN (SELECT value FROM json_each(?3)))",
        )
        .bind(entity)
        .bind(now)
        .bind(wanted)
        .fetch_one(conn(&mut lease)?)
        .await
        .map_err(|e| AdminError::db("cannot find dead letters", e))?;
        let seqs_of = |json: &str| -> AdminResult<Vec<SequenceNumber>> {
            let mut seqs: Vec<SequenceNumber> = serde_json::from_str(json)
                .map_err(|e| AdminError::db("cannot find dead letters", sqlx::Error::Decode(Box::new(e))))?;
            seqs.sort_unstable();
            Ok(seqs)
        };
        let moved = Moved {
            done: seqs_of(&movable)?,
            refused: seqs_of(&refused)?
                .into_iter()
                .map(|seq| {
                    let why = format!("it has no session id and {queue} requires sessions: it can only be deleted");
                    (seq, why)
                })
                .collect(),
        };
        if moved.done.is_empty() {
            return Ok(moved);
        }
        let (reply, rx) = oneshot::channel();
        lease.give_back(Some(Finish {
            complete: Vec::new(),
            sends: Vec::new(),
            put_back: Some((entity, moved.done.clone())),
            max_message_size: self.shared.max_message_size,
            history: Vec::new(),
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
