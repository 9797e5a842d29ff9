//! The entities the transport declared, recorded in its schedule store's database
//! (`courier.amqp_entity` / `courier_amqp_entity`): AMQP 0-9-1 cannot list a broker's
//! queues, and the management plugin is often off, so the operations API lists these.
//! A declaration is recorded after RabbitMQ accepted it, a deletion removes the row; a
//! failed write is logged and does not fail the declaration (the queue works, it is only
//! missing from `courier queues` until the next declaration).

use chrono::{DateTime, Utc};

use super::conn::Declaration;
use super::schedule::ScheduleStore;
use super::wire::{millis, subscription_queue};
use crate::error::Result;
use crate::store::db_error;

/// A recorded entity: its RabbitMQ name, kind (0 queue, 1 topic, 2 subscription, 3
/// session queue, whose RabbitMQ queues are its partitions: `queue` is its own name) and
/// Courier name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recorded {
    pub(crate) queue: String,
    pub(crate) kind: i16,
    pub(crate) name: String,
}

/// The recorded kind of a session queue.
pub(crate) const KIND_SESSION_QUEUE: i16 = 3;

impl Recorded {
    pub(crate) fn of(d: &Declaration) -> Self {
        match d {
            Declaration::Queue { name, options } => Self {
                queue: name.clone(),
                kind: if options.requires_session {
                    KIND_SESSION_QUEUE
                } else {
                    0
                },
                name: name.clone(),
            },
            Declaration::Topic { name } => Self {
                queue: name.clone(),
                kind: 1,
                name: name.clone(),
            },
            Declaration::Subscription { topic, name, .. } => Self {
                queue: subscription_queue(topic, name),
                kind: 2,
                name: format!("{topic}/subscriptions/{name}"),
            },
        }
    }
}

impl ScheduleStore {
    /// Records a declaration (again: the time is updated).
    pub(crate) async fn record(&self, d: &Declaration, now: DateTime<Utc>) -> Result<()> {
        let r = Recorded::of(d);
        let failed = |e| db_error("cannot record a declared entity", e);
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => sqlx::query(
                "INSERT INTO courier.amqp_entity (queue, kind, name, declared_at) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (queue) DO UPDATE SET kind = EXCLUDED.kind, name = EXCLUDED.name, \
                 declared_at = EXCLUDED.declared_at",
            )
            .bind(&r.queue)
            .bind(r.kind)
            .bind(&r.name)
            .bind(now)
            .execute(pool)
            .await
            .map(drop)
            .map_err(failed),
            Self::Sqlite(store) => {
                let _turn = store.write_turn().await?;
                sqlx::query(
                    "INSERT INTO courier_amqp_entity (queue, kind, name, declared_at) VALUES (?, ?, ?, ?) \
                     ON CONFLICT (queue) DO UPDATE SET kind = excluded.kind, name = excluded.name, \
                     declared_at = excluded.declared_at",
                )
                .bind(&r.queue)
                .bind(r.kind)
                .bind(&r.name)
                .bind(millis(now))
                .execute(store.pool())
                .await
                .map(drop)
                .map_err(failed)
            }
        }
    }

    /// Removes the record of a deleted queue, subscription queue or topic.
    pub(crate) async fn unrecord(&self, queue: &str) -> Result<()> {
        self.delete_rows_of(
            queue,
            "DELETE FROM courier.amqp_entity WHERE queue = $1",
            "DELETE FROM courier_amqp_entity WHERE queue = ?",
            "cannot remove the record of a deleted entity",
        )
        .await
    }

    /// The kind recorded for the RabbitMQ queue or exchange `name` (0 queue, 1 topic, 2
    /// subscription, 3 session queue), if any.
    pub(crate) async fn recorded_kind(&self, name: &str) -> Result<Option<i16>> {
        let failed = |e| db_error("cannot read a declared entity", e);
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => sqlx::query_scalar("SELECT kind FROM courier.amqp_entity WHERE queue = $1")
                .bind(name)
                .fetch_optional(pool)
                .await
                .map_err(failed),
            Self::Sqlite(store) => sqlx::query_scalar("SELECT kind FROM courier_amqp_entity WHERE queue = ?")
                .bind(name)
                .fetch_optional(store.pool())
                .await
                .map_err(failed),
        }
    }

    /// Every recorded entity, by Courier name.
    pub(crate) async fn recorded(&self) -> Result<Vec<Recorded>> {
        let failed = |e| db_error("cannot list the declared entities", e);
        let rows: Vec<(String, i16, String)> = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => sqlx::query_as("SELECT queue, kind, name FROM courier.amqp_entity ORDER BY name")
                .fetch_all(pool)
                .await
                .map_err(failed)?,
            Self::Sqlite(store) => sqlx::query_as("SELECT queue, kind, name FROM courier_amqp_entity ORDER BY name")
                .fetch_all(store.pool())
                .await
                .map_err(failed)?,
        };
        Ok(rows
            .into_iter()
            .map(|(queue, kind, name)| Recorded { queue, kind, name })
            .collect())
    }
}
