//! Sagas, timeouts and the outbox of the Postgres store (schema `courier`); the queues
//! of the Postgres transport in the same database are in `pg_queues.rs`.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{PgConnection, Row};

use super::{
    AdminError, AdminResult, CompletedSaga, OutboxEntry, PendingTimeout, SagaFilter, SagaInstance, SagaSummary,
    SagaTypeSummary, StoreAdmin, TimeoutFilter, TimeoutState, check_reason, log_completed, page_size, redact_url,
};
use crate::clock::{Clock, SystemClock};

/// The sagas, timeouts and outbox of a [`PostgresStore`](crate::PostgresStore)'s database
/// ([`StoreAdmin`]), and the queues and dead letters of the
/// [`PostgresTransport`](crate::PostgresTransport) when the database holds it
/// ([`QueueAdmin`](super::QueueAdmin): the transport's tables are in every migrated
/// database, empty when the transport never ran there).
#[derive(Debug, Clone)]
pub struct PostgresAdmin {
    pub(super) pool: PgPool,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) name: String,
}

pub(super) fn col<'r, T>(row: &'r PgRow, i: usize) -> AdminResult<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(i)
        .map_err(|e| AdminError::db("cannot read a row of Courier's tables", e))
}

pub(super) fn count(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

const PENDING: &str =
    "(SELECT COUNT(*) FROM courier.saga_timeout t WHERE t.saga_type = s.saga_type AND t.correlation = s.correlation)";

const TIMEOUT_COLUMNS: &str = "SELECT id, endpoint, saga_type, correlation, timeout_key, envelope->>'message_type', \
     due_at, dispatched_at, dead_lettered_at, dead_letter_reason FROM courier.saga_timeout";

fn summary(r: &PgRow) -> AdminResult<SagaSummary> {
    Ok(SagaSummary {
        saga_type: col(r, 0)?,
        correlation: col(r, 1)?,
        version: col(r, 2)?,
        created_at: col(r, 3)?,
        updated_at: col(r, 4)?,
        pending_timeouts: count(col(r, 5)?),
    })
}

fn timeout(r: &PgRow) -> AdminResult<PendingTimeout> {
    let dispatched_at: Option<DateTime<Utc>> = col(r, 7)?;
    let dead: Option<DateTime<Utc>> = col(r, 8)?;
    Ok(PendingTimeout {
        id: col(r, 0)?,
        endpoint: col(r, 1)?,
        saga_type: col(r, 2)?,
        correlation: col(r, 3)?,
        key: col(r, 4)?,
        message_type: col(r, 5)?,
        due_at: col(r, 6)?,
        dispatched_at,
        state: match (dead, dispatched_at) {
            (Some(_), _) => TimeoutState::DeadLettered,
            (None, Some(_)) => TimeoutState::Dispatched,
            (None, None) => TimeoutState::Waiting,
        },
        dead_letter_reason: col(r, 9)?,
    })
}

fn outbox_entry(r: &PgRow, dead: bool) -> AdminResult<OutboxEntry> {
    Ok(OutboxEntry {
        id: col(r, 0)?,
        endpoint: col(r, 1)?,
        source_id: col(r, 2)?,
        destination: col(r, 3)?,
        is_topic: col(r, 4)?,
        message_id: col(r, 5)?,
        message_type: col(r, 6)?,
        created_at: col(r, 7)?,
        dead_letter_reason: if dead { col(r, 8)? } else { None },
        dead_letter_description: if dead { col(r, 9)? } else { None },
    })
}

/// Deletes an instance with its timeouts and properties, in the caller's transaction.
async fn complete(conn: &mut PgConnection, saga_type: &str, correlation: &str) -> AdminResult<CompletedSaga> {
    let version: i64 =
        sqlx::query_scalar("DELETE FROM courier.saga WHERE saga_type = $1 AND correlation = $2 RETURNING version")
            .bind(saga_type)
            .bind(correlation)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| AdminError::db("cannot delete a saga instance", e))?
            .ok_or_else(|| AdminError::not_found(format!("saga {saga_type} instance {correlation:?}")))?;
    let timeouts = sqlx::query("DELETE FROM courier.saga_timeout WHERE saga_type = $1 AND correlation = $2")
        .bind(saga_type)
        .bind(correlation)
        .execute(&mut *conn)
        .await
        .map_err(|e| AdminError::db("cannot delete a saga instance's timeouts", e))?
        .rows_affected();
    sqlx::query("DELETE FROM courier.saga_property WHERE saga_type = $1 AND correlation = $2")
        .bind(saga_type)
        .bind(correlation)
        .execute(&mut *conn)
        .await
        .map_err(|e| AdminError::db("cannot delete a saga instance's properties", e))?;
    Ok(CompletedSaga {
        version,
        timeouts_removed: timeouts,
    })
}

impl PostgresAdmin {
    /// An admin over the store's pool (the application's, or
    /// [`PostgresStore::pool`](crate::PostgresStore::pool)); times from the system clock.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            clock: Arc::new(SystemClock),
            name: "postgres store".into(),
        }
    }

    /// Connects to the database at `url` with a small pool (two connections).
    ///
    /// # Errors
    /// [`AdminError::Unavailable`] if the server cannot be reached or refuses; the
    /// message names the address without its password.
    pub async fn connect(url: &str) -> AdminResult<Self> {
        let shown = redact_url(url);
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .connect(url)
            .await
            .map_err(|e| {
                AdminError::unavailable(shown.clone(), crate::store::db_error("cannot connect to Postgres", e))
            })?;
        Ok(Self {
            pool,
            clock: Arc::new(SystemClock),
            name: format!("postgres store {shown}"),
        })
    }

    /// Measures ages and overdue timeouts with this clock (the endpoints' clock).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
}

