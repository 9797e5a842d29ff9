//! Browsing (S6.1) and counts: read without locking or changing anything. Both first do
//! the time-driven work of the entity (activation, expiry), so that they show the states
//! a receive would see at the same clock time.

use sqlx::Row;

use super::Shared;
use super::entities::EntityInfo;
use super::rows::{columns, rows_to_messages};
use super::upkeep::run as maintain;
use crate::entity::{EntityCounts, SubQueue};
use crate::error::Result;
use crate::message::{ReceivedMessage, SequenceNumber};
use crate::store::db_error;

/// The most messages one peek returns.
const MAX_PEEK: usize = 5000;

/// Up to `max` messages of `entity` from sequence number `from` on: active, scheduled and
/// deferred ones on the main sub-queue, dead-lettered ones on the dead-letter sub-queue.
pub(crate) async fn peek(
    shared: &Shared,
    entity: &EntityInfo,
    sub_queue: SubQueue,
    from: SequenceNumber,
    max: usize,
) -> Result<Vec<ReceivedMessage>> {
    shared.check_open()?;
    let now = shared.clock.now();
    maintain(shared, entity, now).await?;
    let sql = match sub_queue {
        SubQueue::Main => concat!(
            "SELECT ",
            columns!(),
            " FROM courier.message m WHERE m.entity_id = $1 AND m.seq >= $2 AND m.state IN (0, 1, 2) \
             ORDER BY m.seq LIMIT $3"
        ),
        SubQueue::DeadLetter => concat!(
            "SELECT ",
            columns!(),
            " FROM courier.message m WHERE m.entity_id = $1 AND m.seq >= $2 AND m.state = 3 \
             ORDER BY m.seq LIMIT $3"
        ),
    };
    let rows = sqlx::query(sql)
        .bind(entity.id)
        .bind(from)
        .bind(i64::try_from(max.min(MAX_PEEK)).unwrap_or(1))
        .fetch_all(&shared.pool)
        .await
        .map_err(|e| shared.closed_or(db_error("cannot browse the messages", e)))?;
    rows_to_messages(&rows, now, None)
}

/// The messages of `entity` by state.
pub(crate) async fn counts(shared: &Shared, entity: &EntityInfo) -> Result<EntityCounts> {
    shared.check_open()?;
    maintain(shared, entity, shared.clock.now()).await?;
    let rows = sqlx::query("SELECT state, count(*) FROM courier.message WHERE entity_id = $1 GROUP BY state")
        .bind(entity.id)
        .fetch_all(&shared.pool)
        .await
        .map_err(|e| shared.closed_or(db_error("cannot count the messages", e)))?;
    let mut c = EntityCounts::default();
    for row in rows {
        let get = |e| db_error("cannot read the message counts", e);
        let state: i16 = row.try_get(0).map_err(get)?;
        let n = u64::try_from(row.try_get::<i64, _>(1).map_err(get)?).unwrap_or(0);
        match state {
            0 => c.active = n,
            1 => c.scheduled = n,
            2 => c.deferred = n,
            _ => c.dead_lettered = n,
        }
    }
    Ok(c)
}
