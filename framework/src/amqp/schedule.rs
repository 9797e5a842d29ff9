//! Scheduled messages of the RabbitMQ transport, held in a database table until due
//! (RabbitMQ has no scheduled delivery without its unmaintained delayed-message plugin).
//!
//! A due row is published with publisher confirms and deleted in one database
//! transaction: nothing is lost when the process or RabbitMQ restarts, and a process that
//! dies between the confirm and the commit publishes the message again with the same
//! message id (receivers deduplicate). On Postgres, `FOR UPDATE SKIP LOCKED` lets several
//! processes share the work; cancelling waits for a dispatch in progress and then finds
//! nothing (S5.6: cancel and activation are not mutually locked).

use chrono::{DateTime, Utc};

use crate::error::{Error, ErrorKind, Result};
use crate::message::Envelope;
use crate::store::{EndpointSecret, StoredEnvelope, db_error};

use super::wire::{from_millis, millis};

/// Where the RabbitMQ transport keeps scheduled messages until they are due: the tables
/// of a Courier store (run the store's `migrate()` first).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ScheduleStore {
    /// `courier.amqp_scheduled` in Postgres: shared by every process of the application.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    /// `courier_amqp_scheduled` in a SQLite file: for a single process. Its writes take
    /// the store's turn with the endpoint's own writers.
    Sqlite(crate::store::SqliteStore),
}

#[cfg(feature = "postgres")]
impl From<&crate::store::PostgresStore> for ScheduleStore {
    fn from(store: &crate::store::PostgresStore) -> Self {
        Self::Postgres(store.pool().clone())
    }
}

impl From<&crate::store::SqliteStore> for ScheduleStore {
    fn from(store: &crate::store::SqliteStore) -> Self {
        Self::Sqlite(store.clone())
    }
}

/// A scheduled message that came due.
pub(crate) struct Due {
    pub(crate) seq: i64,
    pub(crate) destination: String,
    pub(crate) is_topic: bool,
    pub(crate) envelope: Envelope,
}

/// What a round of publishing did with the due messages it was given.
#[derive(Debug, Default)]
pub(crate) struct Published {
    /// Confirmed by the broker (or never publishable): their rows are deleted.
    pub(crate) done: Vec<i64>,
    /// Their destination was not there (a broker restarting, a queue deleted outside
    /// Courier): their rows are kept and tried again after [`MISSING_RETRY`].
    pub(crate) missing: Vec<i64>,
}

/// How long a scheduled message whose destination was not there waits before it is
/// published again. It is never dropped for it: a broker that restarts answers "no such
/// queue" for a moment (found by `courier-chaos`, docs/reliability.md).
pub(crate) const MISSING_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

/// Publishes due messages; says which the broker confirmed and which found no destination.
pub(crate) trait Publish {
    fn publish(&self, due: Vec<Due>) -> impl std::future::Future<Output = Published> + Send;
}

fn retry_at(now: DateTime<Utc>) -> DateTime<Utc> {
    now + chrono::Duration::from_std(MISSING_RETRY).unwrap_or(chrono::Duration::zero())
}

/// A due row: seq, destination, is_topic, envelope (JSON), body.
type DueRow = (i64, String, bool, String, Vec<u8>);

fn rows_to_due(rows: Vec<DueRow>) -> Result<Vec<Due>> {
    rows.into_iter()
        .map(|(seq, destination, is_topic, json, body)| {
            let mut envelope = StoredEnvelope::join(&json, body)?;
            envelope.scheduled_enqueue_time = None;
            Ok(Due {
                seq,
                destination,
                is_topic,
                envelope,
            })
        })
        .collect()
}

