//! Browsing: peeking at messages without locking them, and counting an entity's messages
//! by state. Reads only: nothing here changes a message.

use sqlx::Row;

use crate::entity::{EntityCounts, SubQueue};
use crate::error::Result;
use crate::message::{ReceivedMessage, SequenceNumber};

use super::receive::MAX_RECEIVE;
use super::rows::{ReadMessage, SEQ_BITS, Sql, row_id};
use super::{DEFERRED, Engine, LOCKED, READY, SCHEDULED};

impl Engine {
    pub(super) async fn peek(
        &mut self,
        entity: i64,
        sub_queue: SubQueue,
        from: SequenceNumber,
        max: usize,
        now: i64,
    ) -> Sql<Result<Vec<ReceivedMessage>>> {
        if let Err(e) = self.state.entity(entity) {
            return Ok(Err(e));
        }
        let sql: &'static str = match sub_queue {
            SubQueue::Main => concat!(
                "SELECT ",
                columns!(),
                " FROM courier_message WHERE id >= ?1 AND id < ?2 AND state IN (0, 1, 2, 4) ORDER BY id LIMIT ?3"
            ),
            SubQueue::DeadLetter => concat!(
                "SELECT ",
                columns!(),
                " FROM courier_message WHERE id >= ?1 AND id < ?2 AND state = 3 ORDER BY id LIMIT ?3"
            ),
        };
        let rows = sqlx::query(sql)
            .bind(row_id(entity, from.clamp(0, (1 << SEQ_BITS) - 1)))
            .bind(row_id(entity + 1, 0))
            .bind(i64::try_from(max.min(MAX_RECEIVE)).unwrap_or(1))
            .fetch_all(self.conn.get()?)
            .await?;
        Ok(self.state.rows_to_messages(&rows, now, false).map(ReadMessage::lossy))
    }

    pub(super) async fn counts(&mut self, entity: i64) -> Sql<Result<EntityCounts>> {
        if let Err(e) = self.state.entity(entity) {
            return Ok(Err(e));
        }
        let rows = sqlx::query("SELECT state, COUNT(*) FROM courier_message WHERE id >= ?1 AND id < ?2 GROUP BY state")
            .bind(row_id(entity, 0))
            .bind(row_id(entity + 1, 0))
            .fetch_all(self.conn.get()?)
            .await?;
        let mut c = EntityCounts::default();
        for row in rows {
            let state: i64 = row.try_get(0)?;
            let n = u64::try_from(row.try_get::<i64, _>(1)?).unwrap_or(0);
            match state {
                READY | LOCKED => c.active += n,
                SCHEDULED => c.scheduled = n,
                DEFERRED => c.deferred = n,
                _ => c.dead_lettered = n,
            }
        }
        Ok(Ok(c))
    }
}
