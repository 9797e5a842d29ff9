//! The numbers of the dead letters the operations API saw in a RabbitMQ DLQ and left
//! there (the `in_rabbitmq` rows of `courier.amqp_dead_letter` / `courier_amqp_dead_letter`,
//! see `parked.rs`).
//!
//! A dead letter is numbered the first time a reading of its DLQ meets it, in queue
//! order; it keeps its number at every later reading (its identity, a hash of what a
//! redelivery does not change, is unique per queue), so an operator can list a page, then
//! show, resubmit or delete by the numbers it printed. Copies of one message in a DLQ
//! (at-least-once dead-lettering can leave two) share a number. The row is forgotten when
//! the admin takes the message from the DLQ, or when a reading of the whole DLQ no longer
//! meets it (it left the DLQ another way).

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::parked::{Seen, failed, json_ids};
use super::schedule::ScheduleStore;
use super::wire::millis;
use crate::error::Result;

/// The number of a dead letter, and whether it is in RabbitMQ (else an earlier Courier
/// parked it in the store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Numbered {
    pub(crate) number: i64,
    pub(crate) identity: i64,
    pub(crate) in_rabbitmq: bool,
}

type Row = (i64, i64, bool);

impl ScheduleStore {
    /// The numbers of `rows`, seen in the DLQ of `queue` (in queue order): a row seen
    /// before keeps its number, a new one gets the next. Keyed by identity.
    pub(crate) async fn number_seen(
        &self,
        queue: &str,
        rows: &[Seen],
        now: DateTime<Utc>,
    ) -> Result<HashMap<i64, Numbered>> {
        if rows.is_empty() {
            return Ok(HashMap::new());
        }
        let failed = failed(
            "cannot number the dead letters of a RabbitMQ queue in the schedule store (a store of an older \
             Courier: run its migrate())",
        );
        let identities: Vec<i64> = rows.iter().map(|r| r.identity).collect();
        let found: Vec<Row> = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                let col = |f: fn(&Seen) -> Option<String>| rows.iter().map(f).collect::<Vec<_>>();
                let message_id: Vec<String> = rows.iter().map(|r| r.message_id.clone()).collect();
                let count: Vec<i32> = rows
                    .iter()
                    .map(|r| i32::try_from(r.delivery_count).unwrap_or(i32::MAX))
                    .collect();
                let enqueued: Vec<DateTime<Utc>> = rows.iter().map(|r| r.enqueued_at).collect();
                let size: Vec<i32> = rows.iter().map(|r| i32::try_from(r.size).unwrap_or(i32::MAX)).collect();
                // New rows in queue order (the first copy of an identity), then every row
                // of these identities that was there before (the snapshot of the final
                // SELECT does not see the insert).
                sqlx::query_as(
                    "WITH u AS (SELECT * FROM unnest($3::bigint[], $4::text[], $5::text[], $6::text[], \
                     $7::text[], $8::text[], $9::int[], $10::timestamptz[], $11::int[]) \
                     WITH ORDINALITY AS u(i, m, t, r, d, e, c, q, s, n)), \
                     f AS (SELECT DISTINCT ON (i) * FROM u ORDER BY i, n), \
                     ins AS (INSERT INTO courier.amqp_dead_letter (queue, identity, parked_at, message_id, \
                     message_type, reason, description, error, delivery_count, enqueued_at, size, in_rabbitmq) \
                     SELECT $1, i, $2, m, t, r, d, e, c, q, s, true FROM f ORDER BY n \
                     ON CONFLICT (queue, identity) DO NOTHING RETURNING id, identity, in_rabbitmq) \
                     SELECT id, identity, in_rabbitmq FROM ins UNION ALL \
                     SELECT id, identity, in_rabbitmq FROM courier.amqp_dead_letter \
                     WHERE queue = $1 AND identity = ANY($3)",
                )
                .bind(queue)
                .bind(now)
                .bind(&identities)
                .bind(message_id)
                .bind(col(|r| r.message_type.clone()))
                .bind(col(|r| r.reason.clone()))
                .bind(col(|r| r.description.clone()))
                .bind(col(|r| r.error.clone()))
                .bind(count)
                .bind(enqueued)
                .bind(size)
                .fetch_all(pool)
                .await
                .map_err(&failed)?
            }
            Self::Sqlite(store) => {
                let _turn = store.write_turn().await?;
                let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await.map_err(&failed)?;
                for r in rows {
                    sqlx::query(
                        "INSERT INTO courier_amqp_dead_letter (queue, identity, parked_at, message_id, \
                         message_type, reason, description, error, delivery_count, enqueued_at, size, properties, \
                         body, in_rabbitmq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, x'', x'', 1) \
                         ON CONFLICT (queue, identity) DO NOTHING",
                    )
                    .bind(queue)
                    .bind(r.identity)
                    .bind(millis(now))
                    .bind(&r.message_id)
                    .bind(&r.message_type)
                    .bind(&r.reason)
                    .bind(&r.description)
                    .bind(&r.error)
                    .bind(i64::from(r.delivery_count))
                    .bind(millis(r.enqueued_at))
                    .bind(i64::try_from(r.size).unwrap_or(i64::MAX))
                    .execute(&mut *tx)
                    .await
                    .map_err(&failed)?;
                }
                let found = sqlx::query_as(
                    "SELECT id, identity, in_rabbitmq FROM courier_amqp_dead_letter WHERE queue = ? \
                     AND identity IN (SELECT value FROM json_each(?))",
                )
                .bind(queue)
                .bind(json_ids(&identities))
                .fetch_all(&mut *tx)
                .await
                .map_err(&failed)?;
                tx.commit().await.map_err(&failed)?;
                found
            }
        };
        let mut out: HashMap<i64, Numbered> = found.into_iter().map(|r| (r.1, numbered(r))).collect();
        // Another admin numbering the same dead letters at the same time: its rows were
        // not committed when this statement's snapshot was taken. They are now.
        if identities.iter().any(|i| !out.contains_key(i)) {
            for n in self.numbered_by_identity(queue, &identities).await? {
                out.entry(n.identity).or_insert(n);
            }
        }
        Ok(out)
    }

    async fn numbered_by_identity(&self, queue: &str, identities: &[i64]) -> Result<Vec<Numbered>> {
        let failed = failed("cannot read the numbers of dead letters");
        let rows: Vec<Row> = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => sqlx::query_as(
                "SELECT id, identity, in_rabbitmq FROM courier.amqp_dead_letter \
                 WHERE queue = $1 AND identity = ANY($2)",
            )
            .bind(queue)
            .bind(identities)
            .fetch_all(pool)
            .await
            .map_err(failed)?,
            Self::Sqlite(store) => sqlx::query_as(
                "SELECT id, identity, in_rabbitmq FROM courier_amqp_dead_letter WHERE queue = ? \
                 AND identity IN (SELECT value FROM json_each(?))",
            )
            .bind(queue)
            .bind(json_ids(identities))
            .fetch_all(store.pool())
            .await
            .map_err(failed)?,
        };
        Ok(rows.into_iter().map(numbered).collect())
    }

    /// The rows of `queue` numbered `numbers` (unknown numbers are left out).
    pub(crate) async fn numbered(&self, queue: &str, numbers: &[i64]) -> Result<Vec<Numbered>> {
        let failed = failed("cannot read the numbers of dead letters");
        let rows: Vec<Row> = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => sqlx::query_as(
                "SELECT id, identity, in_rabbitmq FROM courier.amqp_dead_letter \
                 WHERE queue = $1 AND id = ANY($2) ORDER BY id",
            )
            .bind(queue)
            .bind(numbers)
            .fetch_all(pool)
            .await
            .map_err(failed)?,
            Self::Sqlite(store) => sqlx::query_as(
                "SELECT id, identity, in_rabbitmq FROM courier_amqp_dead_letter WHERE queue = ? \
                 AND id IN (SELECT value FROM json_each(?)) ORDER BY id",
            )
            .bind(queue)
            .bind(json_ids(numbers))
            .fetch_all(store.pool())
            .await
            .map_err(failed)?,
        };
        Ok(rows.into_iter().map(numbered).collect())
    }

    /// Forgets the dead letters seen in the DLQ of `queue` before `before` whose numbers
    /// are not in `met`: a reading of the whole DLQ did not meet them, so they left it
    /// another way (another program took them). Returns how many were forgotten.
    pub(crate) async fn forget_unmet(&self, queue: &str, met: &[i64], before: DateTime<Utc>) -> Result<u64> {
        let failed = failed("cannot forget dead letters no longer in their dead-letter queue");
        let done = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => sqlx::query(
                "DELETE FROM courier.amqp_dead_letter WHERE queue = $1 AND in_rabbitmq AND parked_at < $2 \
                 AND NOT (id = ANY($3))",
            )
            .bind(queue)
            .bind(before)
            .bind(met)
            .execute(pool)
            .await
            .map_err(failed)?
            .rows_affected(),
            Self::Sqlite(store) => {
                let _turn = store.write_turn().await?;
                sqlx::query(
                    "DELETE FROM courier_amqp_dead_letter WHERE queue = ? AND in_rabbitmq = 1 AND parked_at < ? \
                     AND id NOT IN (SELECT value FROM json_each(?))",
                )
                .bind(queue)
                .bind(millis(before))
                .bind(json_ids(met))
                .execute(store.pool())
                .await
                .map_err(failed)?
                .rows_affected()
            }
        };
        Ok(done)
    }
}

fn numbered((number, identity, in_rabbitmq): Row) -> Numbered {
    Numbered {
        number,
        identity,
        in_rabbitmq,
    }
}