#[async_trait]
impl StoreAdmin for PostgresAdmin {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    async fn saga_types(&self) -> AdminResult<Vec<SagaTypeSummary>> {
        let rows = sqlx::query(
            "SELECT saga_type, COUNT(*)::bigint, MIN(updated_at) FROM courier.saga GROUP BY saga_type \
             ORDER BY saga_type",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(|e| AdminError::db("cannot list the saga types", e))?;
        rows.iter()
            .map(|r| {
                Ok(SagaTypeSummary {
                    saga_type: col(r, 0)?,
                    instances: count(col(r, 1)?),
                    oldest_updated_at: col(r, 2)?,
                })
            })
            .collect()
    }

    async fn sagas(&self, saga_type: &str, filter: &SagaFilter) -> AdminResult<Vec<SagaSummary>> {
        let sql = format!(
            "SELECT s.saga_type, s.correlation, s.version, s.created_at, s.updated_at, {PENDING} AS pending \
             FROM courier.saga s WHERE s.saga_type = $1 \
             AND ($2::text IS NULL OR strpos(s.correlation, $2) > 0) \
             AND ($3::timestamptz IS NULL OR s.updated_at < $3) \
             AND ($4::bool IS NULL OR $4 = ({PENDING} > 0)) \
             ORDER BY s.updated_at, s.correlation LIMIT $5"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(saga_type)
            .bind(filter.correlation.as_deref())
            .bind(filter.updated_before)
            .bind(filter.has_pending_timeout)
            .bind(page_size(filter.limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| AdminError::db("cannot list saga instances", e))?;
        rows.iter().map(summary).collect()
    }

    async fn saga(&self, saga_type: &str, correlation: &str) -> AdminResult<SagaInstance> {
        let sql = format!(
            "SELECT s.saga_type, s.correlation, s.version, s.created_at, s.updated_at, {PENDING}, \
             s.state_version, s.state FROM courier.saga s WHERE s.saga_type = $1 AND s.correlation = $2"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(saga_type)
            .bind(correlation)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| AdminError::db("cannot read a saga instance", e))?
            .ok_or_else(|| AdminError::not_found(format!("saga {saga_type} instance {correlation:?}")))?;
        let sql = format!("{TIMEOUT_COLUMNS} WHERE saga_type = $1 AND correlation = $2 ORDER BY due_at, id");
        let timeouts = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(saga_type)
            .bind(correlation)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| AdminError::db("cannot list a saga instance's timeouts", e))?;
        Ok(SagaInstance {
            summary: summary(&row)?,
            state_version: col(&row, 6)?,
            state: col(&row, 7)?,
            timeouts: timeouts.iter().map(timeout).collect::<AdminResult<_>>()?,
        })
    }

    async fn complete_saga(&self, saga_type: &str, correlation: &str, reason: &str) -> AdminResult<CompletedSaga> {
        check_reason(reason)?;
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| AdminError::db("cannot begin completing a saga instance", e))?;
        // Dropped without a commit on an error: rolled back.
        let done = complete(&mut tx, saga_type, correlation).await?;
        tx.commit()
            .await
            .map_err(|e| AdminError::db("cannot commit completing a saga instance", e))?;
        log_completed(&self.name, saga_type, correlation, &done, reason);
        Ok(done)
    }

    async fn timeouts(&self, filter: &TimeoutFilter) -> AdminResult<Vec<PendingTimeout>> {
        let now = self.clock.now();
        let sql = format!(
            "{TIMEOUT_COLUMNS} WHERE NOT $1 OR (dead_lettered_at IS NULL AND due_at <= $2 AND \
             (dispatched_at IS NULL OR (due_at <= $3 AND dispatched_at <= $3))) ORDER BY due_at, id LIMIT $4"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(filter.overdue_only)
            .bind(now)
            .bind(now - filter.grace)
            .bind(page_size(filter.limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| AdminError::db("cannot list timeouts", e))?;
        rows.iter().map(timeout).collect()
    }

    async fn outbox(&self, limit: u32) -> AdminResult<Vec<OutboxEntry>> {
        let rows = sqlx::query(
            "SELECT id, endpoint, source_id, destination, is_topic, envelope->>'message_id', \
             envelope->>'message_type', created_at FROM courier.outbox ORDER BY id LIMIT $1",
        )
        .bind(page_size(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| AdminError::db("cannot list the outbox", e))?;
        rows.iter().map(|r| outbox_entry(r, false)).collect()
    }

    async fn outbox_dead_letters(&self, limit: u32) -> AdminResult<Vec<OutboxEntry>> {
        let rows = sqlx::query(
            "SELECT id, endpoint, source_id, destination, is_topic, envelope->>'message_id', \
             envelope->>'message_type', created_at, reason, description FROM courier.outbox_dead_letters \
             ORDER BY id LIMIT $1",
        )
        .bind(page_size(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| AdminError::db("cannot list the outbox's dead letters", e))?;
        rows.iter().map(|r| outbox_entry(r, true)).collect()
    }
}

/// The RabbitMQ transport's schedule store in this database (`courier.amqp_scheduled`, and
/// the entities it recorded): for [`AmqpAdmin::connect`](crate::admin::AmqpAdmin::connect).
#[cfg(feature = "amqp")]
impl From<&PostgresAdmin> for crate::ScheduleStore {
    fn from(admin: &PostgresAdmin) -> Self {
        crate::ScheduleStore::Postgres(admin.pool.clone())
    }
}