impl ScheduleStore {
    /// Stores `envelope` for `destination`, due at `due_at`; returns its sequence number.
    pub(crate) async fn insert(
        &self,
        destination: &str,
        is_topic: bool,
        due_at: DateTime<Utc>,
        envelope: Envelope,
        now: DateTime<Utc>,
    ) -> Result<i64> {
        let (json, body) = StoredEnvelope::split(envelope)?;
        let failed = |e| db_error("cannot store the scheduled message", e);
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => sqlx::query_scalar(
                "INSERT INTO courier.amqp_scheduled (destination, is_topic, due_at, envelope, body, created_at) \
                 VALUES ($1, $2, $3, $4::jsonb, $5, $6) RETURNING seq",
            )
            .bind(destination)
            .bind(is_topic)
            .bind(due_at)
            .bind(json)
            .bind(body.as_ref())
            .bind(now)
            .fetch_one(pool)
            .await
            .map_err(failed),
            Self::Sqlite(store) => {
                let _turn = store.write_turn().await?;
                sqlx::query_scalar(
                    "INSERT INTO courier_amqp_scheduled (destination, is_topic, due_at, envelope, body, created_at) \
                     VALUES (?, ?, ?, ?, ?, ?) RETURNING seq",
                )
                .bind(destination)
                .bind(is_topic)
                .bind(millis(due_at))
                .bind(json)
                .bind(body.as_ref())
                .bind(millis(now))
                .fetch_one(store.pool())
                .await
                .map_err(failed)
            }
        }
    }

    /// Deletes a scheduled message of `destination`; `false` if there was none.
    pub(crate) async fn cancel(&self, destination: &str, seq: i64) -> Result<bool> {
        let failed = |e| db_error("cannot cancel the scheduled message", e);
        let deleted = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                sqlx::query("DELETE FROM courier.amqp_scheduled WHERE seq = $1 AND destination = $2")
                    .bind(seq)
                    .bind(destination)
                    .execute(pool)
                    .await
                    .map_err(failed)?
                    .rows_affected()
            }
            Self::Sqlite(store) => {
                // Not while its message may be being published (S5.6 lets the cancel lose).
                let _round = store.schedule_round().await;
                let _turn = store.write_turn().await?;
                sqlx::query("DELETE FROM courier_amqp_scheduled WHERE seq = ? AND destination = ?")
                    .bind(seq)
                    .bind(destination)
                    .execute(store.pool())
                    .await
                    .map_err(failed)?
                    .rows_affected()
            }
        };
        Ok(deleted > 0)
    }

    /// Deletes every scheduled message of a deleted queue or topic.
    pub(crate) async fn delete_for(&self, destination: &str) -> Result<()> {
        let failed = |e| db_error("cannot delete scheduled messages", e);
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => sqlx::query("DELETE FROM courier.amqp_scheduled WHERE destination = $1")
                .bind(destination)
                .execute(pool)
                .await
                .map(|_| ())
                .map_err(failed)?,
            Self::Sqlite(store) => {
                let _turn = store.write_turn().await?;
                sqlx::query("DELETE FROM courier_amqp_scheduled WHERE destination = ?")
                    .bind(destination)
                    .execute(store.pool())
                    .await
                    .map(|_| ())
                    .map_err(failed)?;
            }
        }
        Ok(())
    }

    /// The secret kept for `queue` in the store's table of endpoint secrets
    /// (`courier.endpoint_secret`, `courier_endpoint_secret`), made now if it has none: the
    /// key of the seal on the queue's dead letters (`seal.rs`). A queue and the endpoint of
    /// the same name share the row; each seal has a domain of its own.
    pub(crate) async fn secret(&self, queue: &str, now: DateTime<Utc>) -> Result<EndpointSecret> {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                let mut conn = pool
                    .acquire()
                    .await
                    .map_err(|e| db_error("cannot connect to read a queue's secret", e))?;
                crate::store::postgres::endpoint_secret(&mut conn, queue, now).await
            }
            Self::Sqlite(store) => crate::Store::endpoint_secret(store, queue, now).await?.ok_or_else(|| {
                Error::new(ErrorKind::Corrupt {
                    detail: "the SQLite store keeps no endpoint secrets".into(),
                })
            }),
        }
    }

    /// The secret kept for `queue`, if it has one: read only (an admin that reads a
    /// dead-letter queue makes nothing).
    pub(crate) async fn find_secret(&self, queue: &str) -> Result<Option<EndpointSecret>> {
        let failed = |e| {
            db_error(
                "cannot read a queue's secret (were Courier's migrations applied? Store::migrate)",
                e,
            )
        };
        let stored: Option<Vec<u8>> = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                sqlx::query_scalar("SELECT secret FROM courier.endpoint_secret WHERE endpoint = $1")
                    .bind(queue)
                    .fetch_optional(pool)
                    .await
                    .map_err(failed)?
            }
            Self::Sqlite(store) => sqlx::query_scalar("SELECT secret FROM courier_endpoint_secret WHERE endpoint = ?1")
                .bind(queue)
                .fetch_optional(store.pool())
                .await
                .map_err(failed)?,
        };
        stored
            .map(|bytes| EndpointSecret::stored(&bytes, "the table of endpoint secrets", queue))
            .transpose()
    }

    /// How many messages wait for `destination`.
    pub(crate) async fn count(&self, destination: &str) -> Result<u64> {
        let failed = |e| db_error("cannot count scheduled messages", e);
        let n: i64 = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                sqlx::query_scalar("SELECT count(*) FROM courier.amqp_scheduled WHERE destination = $1")
                    .bind(destination)
                    .fetch_one(pool)
                    .await
                    .map_err(failed)?
            }
            Self::Sqlite(store) => {
                sqlx::query_scalar("SELECT count(*) FROM courier_amqp_scheduled WHERE destination = ?")
                    .bind(destination)
                    .fetch_one(store.pool())
                    .await
                    .map_err(failed)?
            }
        };
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// When the earliest scheduled message is due.
    pub(crate) async fn next_due(&self) -> Result<Option<DateTime<Utc>>> {
        let failed = |e| db_error("cannot read the next due time", e);
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => sqlx::query_scalar("SELECT min(due_at) FROM courier.amqp_scheduled")
                .fetch_one(pool)
                .await
                .map_err(failed),
            Self::Sqlite(store) => {
                let ms: Option<i64> = sqlx::query_scalar("SELECT min(due_at) FROM courier_amqp_scheduled")
                    .fetch_one(store.pool())
                    .await
                    .map_err(failed)?;
                Ok(ms.and_then(from_millis))
            }
        }
    }

    /// Publishes up to `limit` messages due at `now` through `publisher` and deletes those
    /// it confirmed, in one transaction. Returns how many rows were due.
    pub(crate) async fn dispatch_due(&self, now: DateTime<Utc>, limit: i64, publisher: &impl Publish) -> Result<usize> {
        let failed = |e| db_error("cannot dispatch scheduled messages", e);
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                let mut tx = pool.begin().await.map_err(failed)?;
                let rows: Vec<DueRow> = sqlx::query_as(
                    "SELECT seq, destination, is_topic, envelope::text, body FROM courier.amqp_scheduled \
                     WHERE due_at <= $1 ORDER BY due_at, seq LIMIT $2 FOR UPDATE SKIP LOCKED",
                )
                .bind(now)
                .bind(limit)
                .fetch_all(&mut *tx)
                .await
                .map_err(failed)?;
                let n = rows.len();
                if n == 0 {
                    return Ok(0);
                }
                let published = publisher.publish(rows_to_due(rows)?).await;
                sqlx::query("DELETE FROM courier.amqp_scheduled WHERE seq = ANY($1)")
                    .bind(&published.done)
                    .execute(&mut *tx)
                    .await
                    .map_err(failed)?;
                if !published.missing.is_empty() {
                    sqlx::query("UPDATE courier.amqp_scheduled SET due_at = $2 WHERE seq = ANY($1)")
                        .bind(&published.missing)
                        .bind(retry_at(now))
                        .execute(&mut *tx)
                        .await
                        .map_err(failed)?;
                }
                tx.commit().await.map_err(failed)?;
                Ok(n)
            }
            Self::Sqlite(store) => {
                // One process owns a SQLite schedule store, so nothing else publishes its
                // rows: read them, publish without holding the write lock (a broker that
                // does not answer must not stop the endpoint's writers), then delete what
                // was confirmed in one short write. Cancels wait for the round's end.
                let _round = store.schedule_round().await;
                let rows: Vec<DueRow> = sqlx::query_as(
                    "SELECT seq, destination, is_topic, envelope, body FROM courier_amqp_scheduled \
                     WHERE due_at <= ? ORDER BY due_at, seq LIMIT ?",
                )
                .bind(millis(now))
                .bind(limit)
                .fetch_all(store.pool())
                .await
                .map_err(failed)?;
                let n = rows.len();
                if n == 0 {
                    return Ok(0);
                }
                let published = publisher.publish(rows_to_due(rows)?).await;
                let _turn = store.write_turn().await?;
                let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await.map_err(failed)?;
                for seq in published.done {
                    sqlx::query("DELETE FROM courier_amqp_scheduled WHERE seq = ?")
                        .bind(seq)
                        .execute(&mut *tx)
                        .await
                        .map_err(failed)?;
                }
                for seq in published.missing {
                    sqlx::query("UPDATE courier_amqp_scheduled SET due_at = ? WHERE seq = ?")
                        .bind(millis(retry_at(now)))
                        .bind(seq)
                        .execute(&mut *tx)
                        .await
                        .map_err(failed)?;
                }
                tx.commit().await.map_err(failed)?;
                Ok(n)
            }
        }
    }
}

/// The error for a transport with no schedule store.
pub(crate) fn no_store(capability: &'static str) -> Error {
    Error::new(ErrorKind::Unsupported {
        transport: "amqp",
        capability,
        rule: "S5.1",
        reason: "RabbitMQ holds no scheduled messages: give the transport a database with AmqpBuilder::schedules",
    })
}
